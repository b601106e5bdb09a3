#!/usr/bin/env bash
# Expert streaming on a synthetic OLMoE-geometry model with int8 experts (~6.4 GB of experts):
# interleaved rounds of the configurations below, each from a cold page cache, with
# /usr/bin/time for the peak RSS. Prints one JSON line per run (coli's --json stats + rss_kb).
#
#   cargo build --release && cargo run --release -p xtask -- synth /work/bench-models/olmoe-int8 olmoe int8
#   bench/streaming.sh /work/bench-models/olmoe-int8 3 > streaming.jsonl
set -euo pipefail
MODEL=${1:?model dir}
ROUNDS=${2:-3}
DECODE=${DECODE:-24}
COLI=${COLI:-target/release/coli}
PROMPT=$(seq -s, 11 26)            # 16 prompt tokens
LONG=$(seq -s, 11 266)             # 256 tokens: touches every expert (warm runs)
declare -A CONF=(
  [stream_prefetch]="--cap 8 --direct --prefetch on --prompt-ids $PROMPT"
  [stream_layer]="--cap 8 --direct --prefetch layer --prompt-ids $PROMPT"
  [stream_noprefetch]="--cap 8 --direct --prefetch off --prompt-ids $PROMPT"
  [all_cached_store]="--expert-cache all --direct --prompt-ids $LONG"
  [resident_no_store]="--expert-cache off --prompt-ids $LONG"
)
ORDER=${ORDER:-stream_prefetch stream_layer stream_noprefetch all_cached_store resident_no_store}
for r in $(seq 1 "$ROUNDS"); do
  for name in $ORDER; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    out=$(/usr/bin/time -v "$COLI" run --model "$MODEL" ${CONF[$name]} --max-tokens "$DECODE" \
          --ignore-eos --no-usage --json 2>/tmp/coli-time.txt | tail -1)
    rss=$(awk '/Maximum resident set size/ {print $6}' /tmp/coli-time.txt)
    echo "{\"round\":$r,\"config\":\"$name\",\"rss_kb\":$rss,\"run\":$out}"
  done
done
