#!/bin/bash
# Aggregate throughput of coli serve vs llama-cpp-python's server on the same weights,
# same prompts, 1/4/8 concurrent clients, interleaved rounds (coli, llama, coli, llama…).
#   bench/serve_compare.sh COLI_MODEL_DIR GGUF [ROUNDS] [MAX_TOKENS] [PYTHON]
# PYTHON is a python with llama-cpp-python[server] (see ../shared/BENCHMARKING.md).
set -u
MODEL=$1; GGUF=$2; ROUNDS=${3:-2}; N=${4:-64}; PY=${5:-python3}
COLI=${COLI:-target/release/coli}
wait_up() { for _ in $(seq 600); do curl -sf "$1/health" >/dev/null 2>&1 || curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0; sleep 0.2; done; return 1; }
for r in $(seq "$ROUNDS"); do
  $COLI serve --model "$MODEL" --threads 2 --slots 8 --port 8082 --no-usage 2>/dev/null & pid=$!
  wait_up http://127.0.0.1:8082
  for c in 1 4 8; do python3 bench/serve_bench.py http://127.0.0.1:8082 $c $((16 / c > 2 ? 16 / c : 2)) $N coli; done
  kill -TERM $pid; wait $pid
  $PY -m llama_cpp.server --model "$GGUF" --n_threads 2 --n_threads_batch 2 --n_ctx 4096 --port 8083 >/dev/null 2>&1 & pid=$!
  wait_up http://127.0.0.1:8083
  for c in 1 4 8; do python3 bench/serve_bench.py http://127.0.0.1:8083 $c $((16 / c > 2 ? 16 / c : 2)) $N llama.cpp; done
  kill -TERM $pid; wait $pid
done
