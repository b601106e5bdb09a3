#!/usr/bin/env bash
# Compares two coli binaries output for output: `coli run --json` ids (greedy, and with a
# one-slot expert cache) and `coli eval --logits-out` bytes, on every oracle fixture and
# the demo model. Used to show a refactor changed no bit.
#   bash bench/compare_builds.sh OLD_COLI NEW_COLI
set -euo pipefail
old=$1 new=$2
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
demo=${COLI_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/coli}/models
same=0 differ=0
for dir in "$root"/tests/fixtures/*/ "$demo"/*/; do
  [ -f "$dir/config.json" ] || continue
  name=$(basename "$dir")
  for extra in "" "--cap 1"; do
    a=$("$old" run --model "$dir" --prompt-ids 1,2,3,4,5 --max-tokens 12 --json --no-usage $extra 2>/dev/null | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["generated_ids"])')
    b=$("$new" run --model "$dir" --prompt-ids 1,2,3,4,5 --max-tokens 12 --json --no-usage $extra 2>/dev/null | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["generated_ids"])')
    if [ -n "$a" ] && [ "$a" = "$b" ]; then same=$((same+1)); else differ=$((differ+1)); echo "DIFFER run $name $extra: $a vs $b"; fi
  done
  rm -f "$tmp/a" "$tmp/b"
  "$old" eval --model "$dir" --ids 1,2,3,4,5,6,7,8 --logits-out "$tmp/a" --no-usage >/dev/null 2>&1
  "$new" eval --model "$dir" --ids 1,2,3,4,5,6,7,8 --logits-out "$tmp/b" --no-usage >/dev/null 2>&1
  if cmp -s "$tmp/a" "$tmp/b"; then same=$((same+1)); else differ=$((differ+1)); echo "DIFFER eval logits $name"; fi
done
echo "compare_builds: $same identical, $differ different"
[ "$differ" -eq 0 ]
