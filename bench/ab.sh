#!/bin/bash
# A/B interleaved: before (37925ea) vs now, and llama.cpp; 128 greedy tokens, --ignore-eos.
# BEFORE_TARGET: a target dir holding the baseline build; BF16_GGUF: see interleave.sh.
for t in 1 2; do for r in 1 2 3 4 5; do
  for who in before now; do
    bin=target/release/coli; [ $who = before ] && bin=${BEFORE_TARGET:-/tmp/target_before}/release/coli
    $bin run --prompt-ids 504,3575,282,4649,314 --max-tokens 128 --ignore-eos --json --threads $t 2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin)['stats']; print('$who', $t, d['decode_tok_s'], d['prefill_tok_s'], d['ttft_ms'], d['load_s'])"
  done
  python3 bench/llamacpp_bench.py ${BF16_GGUF:-/tmp/bench/smol-bf16.gguf} $t 128 2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); print('llama.cpp', $t, d['decode_tok_s'], 5/d['prefill_s'])"
done; done
