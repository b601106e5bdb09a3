#!/bin/bash
# The same GGUF files in coli and in llama.cpp's llama-bench, 3 interleaved rounds, 2 threads,
# warm page cache: coli decode tok/s and TTFT (16-token prompt, 64 tokens, --draft off), coli
# prefill tok/s (256-token prompt), llama-bench pp256 and tg64.
#   COLI=target/release/coli LLAMA_BENCH=.../build/bin/llama-bench bash bench/gguf_vs_llamabench.sh A.gguf B.gguf
# llama-bench: built from llama-cpp-python 0.3.36's vendor/llama.cpp (GGML_NATIVE=ON; on a VM that
# lists AMX but traps it, add -mno-amx-tile -mno-amx-int8 -mno-amx-bf16 to the C/C++ flags).
COLI=${COLI:-target/release/coli}
LB=${LLAMA_BENCH:?set LLAMA_BENCH to llama-bench}
P16=$(seq -s, 11 26)
P256=$(seq -s, 100 355)
for r in 1 2 3; do
 for m in "$@"; do
  d=$($COLI run --model $m --prompt-ids $P16 --ignore-eos --max-tokens 64 --json --no-usage --threads 2 --draft off 2>/dev/null | tail -1 | python3 -c "import json,sys; s=json.load(sys.stdin)['stats']; print(s['decode_tok_s'], s['ttft_ms'])")
  p=$($COLI run --model $m --prompt-ids $P256 --ignore-eos --max-tokens 1 --json --no-usage --threads 2 --draft off 2>/dev/null | tail -1 | python3 -c "import json,sys; s=json.load(sys.stdin)['stats']; print(s['prefill_tok_s'])")
  l=$($LB -m $m -t 2 -p 256 -n 64 -r 1 -o csv 2>/dev/null | python3 -c "
import csv,sys
rows=list(csv.DictReader(sys.stdin)); print(' '.join(r['avg_ts'] for r in rows))")
  echo "round $r $(basename $m) coli_decode_ttft $d coli_prefill $p llama_pp256_tg64 $l"
 done
done
