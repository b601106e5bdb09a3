#!/bin/bash
# Prefill of a 256-token prompt, interleaved: coli before (BEFORE_TARGET) / coli now / llama.cpp.
# BF16_GGUF: the llama.cpp model (see interleave.sh).
IDS=$(python3 -c "print(','.join(str((i*7919)%49000+100) for i in range(256)))")
GGUF=${BF16_GGUF:-/tmp/bench/smol-bf16.gguf}
for t in 1 2; do for r in 1 2 3 4 5; do
  for who in before now; do
    bin=target/release/coli; [ $who = before ] && bin=${BEFORE_TARGET:-/tmp/target_before}/release/coli
    $bin run --prompt-ids $IDS --max-tokens 1 --json --threads $t 2>/dev/null | tail -1 | python3 -c "import json,sys; d=json.load(sys.stdin)['stats']; print('$who', $t, d['prefill_tok_s'], d['ttft_ms'])"
  done
  python3 - "$GGUF" $t "$IDS" <<'PY'
import sys, time
from llama_cpp import Llama
path, t, ids = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split(',')]
llm = Llama(model_path=path, n_threads=t, n_threads_batch=t, n_ctx=512, n_batch=512, verbose=False)
t0 = time.perf_counter(); llm.eval(ids); dt = time.perf_counter() - t0
print('llama.cpp', t, len(ids) / dt, dt * 1e3)
PY
done; done
