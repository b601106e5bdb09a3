//! `cargo xtask <task>`:
//!
//! * `verify`: the oracle suite and the bit-exactness differentials, in this
//!   process — so running it under another profile (`cargo run --profile
//!   release-lto -p xtask -- verify`) verifies that build's kernels.
//! * `test`: what CI runs — fmt, clippy, the workspace tests (release), the parser crates'
//!   tests in debug, then `verify`.
//! * `fast-int8`: the optional fast mode's teacher-forced agreement with `transformers` on
//!   every oracle fixture, as stored and converted to int8 and int4.

use std::process::{Command, ExitCode};
use std::time::Instant;

use coli_core::RopeScaling;
use coli_kernels::rope::{apply, RopeLayout, RopeTable};
use coli_kernels::{cpu, dot, WFormat};
use coli_tests::{checks, Reference, TINY_FIXTURES};

mod fast_int8;
mod rope_reference;

use fast_int8::fast_int8;

type Check = Result<String, String>;
type NamedCheck = (&'static str, fn() -> Check);

fn main() -> ExitCode {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "verify" => verify(),
        "test" => test(),
        "synth" => synth(&std::env::args().skip(2).collect::<Vec<_>>()),
        "census" => census(&std::env::args().skip(2).collect::<Vec<_>>()),
        "fast-int8" => fast_int8(),
        _ => {
            eprintln!("usage: cargo xtask verify | test | fast-int8 | synth OUT [olmoe|small] [bf16|int8] | synth OUT gpt-oss-20b [LAYERS] | synth OUT qwen3-next [LAYERS] [EXPERTS] | synth OUT deepseek-v3 [LAYERS] [EXPERTS]");
            ExitCode::from(2)
        }
    }
}

/// The header-scan benchmark: a census (default GLM-5: 78 layers x 256 FP8 experts, ~120k
/// tensors, 60 sparse shards holding only headers; or gpt-oss-120b, MiniMax-M2), then
/// analyze_model without the sidecar (full scan) and with it (hit), interleaved, medians.
fn census(args: &[String]) -> ExitCode {
    use coli_tests::census::{write_census, Census};
    let usage =
        "usage: cargo xtask census DIR [ROUNDS] [glm5|gpt-oss-120b|minimax-m2|qwen3-next-80b|qwen3.5-35b|deepseek-v4-flash|deepseek-v4-flash-bf16]";
    let Some(dir) = args.first() else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let rounds: usize = args.get(1).and_then(|r| r.parse().ok()).unwrap_or(7);
    let Some(which) = Census::parse(args.get(2).map_or("glm5", String::as_str)) else {
        eprintln!("{usage}");
        return ExitCode::from(2);
    };
    let dir = std::path::Path::new(dir);
    if !dir.join("config.json").is_file() {
        match write_census(dir, which) {
            Ok(n) => eprintln!(
                "census: {which:?}, {n} tensors in sparse shards at {}",
                dir.display()
            ),
            Err(e) => {
                eprintln!("census: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let sidecar = dir.join(coli_plan::analyze::SIDECAR);
    if std::env::var_os("COLI_CENSUS_PROFILE").is_some() {
        let t = Instant::now();
        let _ = coli_core::shard_files(dir);
        eprintln!(
            "shard_files (index.json): {:.1} ms",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    let (mut cold, mut warm) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let _ = std::fs::remove_file(&sidecar);
        let t = Instant::now();
        let (a, o) = coli_plan::analyze(dir).expect("analysis");
        cold.push(t.elapsed().as_secs_f64() * 1e3);
        assert_ne!(o, coli_plan::CacheOutcome::Hit);
        let t = Instant::now();
        let (b, o) = coli_plan::analyze(dir).expect("analysis");
        warm.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(o, coli_plan::CacheOutcome::Hit);
        assert_eq!(a, b);
        if cold.len() == 1 {
            eprintln!(
                "census: {} tensors, {} shards, {:.1} GB of experts over {} layers",
                a.tensor_count,
                a.shards.len(),
                a.expert_bytes as f64 / 1e9,
                a.expert_layers.len()
            );
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "analyze_model: full scan {:.1} ms, sidecar hit {:.2} ms (medians of {rounds} interleaved rounds; scan runs {:?}, hit runs {:?})",
        median(&mut cold.clone()),
        median(&mut warm.clone()),
        cold.iter().map(|x| (x * 10.0).round() / 10.0).collect::<Vec<_>>(),
        warm.iter().map(|x| (x * 100.0).round() / 100.0).collect::<Vec<_>>(),
    );
    ExitCode::SUCCESS
}

/// `synth OUT gpt-oss-20b [LAYERS]`: gpt-oss-20b's layer geometry, MXFP4 experts.
fn synth_gpt_oss(out: &str, layers: Option<&String>) -> ExitCode {
    use coli_tests::synthetic::{write_gpt_oss, GptOssSpec};
    let layers = match layers.map(|l| l.parse::<usize>()) {
        None => 24,
        Some(Ok(l)) if l > 0 => l,
        Some(_) => {
            eprintln!("gpt-oss-20b takes a positive layer count, got {layers:?}");
            return ExitCode::from(2);
        }
    };
    let path = std::path::Path::new(out);
    if path.exists() {
        eprintln!("{out} exists; refusing to overwrite");
        return ExitCode::from(2);
    }
    let spec = GptOssSpec::gpt_oss_20b(layers);
    let t0 = Instant::now();
    match write_gpt_oss(path, &spec, |d, n| eprint!("\rsynth: layer {d}/{n}")) {
        Ok(()) => {
            eprintln!(
                "\nsynth: {spec:?} -> {out} in {:.1}s",
                t0.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nsynth: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `synth OUT qwen3-next [LAYERS] [EXPERTS]`: Qwen3-Next-80B's layer geometry with fewer
/// layers (default 8) and experts per layer (default 64; top-10 as released).
fn synth_qwen3_next(out: &str, layers: Option<&String>, experts: Option<&String>) -> ExitCode {
    synth_counted(
        "qwen3-next",
        out,
        (layers, experts),
        (8, 64),
        10,
        |path, l, e, progress| coli_tests::synthetic::write_qwen3_next(path, l, e, progress),
    )
}

/// `synth OUT deepseek-v3 [LAYERS] [EXPERTS]`: DeepSeek-V3's geometry (int8 experts, the
/// MTP layer) with fewer layers (default 3, the first dense) and experts (default 32).
fn synth_deepseek_v3(out: &str, layers: Option<&String>, experts: Option<&String>) -> ExitCode {
    use coli_tests::synthetic::{write_deepseek_v3, DeepseekSpec};
    synth_counted(
        "deepseek-v3",
        out,
        (layers, experts),
        (3, 32),
        1,
        |path, l, e, progress| write_deepseek_v3(path, &DeepseekSpec::v3(l, e), progress),
    )
}

/// A `synth OUT NAME [LAYERS] [EXPERTS]` command: parses the counts (positive, `defaults`
/// when absent, at least `min_experts` experts), refuses an existing `out`, and runs
/// `write` with progress on stderr.
fn synth_counted(
    name: &str,
    out: &str,
    (layers, experts): (Option<&String>, Option<&String>),
    defaults: (usize, usize),
    min_experts: usize,
    write: impl FnOnce(
        &std::path::Path,
        usize,
        usize,
        &mut dyn FnMut(usize, usize),
    ) -> std::io::Result<()>,
) -> ExitCode {
    let count = |v: Option<&String>, default: usize| match v.map(|x| x.parse::<usize>()) {
        None => Some(default),
        Some(Ok(n)) if n > 0 => Some(n),
        Some(_) => None,
    };
    let (Some(layers), Some(experts)) = (count(layers, defaults.0), count(experts, defaults.1))
    else {
        eprintln!("{name} takes positive LAYERS and EXPERTS counts");
        return ExitCode::from(2);
    };
    if experts < min_experts {
        eprintln!("{name} routes to {min_experts} experts: EXPERTS must be at least {min_experts}");
        return ExitCode::from(2);
    }
    let path = std::path::Path::new(out);
    if path.exists() {
        eprintln!("{out} exists; refusing to overwrite");
        return ExitCode::from(2);
    }
    let t = Instant::now();
    match write(path, layers, experts, &mut |d, n| {
        eprint!("\rsynth: layer {d}/{n}")
    }) {
        Ok(()) => {
            eprintln!(
                "\nsynth: {name}, {layers} layers x {experts} experts -> {out} in {:.1}s",
                t.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nsynth: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Writes a synthetic model (random weights, real names and config) for benchmarks.
fn synth(args: &[String]) -> ExitCode {
    use coli_tests::synthetic::{write_olmoe, OlmoeSpec};
    let Some(out) = args.first() else {
        eprintln!(
            "usage: cargo xtask synth OUT [olmoe|small] [bf16|int8] | OUT gpt-oss-20b [LAYERS] \
             | OUT qwen3-next [LAYERS] [EXPERTS] | OUT deepseek-v3 [LAYERS] [EXPERTS] \
             | OUT deepseek-v4 [LAYERS] [EXPERTS]"
        );
        return ExitCode::from(2);
    };
    if args.get(1).map(String::as_str) == Some("gpt-oss-20b") {
        return synth_gpt_oss(out, args.get(2));
    }
    if args.get(1).map(String::as_str) == Some("qwen3-next") {
        return synth_qwen3_next(out, args.get(2), args.get(3));
    }
    if args.get(1).map(String::as_str) == Some("deepseek-v3") {
        return synth_deepseek_v3(out, args.get(2), args.get(3));
    }
    if args.get(1).map(String::as_str) == Some("deepseek-v4") {
        return synth_counted(
            "deepseek-v4",
            out,
            (args.get(2), args.get(3)),
            (4, 16),
            6,
            |path, l, e, progress| coli_tests::synthetic::write_deepseek_v4(path, l, e, progress),
        );
    }
    let mut spec = match args.get(1).map(String::as_str) {
        None | Some("olmoe") => OlmoeSpec::olmoe_geometry(),
        Some("small") => OlmoeSpec::small(),
        Some(other) => {
            eprintln!("unknown geometry {other:?} (olmoe, small)");
            return ExitCode::from(2);
        }
    };
    match args.get(2).map(String::as_str) {
        None => {}
        Some("int8") => spec.int8_experts = true,
        Some("bf16") => spec.int8_experts = false,
        Some(other) => {
            eprintln!("unknown expert format {other:?} (bf16, int8)");
            return ExitCode::from(2);
        }
    }
    let path = std::path::Path::new(out);
    if path.exists() {
        eprintln!("{out} exists; refusing to overwrite");
        return ExitCode::from(2);
    }
    let t0 = Instant::now();
    match write_olmoe(path, &spec, |d, n| eprint!("\rsynth: layer {d}/{n}")) {
        Ok(()) => {
            eprintln!(
                "\nsynth: {spec:?} -> {out} in {:.1}s",
                t0.elapsed().as_secs_f64()
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nsynth: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cargo(args: &[&str]) -> bool {
    eprintln!("+ cargo {}", args.join(" "));
    let t = Instant::now();
    let ok = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .status()
        .is_ok_and(|s| s.success());
    eprintln!("  ({:.0} s)", t.elapsed().as_secs_f64());
    ok
}

/// The workspace's `rust-version`, checked: `cargo check` with that toolchain when rustup
/// can provide it (said and skipped when it cannot: no rustup, or no network to fetch it).
fn msrv_check() -> bool {
    const MSRV: &str = "1.89.0";
    let have = Command::new("rustup")
        .args(["run", MSRV, "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
        || Command::new("rustup")
            .args(["toolchain", "install", MSRV, "--profile", "minimal"])
            .status()
            .is_ok_and(|s| s.success());
    if !have {
        eprintln!("xtask test: MSRV check skipped: toolchain {MSRV} not available here");
        return true;
    }
    eprintln!("+ cargo +{MSRV} check --workspace (rust-version)");
    let t = Instant::now();
    let ok = Command::new("rustup")
        .args(["run", MSRV, "cargo", "check", "--workspace", "--quiet"])
        .env("CARGO_TARGET_DIR", "target/msrv")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .status()
        .is_ok_and(|s| s.success());
    eprintln!("  ({:.0} s)", t.elapsed().as_secs_f64());
    if !ok {
        eprintln!("xtask test: the workspace does not build with Rust {MSRV} (rust-version)");
    }
    ok
}

fn test() -> ExitCode {
    let steps: &[&[&str]] = &[
        &["fmt", "--all", "--check"],
        &[
            "clippy",
            "--release",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
        &["test", "--release", "--workspace"],
        // The parsers of untrusted bytes once more with overflow checks and debug
        // assertions on (the `checked` profile: dev's checks, light optimisation).
        &[
            "test",
            "--profile",
            "checked",
            "-p",
            "coli-core",
            "-p",
            "coli-grammar",
        ],
    ];
    for s in steps {
        if !cargo(s) {
            eprintln!("xtask test: `cargo {}` failed", s.join(" "));
            return ExitCode::FAILURE;
        }
    }
    if !msrv_check() {
        return ExitCode::FAILURE;
    }
    verify()
}

fn verify() -> ExitCode {
    let checks: Vec<NamedCheck> = vec![
        (
            "rope: cached table vs an independent per-(position, pair) powf reference",
            rope_cached_vs_recomputed,
        ),
        ("kernels: SIMD vs scalar, every format", simd_vs_scalar),
        (
            "oracle: teacher-forced logits and greedy vs transformers",
            oracle,
        ),
        (
            "prefill: parallel vs serial positions, batch vs one at a time",
            prefill_invariants,
        ),
        ("threads: 1 vs all threads", thread_invariance),
        (
            "placement: expert store cache 1/2/8/all/off x prefetch x O_DIRECT x threads",
            placement_invariance,
        ),
    ];
    let (mut passed, mut failed) = (0, 0);
    for (name, f) in checks {
        let t = Instant::now();
        match f() {
            Ok(msg) => {
                passed += 1;
                println!("ok   {name}: {msg} ({:.1}s)", t.elapsed().as_secs_f64());
            }
            Err(msg) => {
                failed += 1;
                println!("FAIL {name}: {msg}");
            }
        }
    }
    println!("verify: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn rope_cached_vs_recomputed() -> Check {
    let configs = [
        (64, 10000.0, RopeScaling::None),
        (64, 100000.0, RopeScaling::None),
        (
            128,
            500000.0,
            RopeScaling::Llama3 {
                factor: 8.0,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192.0,
            },
        ),
        (32, 1e6, RopeScaling::Linear { factor: 4.0 }),
        (
            64,
            10000.0,
            RopeScaling::Yarn(coli_core::YarnParameters {
                factor: 40.0,
                beta_fast: 32.0,
                beta_slow: 1.0,
                original_max_position_embeddings: 4096.0,
                attention_factor: None,
                mscale: Some(1.0),
                mscale_all_dim: Some(0.707),
                truncate: true,
            }),
        ),
    ];
    let mut pairs = 0u64;
    let n_configs = configs.len();
    for (dim, theta, scaling) in configs {
        let table = RopeTable::new(dim, theta, &scaling);
        let half = dim / 2;
        let (mut c1, mut s1, mut c2, mut s2) = (
            vec![0.0; half],
            vec![0.0; half],
            vec![0.0; half],
            vec![0.0; half],
        );
        let positions = 10_000_000usize.div_ceil(half);
        let x: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.7).sin()).collect();
        for pos in 0..positions {
            table.cos_sin(pos, &mut c1, &mut s1);
            for j in 0..half {
                (c2[j], s2[j]) = rope_reference::cos_sin(pos, j, dim, theta, &scaling);
            }
            for i in 0..half {
                if c1[i].to_bits() != c2[i].to_bits() || s1[i].to_bits() != s2[i].to_bits() {
                    return Err(format!(
                        "dim {dim} theta {theta}: mismatch at position {pos}, pair {i}"
                    ));
                }
            }
            if pos % 4096 == 0 {
                let (mut a, mut b) = (x.clone(), x.clone());
                apply(RopeLayout::HalfSplit, &mut a, &c1, &s1);
                apply(RopeLayout::HalfSplit, &mut b, &c2, &s2);
                if a.iter().zip(&b).any(|(p, q)| p.to_bits() != q.to_bits()) {
                    return Err(format!(
                        "dim {dim}: rotated vectors differ at position {pos}"
                    ));
                }
            }
            pairs += half as u64;
        }
    }
    Ok(format!("{pairs} (position, frequency) pairs over {n_configs} (dim, theta, scaling) configs (default, llama3, linear, yarn), 0 bit mismatches against the independent reference"))
}

fn simd_vs_scalar() -> Check {
    let isas = cpu::available();
    // The machine's ISAs must all be covered: on an AVX-512 machine, AVX-512, AVX2 and
    // scalar each run (a build or detection change that drops one fails here).
    #[cfg(target_arch = "x86_64")]
    let expected = {
        let (avx2, avx512) = (
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c"),
            std::arch::is_x86_feature_detected!("avx512f"),
        );
        match (avx2, avx512) {
            (true, true) => vec![cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::Avx512],
            (true, false) => vec![cpu::Isa::Scalar, cpu::Isa::Avx2],
            _ => vec![cpu::Isa::Scalar],
        }
    };
    #[cfg(not(target_arch = "x86_64"))]
    let expected = vec![cpu::Isa::Scalar];
    if isas != expected {
        return Err(format!("ISAs compared {isas:?}, expected {expected:?}"));
    }
    let mut s = 0x9e3779b97f4a7c15u64;
    let mut rnd = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
    };
    let mut count = 0u64;
    // Formats with a vector dot. A bare quantized dot (FP8, int8, int4) takes the scalar
    // path on every ISA, so it is not a SIMD check; those formats are compared below
    // through the matmul, whose dequantized rows go through the vector kernels.
    for fmt in [WFormat::F32, WFormat::BF16, WFormat::F16] {
        assert!(fmt.has_vector_path());
        for n in [1usize, 15, 16, 17, 63, 64, 100, 576, 1536, 2049] {
            for _ in 0..200 {
                let x: Vec<f32> = (0..n).map(|_| rnd()).collect();
                let row: Vec<u8> = (0..n)
                    .flat_map(|_| {
                        let v = rnd();
                        match fmt {
                            WFormat::F32 => v.to_le_bytes().to_vec(),
                            WFormat::BF16 => {
                                half::bf16::from_f32(v).to_bits().to_le_bytes().to_vec()
                            }
                            WFormat::F16 => half::f16::from_f32(v).to_bits().to_le_bytes().to_vec(),
                            _ => unreachable!("not in this list"),
                        }
                    })
                    .collect();
                let want = dot::dot_scalar(fmt, &row, &x).to_bits();
                for &isa in &isas {
                    let got = dot::dot_rows(isa, fmt, [&row[..]], &x)[0].to_bits();
                    let got4 = dot::dot_rows(isa, fmt, [&row[..], &row, &row, &row], &x);
                    if got != want || got4.iter().any(|g| g.to_bits() != want) {
                        return Err(format!(
                            "{fmt:?} n={n} {isa:?}: {got:#x} vs scalar {want:#x}"
                        ));
                    }
                    count += 1;
                }
            }
        }
    }
    // Scaled matrices, batched and parallel: FP8 in 128 x 128 blocks (partial edges), coli
    // int8 (a scale per row) and int4 (a scale per 64 columns), MXFP4 (a scale per 32).
    let mut mats = 0;
    for (rows, cols, n_tok) in [(130usize, 300usize, 1usize), (257, 129, 3), (64, 2049, 5)] {
        for (fmt, br, bc) in [
            (WFormat::F8E4M3, 128, 128),
            (WFormat::I8, 1, cols),
            (WFormat::I4, 1, 64),
            (WFormat::F4E2M1, 1, 32),
        ] {
            // FP8 without its NaN encodings; every other byte as it comes.
            let mask = if fmt == WFormat::F8E4M3 { 0xF7 } else { 0xFF };
            let w: Vec<u8> = (0..rows * fmt.row_bytes(cols))
                .map(|_| (rnd().to_bits() as u8) & mask)
                .collect();
            let scales: Vec<f32> = (0..rows.div_ceil(br) * cols.div_ceil(bc))
                .map(|_| rnd().abs() * 0.01 + 1e-4)
                .collect();
            let xs: Vec<f32> = (0..n_tok * cols).map(|_| rnd()).collect();
            let m = coli_kernels::MatRef::new(fmt, &w, rows, cols).with_scales(
                coli_kernels::matmul::BlockScales {
                    scales: (&scales).into(),
                    block_rows: br,
                    block_cols: bc,
                },
            );
            let mut want = vec![0.0; n_tok * rows];
            coli_kernels::matmul::matmul_reference(&m, &xs, n_tok, &mut want);
            for &isa in &isas {
                let mut got = vec![0.0; n_tok * rows];
                coli_kernels::matmul::matmul_isa(isa, &m, &xs, n_tok, &mut got);
                if got
                    .iter()
                    .zip(&want)
                    .any(|(a, b)| a.to_bits() != b.to_bits())
                {
                    return Err(format!(
                        "{fmt:?} scaled {rows}x{cols} {isa:?}: differs from the scalar reference"
                    ));
                }
                mats += 1;
            }
        }
    }
    Ok(format!(
        "{count} f32/bf16/f16 dot products and {mats} scaled (FP8, int8, int4, FP4) matmuls on {isas:?} (every ISA of this CPU), all bit-identical to scalar"
    ))
}

/// Runs a shared check over every fixture.
fn each_fixture(check: impl Fn(&str) -> Result<(), String>) -> Result<(), String> {
    TINY_FIXTURES.iter().try_for_each(|name| check(name))
}

fn placement_invariance() -> Check {
    let mut compared = 0;
    for name in TINY_FIXTURES {
        let r = Reference::load(name);
        compared += coli_tests::placement::check(&r.dir, &r.ids())?;
    }
    let tmp = std::env::temp_dir().join(format!("coli-verify-synth-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let spec = coli_tests::synthetic::OlmoeSpec::small();
    coli_tests::synthetic::write_olmoe(&tmp, &spec, |_, _| {}).map_err(|e| e.to_string())?;
    let seq: Vec<u32> = (0..20).map(|i| (i * 131 + 7) % spec.vocab as u32).collect();
    let r = coli_tests::placement::check(&tmp, &seq);
    let _ = std::fs::remove_dir_all(&tmp);
    compared += r?;
    Ok(format!(
        "{compared} placements on the MoE fixtures and a synthetic model, all byte-identical to the model read in place"
    ))
}

fn oracle() -> Check {
    each_fixture(checks::oracle)?;
    Ok(format!(
        "{} fixtures: logits within {:e} of the row scale, top-1 agrees, greedy identical",
        TINY_FIXTURES.len(),
        coli_tests::ORACLE_TOLERANCE
    ))
}

fn prefill_invariants() -> Check {
    each_fixture(checks::prefill_invariants)?;
    Ok("byte-identical on every fixture".into())
}

fn thread_invariance() -> Check {
    let all = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .max(2);
    each_fixture(|name| checks::thread_invariance(name, &[all]))?;
    Ok(format!(
        "byte-identical at 1 and {all} threads on every fixture"
    ))
}
