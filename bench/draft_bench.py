"""Drafting (issue 16): tokens per forward, acceptance, decode tok/s and expert bytes per
token with and without drafts, interleaved rounds, medians.

Each round runs every variant in turn on the same prompt; every variant must produce the
same greedy ids (drafts change speed only; a mismatch aborts).

    python3 bench/draft_bench.py --model DIR (--prompt-ids 1,2,3 | --chat-prompt TEXT)
        [--tokens 32] [--rounds 5] [--threads 2] [--cgroup BYTES] [--variant NAME:ARGS ...]

ARGS are extra `coli run` flags, space-separated (`off:--draft off`,
`mtp:--draft mtp --cap 4`). With --cgroup each run is started by
../shared/tools/in_cgroup.sh in a fresh memory cgroup of BYTES after dropping the page
cache (a cold, RAM-limited run); without it the model's files are read through the page
cache right before each run (warm).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CGROUP = os.path.join(HERE, "..", "..", "shared", "tools", "in_cgroup.sh")


def prewarm(model):
    for f in sorted(os.listdir(model)):
        with open(os.path.join(model, f), "rb") as fh:
            while fh.read(1 << 24):
                pass


def run(args, extra):
    prompt = (["--chat", "--prompt", args.chat_prompt] if args.chat_prompt
              else ["--prompt-ids", args.prompt_ids, "--ignore-eos"])
    cmd = [args.coli, "run", "--model", args.model] + prompt + [
           "--max-tokens", str(args.tokens), "--json", "--no-usage",
           "--threads", str(args.threads)] + extra
    if args.cgroup:
        cmd = ["bash", CGROUP, str(args.cgroup)] + cmd
    else:
        prewarm(args.model)
    p = subprocess.run(cmd, capture_output=True, text=True)
    lines = [l for l in p.stdout.strip().splitlines() if l.startswith("{")]
    if p.returncode != 0 or not lines:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    if args.cgroup and "oom_kills=0" not in p.stdout:
        sys.exit(f"OOM in the cgroup: {p.stdout[-500:]}")
    d = json.loads(lines[-1])
    s = d["stats"]
    n = len(d["generated_ids"])
    forwards = n - 1 - s["drafted_tokens"]  # decode forwards after the first token
    return {
        "ids": d["generated_ids"],
        "decode": s["decode_tok_s"],
        "per_forward": (n - 1) / max(forwards, 1),
        "proposed": s["draft_proposed"],
        "accepted": s["drafted_tokens"],
        "bytes_per_token": s.get("disk_bytes_per_token", 0.0),
        "hit_rate": s.get("expert_hit_rate", 1.0),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompt-ids")
    ap.add_argument("--chat-prompt", help="a user message, in the model's chat template")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cgroup", type=int, default=0)
    ap.add_argument("--coli", default=os.path.join(HERE, "..", "target", "release", "coli"))
    ap.add_argument("--variant", action="append", default=[])
    args = ap.parse_args()
    if not args.prompt_ids and not args.chat_prompt:
        sys.exit("--prompt-ids or --chat-prompt is required")
    variants = [(v.split(":", 1)[0], v.split(":", 1)[1].split()) for v in args.variant]
    if not variants:
        variants = [("off", ["--draft", "off"]), ("auto", ["--draft", "auto"])]
    results = {name: [] for name, _ in variants}
    reference = None
    for r in range(args.rounds):
        for name, extra in variants:
            out = run(args, extra)
            if reference is None:
                reference = out["ids"]
            elif out["ids"] != reference:
                sys.exit(f"{name}: different tokens\n{out['ids']}\n{reference}")
            results[name].append(out)
            print(f"round {r} {name}: {out['decode']:.2f} tok/s, {out['per_forward']:.2f} tok/forward, "
                  f"{out['accepted']}/{out['proposed']} accepted, "
                  f"{out['bytes_per_token'] / 1e6:.1f} MB/token", file=sys.stderr)
    print("| variant | decode tok/s, median (range) | tokens per forward | drafts accepted | "
          "expert MB read per token | expert hit rate |")
    print("|---|---|---|---|---|---|")
    for name, _ in variants:
        rs = results[name]
        dec = [x["decode"] for x in rs]
        first = rs[0]
        acc = f"{first['accepted']} of {first['proposed']}" if first["proposed"] else "-"
        print(f"| {name} | {statistics.median(dec):.2f} ({min(dec):.2f}-{max(dec):.2f}) | "
              f"{first['per_forward']:.2f} | {acc} | "
              f"{statistics.median(x['bytes_per_token'] for x in rs) / 1e6:.1f} | "
              f"{statistics.median(x['hit_rate'] for x in rs):.3f} |")


if __name__ == "__main__":
    main()
