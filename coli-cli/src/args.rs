//! The command-line arguments of each subcommand (clap derive).

use std::path::PathBuf;

use clap::Args;
use coli_models::experts::Prefetch;
use coli_plan::tier::PlacementFlags;

#[derive(Args)]
pub(crate) struct PlanArgs {
    /// Model directory. Default: $COLI_MODEL, else the demo model.
    #[arg(long, env = "COLI_MODEL")]
    pub(crate) model: Option<PathBuf>,
    /// RAM budget in GB (default: available memory).
    #[arg(long)]
    pub(crate) ram: Option<f64>,
    /// Context length to budget the KV cache for.
    #[arg(long, default_value_t = 4096)]
    pub(crate) ctx: usize,
    /// Concurrent sequences (one KV cache each).
    #[arg(long, default_value_t = 1)]
    pub(crate) kv_slots: usize,
    /// Measure memory and disk bandwidth again instead of using the cached probe.
    #[arg(long)]
    pub(crate) reprobe: bool,
    /// Print the plan as JSON (schema version 2; see README).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct TuneArgs {
    /// Model directory. Default: $COLI_MODEL, else the demo model.
    #[arg(long, env = "COLI_MODEL")]
    pub(crate) model: Option<PathBuf>,
    /// Calibration prompt ids (default: 16 fixed ids).
    #[arg(long, value_delimiter = ',')]
    pub(crate) prompt_ids: Option<Vec<u32>>,
    /// Decode tokens per trial.
    #[arg(long, default_value_t = 16)]
    pub(crate) tokens: usize,
    /// Interleaved rounds (each candidate's best counts).
    #[arg(long, default_value_t = 2)]
    pub(crate) runs: usize,
    /// Minimum gain over the baseline to adopt a candidate (0.05 = 5%).
    #[arg(long, default_value_t = 0.05)]
    pub(crate) min_gain: f64,
    /// Cached experts per layer during the trials (default: what `coli plan` gives).
    #[arg(long)]
    pub(crate) cap: Option<usize>,
    /// Print the trials and the profile as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct DoctorArgs {
    /// Model directory. Default: $COLI_MODEL, else the demo model.
    #[arg(long, env = "COLI_MODEL")]
    pub(crate) model: Option<PathBuf>,
    /// Also validate every header, the shard numbering, the index against the headers and
    /// the family's required tensors.
    #[arg(long)]
    pub(crate) deep: bool,
    /// RAM budget in GB (default: available memory).
    #[arg(long)]
    pub(crate) ram: Option<f64>,
    /// Print the checks as JSON (`{"version": 1, "status", "checks": [{id, status, summary}]}`).
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct ConvertArgs {
    /// Source model directory.
    #[arg(long)]
    pub(crate) model: PathBuf,
    /// Output directory (must not exist).
    #[arg(long)]
    pub(crate) out: PathBuf,
    /// Precision of the routed experts.
    #[arg(long, value_name = "int4|int8|bf16", default_value = "int8")]
    pub(crate) experts: String,
    /// Precision of the dense matrices.
    #[arg(long, value_name = "bf16|int8", default_value = "bf16")]
    pub(crate) dense: String,
    /// Shard size in GB.
    #[arg(long, default_value_t = 4.0)]
    pub(crate) shard_gb: f64,
}

#[derive(Args)]
pub(crate) struct ModelArg {
    /// Model directory (Hugging Face layout). Default: $COLI_MODEL, else the demo model.
    #[arg(long, env = "COLI_MODEL")]
    pub(crate) model: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// RAM for routed experts, in GB over all layers; "all" keeps every expert cached,
    /// "off" copies every expert into RAM at load (no streaming). Default: what the
    /// available RAM allows.
    #[arg(long, value_name = "GB|all|off")]
    pub(crate) expert_cache: Option<String>,
    /// Cached experts per MoE layer (instead of --expert-cache).
    #[arg(long, conflicts_with = "expert_cache")]
    pub(crate) cap: Option<usize>,
    /// Read experts with O_DIRECT (bypass the page cache). Default: on when the automatic
    /// expert cache cannot hold every expert (RAM is short), off otherwise.
    #[arg(long)]
    pub(crate) direct: bool,
    /// Expert reads ahead of use: "on" (default) reads a layer's missing experts in parallel
    /// and guesses the next layer's while this one computes; "layer" only the former; "off"
    /// reads each expert when it is needed.
    #[arg(long, value_name = "on|layer|off")]
    pub(crate) prefetch: Option<Prefetch>,
    /// Apply `coli plan`'s cache size and the saved `coli tune` profile for this machine,
    /// model and engine; flags given explicitly win.
    #[arg(long)]
    pub(crate) auto_tier: bool,
    /// Pin this many GB of the historically hottest experts (from .coli_usage) at start.
    #[arg(long, value_name = "GB", default_value_t = 0.0)]
    pub(crate) pin: f64,
    /// Do not add this run's routing to the model directory's .coli_usage
    /// (also: COLI_NO_USAGE=1).
    #[arg(long, env = "COLI_NO_USAGE", value_parser = clap::builder::FalseyValueParser::new())]
    pub(crate) no_usage: bool,
    /// Fast mode, never the default and not token-exact: int8 activations against int8
    /// and int4 weights, multiplied in integers (AVX-512 VNNI, or AVX2) as llama.cpp's
    /// Q8_0 path does. `cargo xtask fast-int8` prints its teacher-forced agreement with
    /// transformers. With AVX2 alone it speeds decode but slows long prompts' prefill.
    #[arg(long)]
    pub(crate) fast_int8: bool,
}

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) m: ModelArg,
    /// Prompt text.
    #[arg(long, conflicts_with = "prompt_ids")]
    pub(crate) prompt: Option<String>,
    /// Prompt as comma-separated token ids (needs no tokenizer).
    #[arg(long, value_delimiter = ',')]
    pub(crate) prompt_ids: Option<Vec<u32>>,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub(crate) chat: bool,
    /// Maximum new tokens.
    #[arg(long, default_value_t = 64)]
    pub(crate) max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) top_p: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub(crate) top_k: usize,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    pub(crate) json: bool,
    /// Keep generating past end-of-sequence tokens (for benchmarks).
    #[arg(long)]
    pub(crate) ignore_eos: bool,
    /// Constrain the output to a GBNF grammar (llama.cpp dialect) read from this file.
    #[arg(long, value_name = "FILE.gbnf", conflicts_with = "json_schema")]
    pub(crate) grammar: Option<PathBuf>,
    /// Constrain the output to JSON valid against this JSON Schema file.
    #[arg(long, value_name = "FILE")]
    pub(crate) json_schema: Option<PathBuf>,
    /// Under a grammar, sample grammar-forced tokens one at a time instead of drafting
    /// them in one batched forward (same output, slower).
    #[arg(long)]
    pub(crate) no_drafts: bool,
    #[command(flatten)]
    pub(crate) drafts: DraftOpts,
}

/// `--draft` and `--mtp-depth` (of `coli run` and `coli serve`).
#[derive(Args)]
pub(crate) struct DraftOpts {
    /// Drafted tokens, verified in one batched forward (the output is the same either
    /// way): "auto" (default) drafts what the model and request offer — grammar-forced
    /// tokens, then prompt lookup (n-gram matches in the prompt and the text so far), then
    /// the checkpoint's MTP layer (DeepSeek-V3, Kimi-K2, GLM-4.5+) unless the experts are
    /// streamed; "lookup" and "mtp" only that one (and grammar-forced tokens; "mtp" also
    /// when streaming); "off" none.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) draft: DraftArg,
    /// Tokens the MTP layer drafts at a time (the layer run again on its own output for
    /// the second and later ones).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    pub(crate) mtp_depth: u64,
}

impl DraftOpts {
    /// Whether prompt lookup drafts.
    pub(crate) fn lookup(&self) -> bool {
        matches!(self.draft, DraftArg::Auto | DraftArg::Lookup)
    }

    /// When the MTP layer drafts.
    pub(crate) fn mtp(&self) -> coli_models::MtpDrafting {
        match self.draft {
            DraftArg::Auto => coli_models::MtpDrafting::Auto,
            DraftArg::Mtp => coli_models::MtpDrafting::On,
            DraftArg::Lookup | DraftArg::Off => coli_models::MtpDrafting::Off,
        }
    }

    /// The note for `--draft mtp` on a model without an MTP layer.
    pub(crate) fn note_without_mtp(&self, engine: &coli_models::Engine) {
        if self.draft == DraftArg::Mtp && engine.model().mtp.is_none() {
            eprintln!(
                "coli: note: this checkpoint has no usable multi-token-prediction layer: --draft mtp drafts nothing"
            );
        }
    }
}

/// `--draft`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DraftArg {
    /// Whatever the model and request offer.
    Auto,
    /// Prompt lookup (and grammar-forced tokens).
    Lookup,
    /// The checkpoint's MTP layer (and grammar-forced tokens).
    Mtp,
    /// No drafts.
    Off,
}

#[derive(Args)]
pub(crate) struct EvalArgs {
    #[command(flatten)]
    pub(crate) m: ModelArg,
    /// Token ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub(crate) ids: Vec<u32>,
    /// Write the logits (little-endian f32, positions x vocab) here.
    #[arg(long)]
    pub(crate) logits_out: Option<PathBuf>,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Args)]
pub(crate) struct InfoArgs {
    /// Model directory to describe.
    #[arg(long)]
    pub(crate) model: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct ImportArgs {
    /// The GGUF file.
    #[arg(long)]
    pub(crate) gguf: PathBuf,
    /// Output directory (must not exist).
    #[arg(long)]
    pub(crate) out: PathBuf,
}

impl ModelArg {
    /// The placement flags as the tiering code takes them.
    pub(crate) fn placement_flags(&self) -> PlacementFlags {
        PlacementFlags {
            cap: self.cap,
            expert_cache: self.expert_cache.clone(),
            direct: self.direct,
            prefetch: self.prefetch,
            auto_tier: self.auto_tier,
            pin_gb: self.pin,
        }
    }
}

#[derive(Args)]
pub(crate) struct ServeArgs {
    #[command(flatten)]
    pub(crate) m: ModelArg,
    /// Address to bind. The default serves this machine only.
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// Port (0 picks a free one and prints it).
    #[arg(long, default_value_t = 8080)]
    pub(crate) port: u16,
    /// Sessions over the one loaded model, decoded together in one batched forward.
    #[arg(long, default_value_t = 4)]
    pub(crate) slots: usize,
    /// Requests allowed to wait for a slot (beyond: 429 with Retry-After).
    #[arg(long, default_value_t = 64)]
    pub(crate) queue: usize,
    /// Require `Authorization: Bearer KEY` on every request but /health.
    #[arg(long, env = "COLI_API_KEY", hide_env_values = true)]
    pub(crate) api_key: Option<String>,
    /// Positions per slot, prompt plus answer (default: the model's context, at most 4096).
    #[arg(long)]
    pub(crate) ctx: Option<usize>,
    /// Save each slot's KV cache here on shutdown and restore it on start.
    #[arg(long, value_name = "DIR")]
    pub(crate) kv_dir: Option<PathBuf>,
    /// Also accept requests whose Host header names this host (repeatable).
    #[arg(long, value_name = "HOST")]
    pub(crate) allow_host: Vec<String>,
    /// Largest request body, in MB.
    #[arg(long, default_value_t = 4.0)]
    pub(crate) body_limit_mb: f64,
    /// Send CORS headers allowing this browser origin (`*` for any); off by default.
    #[arg(long, value_name = "ORIGIN")]
    pub(crate) cors_origin: Option<String>,
    #[command(flatten)]
    pub(crate) drafts: DraftOpts,
}

#[derive(Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    pub(crate) m: ModelArg,
    /// A system prompt to start with.
    #[arg(long)]
    pub(crate) system: Option<String>,
    /// Most new tokens per answer.
    #[arg(long, default_value_t = 512)]
    pub(crate) max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    pub(crate) top_p: f32,
    /// RNG seed.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Positions the conversation may hold (default: the model's context, at most 8192).
    #[arg(long)]
    pub(crate) ctx: Option<usize>,
}
