"""Streaming from a GGUF (issue 46): the same decode on several models (a GGUF read in place,
coli's own container of the same weights, ...), each run started cold in a fresh memory
cgroup (../shared/tools/in_cgroup.sh: page cache dropped, the cache counts against the
limit), interleaved rounds, medians: decode tok/s, expert hit rate, expert bytes read from
disk per token, peak memory of the group.

    python3 bench/gguf_stream.py --cgroup BYTES [--rounds 3] [--tokens 24] [--threads 2]
        [--prompt-ids 11,12,...] [--coli target/release/coli] MODEL [MODEL ...]

MODEL is anything `coli run --model` takes; extra flags per model as `MODEL::--cap 4`.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CGROUP = os.path.join(HERE, "..", "..", "shared", "tools", "in_cgroup.sh")


def run(args, model, extra):
    cmd = [args.coli, "run", "--model", model, "--prompt-ids", args.prompt_ids, "--ignore-eos",
           "--max-tokens", str(args.tokens), "--json", "--no-usage", "--threads", str(args.threads)] + extra
    p = subprocess.run(["bash", CGROUP, str(args.cgroup)] + cmd, capture_output=True, text=True)
    lines = [l for l in p.stdout.strip().splitlines() if l.startswith("{")]
    tail = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if not lines or "rc=0" not in tail:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    if "oom_kills=0" not in tail:
        sys.exit(f"OOM in the cgroup: {tail}")
    peak = int(tail.split("peak_bytes=")[1].split()[0])
    s = json.loads(lines[-1])["stats"]
    return {
        "decode": s["decode_tok_s"],
        "hit": s.get("expert_hit_rate", 1.0),
        "mb_per_token": s.get("disk_bytes_per_token", 0.0) / 1e6,
        "ttft_ms": s["ttft_ms"],
        "peak_gb": peak / 1e9,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--cgroup", type=int, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt-ids", default=",".join(str(i) for i in range(11, 27)))
    ap.add_argument("--coli", default=os.path.join(HERE, "..", "target", "release", "coli"))
    args = ap.parse_args()
    models = [(m.split("::", 1)[0], m.split("::", 1)[1].split() if "::" in m else []) for m in args.models]
    results = {m: [] for m, _ in models}
    for r in range(args.rounds):
        for m, extra in models:
            out = run(args, m, extra)
            results[m].append(out)
            print(f"round {r} {os.path.basename(m)}: {out['decode']:.2f} tok/s, hit {out['hit']:.3f}, "
                  f"{out['mb_per_token']:.1f} MB/token, peak {out['peak_gb']:.2f} GB", file=sys.stderr)
    print(f"| model | decode tok/s, median (runs) | expert hit rate | expert MB read per token | TTFT ms | peak GB |")
    print("|---|---|---|---|---|---|")
    for m, _ in models:
        rs = results[m]
        med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
        runs = ", ".join(f"{x['decode']:.2f}" for x in rs)
        print(f"| {os.path.basename(m)} | {med('decode'):.2f} ({runs}) | {med('hit'):.3f} | "
              f"{med('mb_per_token'):.1f} | {med('ttft_ms'):.0f} | {med('peak_gb'):.2f} |")


if __name__ == "__main__":
    main()
