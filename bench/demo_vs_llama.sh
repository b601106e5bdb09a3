#!/usr/bin/env bash
# coli vs llama.cpp on the demo model, same bf16 weights, interleaved rounds, medians:
# decode = 128 greedy tokens after a 5-token prompt (EOS ignored; coli with drafts off and
# with its default drafts), prefill = a 256-token prompt.
#   bash bench/demo_vs_llama.sh COLI DEMO_BF16.gguf PYTHON_WITH_LLAMA_CPP [ROUNDS]
# The GGUF: llama.cpp's convert_hf_to_gguf.py on the demo model's directory, --outtype bf16.
set -euo pipefail
coli=$1 gguf=$2 py=$3 rounds=${4:-5}
tool="$(dirname "$0")/../../shared/tools/llama_decode.py"
short=504,3575,282,4649,314
long=$(python3 -c "print(','.join(str(1000 + (i * 37) % 40000) for i in range(256)))")
for t in 1 2; do
  for r in $(seq "$rounds"); do
    for d in off auto; do
      "$coli" run --prompt-ids $short --max-tokens 128 --ignore-eos --json --threads $t --no-usage --draft $d 2>/dev/null | tail -1 |
        python3 -c "import json,sys; print('coli-draft-$d', $t, 'decode', json.load(sys.stdin)['stats']['decode_tok_s'])"
    done
    "$coli" run --prompt-ids "$long" --max-tokens 1 --json --threads $t --no-usage 2>/dev/null | tail -1 |
      python3 -c "import json,sys; print('coli', $t, 'prefill', json.load(sys.stdin)['stats']['prefill_tok_s'])"
    "$py" "$tool" "$gguf" $t 128 $short 2>/dev/null | tail -1 |
      python3 -c "import json,sys; print('llama.cpp', $t, 'decode', json.load(sys.stdin)['decode_tok_s'])"
    "$py" "$tool" "$gguf" $t 1 "$long" 2>/dev/null | tail -1 |
      python3 -c "import json,sys; print('llama.cpp', $t, 'prefill', json.load(sys.stdin)['prefill_tok_s'])"
  done
done | python3 -c "
import sys, statistics as st, collections
v = collections.defaultdict(list)
for l in sys.stdin:
    who, t, what, x = l.split(); v[(t, what, who)].append(float(x))
for k, xs in sorted(v.items()):
    print(*k, round(st.median(xs), 1), [round(x, 1) for x in xs])
"
