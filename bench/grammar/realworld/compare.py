#!/usr/bin/env python3
"""coli-grammar against llguidance on the real-world corpus.

Runs the `realworld` example (bench/grammar/examples/realworld.rs) over each corpus file,
restarting past a schema that aborts the process (counted as a crash), and prints the
table of issue 17: compiled %, valid instances accepted, invalid accepted, crashes,
compile p50/p99, mask p50/p99/p99.9/max, plus coli's most frequent refusals and
rejections of valid instances.

Usage: compare.py BIN CORPUS.jsonl [CORPUS.jsonl ...] [--results OUT.jsonl]
"""

import collections
import json
import re
import subprocess
import sys


def run(binary, corpus):
    rows, crashes, skip = [], [], 0
    total = sum(1 for _ in open(corpus))
    while skip < total:
        p = subprocess.run([binary, corpus, "--skip", str(skip)], capture_output=True, text=True)
        got = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
        rows += got
        skip = (got[-1]["i"] + 1) if got else skip
        if p.returncode != 0:
            crashes.append((corpus, skip, p.stderr.strip().splitlines()[-1:] if p.stderr else []))
            skip += 1
        elif not got:
            break
    return rows, crashes


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    args = sys.argv[1:]
    out = None
    if "--results" in args:
        i = args.index("--results")
        out = args[i + 1]
        del args[i : i + 2]
    binary, corpora = args[0], args[1:]
    rows, crashes = [], []
    for c in corpora:
        r, k = run(binary, c)
        rows += r
        crashes += k
    if out:
        with open(out, "w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    n = len(rows) + len(crashes)
    print(f"{n} schemas, {sum(len(r['coli_valid']) for r in rows if r['coli_ok'])} valid instances under coli")
    print()
    print("| | coli | llguidance |")
    print("|---|---|---|")
    for who in ["coli", "llg"]:
        pass
    def line(label, f):
        print(f"| {label} | {f('coli')} | {f('llg')} |")

    line("schemas compiled", lambda w: f"{100 * sum(r[w + '_ok'] for r in rows) / n:.1f}% ({sum(r[w + '_ok'] for r in rows)})")
    line("crashes", lambda w: str(len(crashes)) if w == "coli" else "0")

    def acc(w, k):
        xs = [x for r in rows if r[w + "_ok"] for x in r[f"{w}_{k}"]]
        return sum(xs), len(xs)

    line("valid instances accepted", lambda w: "%.1f%% (%d / %d)" % (100 * acc(w, "valid")[0] / max(1, acc(w, "valid")[1]), *acc(w, "valid")))
    line("invalid instances accepted", lambda w: "%d / %d" % acc(w, "invalid"))
    line("compile p50 / p99 (µs)", lambda w: "%.0f / %.0f" % (pct([r[w + "_us"] for r in rows if r[w + "_ok"]], 0.5), pct([r[w + "_us"] for r in rows if r[w + "_ok"]], 0.99)))
    masks = {w: [x for r in rows for x in r[w + "_mask_us"]] for w in ["coli", "llg"]}
    line(
        "mask p50 / p99 / p99.9 / max (µs)",
        lambda w: "%.1f / %.0f / %.0f / %.0f (%d masks)"
        % (pct(masks[w], 0.5), pct(masks[w], 0.99), pct(masks[w], 0.999), max(masks[w] or [0]), len(masks[w])),
    )
    both = [r for r in rows if r["coli_ok"] and r["llg_ok"]]
    print(f"\nboth compile: {len(both)}; coli only: {sum(r['coli_ok'] and not r['llg_ok'] for r in rows)}; llguidance only: {sum(r['llg_ok'] and not r['coli_ok'] for r in rows)}")
    by_source = collections.defaultdict(lambda: [0, 0, 0])
    for r in rows:
        s = by_source[r["name"].split("/")[0]]
        s[0] += 1
        s[1] += r["coli_ok"]
        s[2] += r["llg_ok"]
    print("\n| source | schemas | coli compiled | llguidance compiled |\n|---|---|---|---|")
    for k, (a, b, c) in sorted(by_source.items()):
        print(f"| {k} | {a} | {b} | {c} |")
    reasons = collections.Counter()
    for r in rows:
        if not r["coli_ok"]:
            m = re.search(r': ("[^"]*"): ', r["coli_err"] or "")
            reasons[(m.group(1) if m else "?") + " " + re.sub(r"[0-9]+", "N", (r["coli_err"] or "").split(": ", 2)[-1])[:90]] += 1
    print("\ncoli refusals:")
    for k, v in reasons.most_common(25):
        print(f"  {v:5d}  {k}")
    print("\ncoli rejects valid instance (first 15):")
    k = 0
    for r in rows:
        if r["coli_ok"] and not all(r["coli_valid"]):
            print("  ", r["name"], r["coli_valid"])
            k += 1
            if k >= 15:
                break
    print("\ncoli accepts invalid instance:")
    for r in rows:
        if r["coli_ok"] and any(r["coli_invalid"]):
            print("  ", r["name"], r["coli_invalid"])
    for c in crashes:
        print("crash:", c)


if __name__ == "__main__":
    main()
