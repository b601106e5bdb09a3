#!/bin/bash
# Process start to first token on the same GGUF files, coli against llama.cpp's
# llama-completion: the wall time of one process that loads the file, prefills a short text
# prompt and writes one token (warm page cache, 2 threads), 5 interleaved rounds, medians.
# llama.cpp without its warm-up run (--no-warmup, its fastest start).
#   COLI=target/release/coli LLAMA_COMPLETION=.../build/bin/llama-completion bash bench/gguf_ttft.sh A.gguf B.gguf
# llama-completion: `cmake --build build --target llama-completion` in llama-cpp-python
# 0.3.36's vendor/llama.cpp (GGML_NATIVE=ON).
COLI=${COLI:-target/release/coli}
LC=${LLAMA_COMPLETION:?set LLAMA_COMPLETION to llama-completion}
PROMPT="The quick brown fox jumps over the lazy dog while the old man watches from the"
ROUNDS=${ROUNDS:-5}
wall() { local t0 t1; t0=$(date +%s.%N); "$@" > /dev/null 2>&1 || echo "failed: $*" >&2; t1=$(date +%s.%N); echo "$t1 - $t0" | bc; }
for m in "$@"; do cat "$m" > /dev/null; done
for m in "$@"; do
  c=(); l=()
  for r in $(seq $ROUNDS); do
    c+=("$(wall $COLI run --model "$m" --prompt "$PROMPT" --max-tokens 1 --threads 2 --draft off)")
    l+=("$(wall $LC -m "$m" -t 2 -n 1 -p "$PROMPT" -no-cnv --no-warmup --temp 0)")
  done
  med() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
  echo "$(basename "$m") coli_s $(med "${c[@]}") llama_s $(med "${l[@]}") coli_all ${c[*]} llama_all ${l[*]}"
done
