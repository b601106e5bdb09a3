#!/usr/bin/env python3
"""Medians per configuration of bench/streaming.sh's JSON lines."""
import json, statistics as st, sys

rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["config"], []).append(r)
keys = ["decode_tok_s", "prefill_tok_s", "expert_hit_rate", "prefetch_hit_rate", "disk_bytes_per_token",
        "disk_mb_s", "expert_misses", "speculative_prefetches", "wasted_prefetches", "load_s"]
for c, rs in by.items():
    out = {"runs": len(rs), "rss_MB": round(st.median(r["rss_kb"] / 1024 for r in rs))}
    for k in keys:
        v = [r["run"]["stats"].get(k) for r in rs if r["run"]["stats"].get(k) is not None]
        if v:
            out[k] = round(st.median(v), 3)
    out["decode_each"] = [round(r["run"]["stats"]["decode_tok_s"], 2) for r in rs]
    print(c, json.dumps(out))
