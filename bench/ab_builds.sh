#!/usr/bin/env bash
# Interleaved A/B of two coli builds on the demo model: decode (128 greedy tokens after a
# 5-token prompt) and prefill (256-token prompt), 1 and 2 threads, medians.
#   bash bench/ab_builds.sh OLD_COLI NEW_COLI [ROUNDS]
set -euo pipefail
old=$1 new=$2 rounds=${3:-5}
long=$(python3 -c "print(','.join(str(1000 + (i * 37) % 40000) for i in range(256)))")
for t in 1 2; do
  for r in $(seq "$rounds"); do
    for b in "$old" "$new"; do
      d=$("$b" run --prompt-ids 504,3575,282,4649,314 --max-tokens 128 --ignore-eos --json --threads $t --no-usage 2>/dev/null | tail -1)
      p=$("$b" run --prompt-ids "$long" --max-tokens 1 --json --threads $t --no-usage 2>/dev/null | tail -1)
      python3 -c "import json,sys; d=json.loads(sys.argv[1])['stats']; p=json.loads(sys.argv[2])['stats']; print(sys.argv[3], sys.argv[4], round(d['decode_tok_s'],1), round(p['prefill_tok_s'],1))" "$d" "$p" "$([ "$b" = "$old" ] && echo old || echo new)" $t
    done
  done
done | python3 -c "
import sys, statistics as st, collections
v = collections.defaultdict(list)
for l in sys.stdin:
    b, t, dec, pre = l.split(); v[(b, t)].append((float(dec), float(pre)))
for (b, t), xs in sorted(v.items(), key=lambda kv: (kv[0][1], kv[0][0])):
    print(f'{b} threads {t}: decode {st.median(x[0] for x in xs):.1f} tok/s, prefill(256) {st.median(x[1] for x in xs):.1f} tok/s  (runs {[x[0] for x in xs]})')
"
