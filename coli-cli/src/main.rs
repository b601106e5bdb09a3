//! `coli`: run Mixture-of-Experts models larger than RAM. A thin layer over the libraries:
//! it parses flags, calls coli-models (generation), coli-plan (placement, plan, doctor,
//! tune) and prints. No model logic lives here.

mod args;
mod chat;
mod manage;
mod run;
mod serve;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::args::*;

#[derive(Parser)]
#[command(
    name = "coli",
    version,
    about = "Run huge Mixture-of-Experts models on ordinary machines, token-exact."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt (streams to stdout).
    Run(RunArgs),
    /// Interactive chat in the terminal (streaming, history, /reset /system /stats /save).
    Chat(ChatArgs),
    /// OpenAI-compatible HTTP server: /v1/chat/completions, /v1/completions, /metrics…
    Serve(ServeArgs),
    /// Teacher-forced forward over a token sequence: per-position argmax and NLL.
    Eval(EvalArgs),
    /// List supported model types, or describe a model.
    Info(InfoArgs),
    /// Convert a Llama-architecture GGUF file into a model directory (bf16 safetensors).
    ImportGguf(ImportArgs),
    /// Will it run here, how fast, with which settings (from headers, config and measured
    /// bandwidths).
    Plan(PlanArgs),
    /// Measure settings (threads, prefetch, O_DIRECT) on a calibration prompt; keep the
    /// fastest whose tokens equal the baseline's if it gains enough; save the profile that
    /// `coli run --auto-tier` applies.
    Tune(TuneArgs),
    /// Read-only readiness checks of a model directory (exit 1 if any check fails).
    Doctor(DoctorArgs),
    /// Write a quantized container: experts int4/int8/bf16, dense bf16/int8, each expert's
    /// matrices adjacent (one read per expert).
    Convert(ConvertArgs),
}

/// What a command returns: its exit code, or an error message (exit 2).
type Outcome = Result<u8, String>;

/// A progress reporter for long work, drawn on stderr when it is a terminal.
pub fn progress_bar(label: &'static str) -> impl FnMut(usize, usize) {
    use std::io::IsTerminal;
    let tty = std::io::stderr().is_terminal();
    move |done, total| {
        if tty {
            eprint!("\r{label}: {done}/{total}");
            if done == total {
                eprintln!();
            }
        } else if done == total {
            eprintln!("{label}: {done}/{total} done");
        }
    }
}

/// Large buffers start on a cache line, where the vector kernels load them fastest.
#[global_allocator]
static ALLOCATOR: coli_kernels::alloc::CacheLineAligned = coli_kernels::alloc::CacheLineAligned;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let model_arg = match &cli.command {
        Command::Run(a) => Some(&a.m),
        Command::Eval(a) => Some(&a.m),
        Command::Chat(a) => Some(&a.m),
        Command::Serve(a) => Some(&a.m),
        _ => None,
    };
    let threads = model_arg.and_then(threads);
    if model_arg.is_some_and(|m| m.fast_int8) {
        if let Err(msg) = fast_int8() {
            eprintln!("coli: error: {msg}");
            return ExitCode::from(2);
        }
    }
    // All work runs on a worker of one pool: its parallel loops then use the workers' own
    // queues and the decode loop allocates nothing per token.
    let result = build_pool(threads).and_then(|pool| {
        pool.install(|| match cli.command {
            Command::Run(a) => run::run(a),
            Command::Eval(a) => run::eval(a),
            Command::Chat(a) => chat::chat(a),
            Command::Serve(a) => serve::serve(a),
            Command::Info(a) => manage::info(a),
            Command::Convert(a) => manage::convert(a),
            Command::Doctor(a) => manage::doctor(a),
            Command::Plan(a) => manage::plan(a),
            Command::Tune(a) => manage::tune(a),
            Command::ImportGguf(a) => manage::import_gguf(a),
        })
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(msg) => {
            eprintln!("coli: error: {msg}");
            ExitCode::from(2)
        }
    }
}

/// `--fast-int8`: switches the kernels' fast mode on for this process, on a CPU that has
/// its instructions.
fn fast_int8() -> Result<(), String> {
    if !coli_kernels::fast::kernels_available() {
        return Err(
            "--fast-int8 needs AVX2 with FMA, or AVX-512 with VNNI (avx512f, avx512bw, avx512vnni), which this CPU lacks; run without it (exact mode)".into(),
        );
    }
    coli_kernels::fast::set_int8_activations(true);
    eprintln!(
        "coli: --fast-int8: int8 activations on int8/int4 weights; output is not token-exact (see `cargo xtask fast-int8`)"
    );
    Ok(())
}

/// `--threads`, else (with `--auto-tier`) the tuned profile's.
fn threads(m: &ModelArg) -> Option<usize> {
    coli_plan::tier::threads(m.threads, m.auto_tier, m.model.as_deref())
}

fn build_pool(threads: Option<usize>) -> Result<rayon::ThreadPool, String> {
    let mut b = rayon::ThreadPoolBuilder::new();
    if let Some(n) = threads {
        if n == 0 {
            return Err("--threads must be at least 1".into());
        }
        b = b.num_threads(n);
    }
    b.build().map_err(|e| e.to_string())
}

/// `--model`, else the demo model (fetched and converted on first use).
fn dir_or_demo(model: Option<PathBuf>) -> Result<PathBuf, String> {
    match model {
        Some(d) => Ok(d),
        None => coli_models::demo::ensure_demo_model(progress_bar("demo model")),
    }
}
