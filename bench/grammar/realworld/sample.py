#!/usr/bin/env python3
"""Picks the committed sample of the real-world corpus: per source, the schemas whose
line is at most MAX_BYTES, chosen by a hash of their name (stable across rebuilds), at
most PER_SOURCE each. Usage: sample.py OUT.jsonl CORPUS.jsonl [CORPUS.jsonl ...]"""

import hashlib
import json
import sys

MAX_BYTES = 5000
PER_SOURCE = 35


def main():
    out, files = sys.argv[1], sys.argv[2:]
    picked = []
    for f in files:
        rows = []
        for line in open(f):
            r = json.loads(line)
            if len(line) <= MAX_BYTES and r["valid"]:
                rows.append((hashlib.sha256(r["name"].encode()).hexdigest(), line))
        rows.sort()
        picked += [line for _, line in rows[:PER_SOURCE]]
    with open(out, "w") as f:
        f.writelines(picked)
    print(f"{len(picked)} schemas, {sum(map(len, picked))} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
