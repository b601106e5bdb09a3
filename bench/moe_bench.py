"""coli vs llama.cpp on one MoE model, interleaved rounds, medians (issue 13's evidence).

Each round runs, in turn, every coli variant and llama.cpp on:
  * decode: an 8-token prompt, 128 greedy tokens, EOS ignored (tok/s after the first token);
  * TTFT: model open -> first token of that run (coli: load_s + ttft; llama.cpp: Llama()
    construction + prompt eval + first argmax); process start and Python imports excluded;
  * prefill: a 256-token prompt, one new token (prompt tokens / prompt time).
The first round checks that every engine produces the same greedy ids (the synthetic int8
model and its Q8_0 GGUF differ by Q8_0's rounding, so a divergence late in the sequence is
reported, not fatal).

    python3 bench/moe_bench.py --model DIR --gguf FILE.gguf [--rounds 5] [--threads 2]
        [--variant NAME=ENV=VAL,...:ARGS ...] [--peer-python /work/peer/venv/bin/python]
(a variant's COLI_BIN=path runs that binary instead of --coli, to compare builds, and its
COLI_MODEL=dir that model instead of --model, e.g. an FP8 twin of the int8 model)

Build the model with `cargo xtask synth DIR olmoe int8` and the GGUF with
bench/olmoe_gguf.py (see BENCHMARKING.md); warm the page cache with one untimed round
(`--warmup`, default on).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DECODE_PROMPT = [504, 3575, 282, 4649, 314, 1, 2, 3]
PREFILL_PROMPT = [(i * 7919 + 13) % 49000 + 100 for i in range(256)]


def prewarm(paths):
    """Reads files through the page cache (this VM's reclaim evicts idle page cache, so
    "warm" is made true right before each timed run)."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(1 << 24):
                pass


def coli(args, variant, prompt, n_new):
    # A variant may name its own model directory (COLI_MODEL=dir), e.g. an FP8 twin of the
    # int8 model, so that the two are timed in the same interleaved rounds.
    model = variant["env"].get("COLI_MODEL", args.model)
    prewarm(sorted(os.path.join(model, f) for f in os.listdir(model)))
    env = dict(os.environ)
    env.update(variant["env"])
    # A variant may name its own binary (COLI_BIN=path), to compare builds interleaved.
    cmd = [variant["env"].get("COLI_BIN", args.coli), "run", "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
           "--max-tokens", str(n_new), "--ignore-eos", "--json", "--no-usage",
           "--threads", str(args.threads)] + variant["args"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
    d = json.loads(out.strip().splitlines()[-1])
    s = d["stats"]
    return {"decode": s["decode_tok_s"], "ttft": s["load_s"] + s["ttft_ms"] / 1000,
            "prefill": len(prompt) / (s["ttft_ms"] / 1000), "ids": d["generated_ids"]}


def llama(args, prompt, n_new):
    prewarm([args.gguf])
    cmd = [args.peer_python, os.path.join(HERE, "llamacpp_run.py"), args.gguf, str(args.threads),
           str(n_new), ",".join(map(str, prompt))]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    d = json.loads(out.strip().splitlines()[-1])
    return {"decode": d["decode_tok_s"], "ttft": d["ttft_s"], "prefill": len(prompt) / d["prefill_s"],
            "ids": d["ids"]}


def parse_variant(spec):
    # NAME=K=V,K=V:ARG ARG
    name, _, rest = spec.partition("=")
    envs, _, argv = rest.partition(":")
    env = dict(kv.split("=", 1) for kv in envs.split(",") if kv)
    return {"name": name, "env": env, "args": argv.split()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--coli", default=os.path.join(HERE, "..", "target", "release", "coli"))
    ap.add_argument("--peer-python", default="/work/peer/venv/bin/python")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--n-new", type=int, default=128)
    ap.add_argument("--variant", action="append", default=[])
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--no-warmup", action="store_true")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in args.variant] or [{"name": "coli", "env": {}, "args": []}]
    engines = [(v["name"], lambda p, n, v=v: coli(args, v, p, n)) for v in variants]
    if not args.no_llama:
        engines.append(("llama.cpp", lambda p, n: llama(args, p, n)))
    if not args.no_warmup:
        for _, run in engines:
            run(DECODE_PROMPT, 4)
    res = {name: {"decode": [], "ttft": [], "prefill": []} for name, _ in engines}
    ids = {}
    for r in range(args.rounds):
        for name, run in engines:
            d = run(DECODE_PROMPT, args.n_new)
            p = run(PREFILL_PROMPT, 1)
            res[name]["decode"].append(d["decode"])
            res[name]["ttft"].append(d["ttft"])
            res[name]["prefill"].append(p["prefill"])
            ids.setdefault(name, d["ids"])
            print(f"round {r + 1} {name}: decode {d['decode']:.2f} tok/s, ttft {d['ttft'] * 1000:.0f} ms, "
                  f"prefill {p['prefill']:.1f} tok/s", file=sys.stderr, flush=True)
    ref = next(iter(ids.values()))
    for name, v in ids.items():
        same = next((i for i, (a, b) in enumerate(zip(ref, v)) if a != b), len(ref))
        print(f"{name}: greedy ids agree with {next(iter(ids))} on the first {same} of {len(ref)}")
    print(f"| engine | decode tok/s | TTFT from model open (ms) | prefill 256 tok/s |")
    print("|---|---|---|---|")
    for name, v in res.items():
        print(f"| {name} | {statistics.median(v['decode']):.2f} | {statistics.median(v['ttft']) * 1000:.0f} | "
              f"{statistics.median(v['prefill']):.1f} |")
    print(json.dumps(res))


if __name__ == "__main__":
    main()
