#!/usr/bin/env bash
# Greedy completion of a text prompt with the bundled demo model: tokenize -> generate -> detokenize.
# Usage: tools/demo.sh [PROMPT] [MAX_TOKENS]   (printf escapes such as \n are expanded in PROMPT)
# Env: DS_BIN (default build/deltaserve), DS_MODEL (default models/qwen3_5-demo; `generate`
# itself falls back to the same bundled model when neither --model nor DS_MODEL is given).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${DS_BIN:-$root/build/deltaserve}"
export DS_MODEL="${DS_MODEL:-$root/models/qwen3_5-demo}"
prompt="${1:-def add(a, b):\n    \"\"\"Return the sum of a and b.\"\"\"\n}"
max_tokens="${2:-48}"
tmp="$(mktemp)"
trap 'rm -f "$tmp"' EXIT
printf "$prompt" >"$tmp"  # a file keeps trailing newlines that $(...) would strip
ids="$("$bin" tokenize --model "$DS_MODEL" --file "$tmp" | tr -d '[] ')"
out="$("$bin" generate --ids "$ids" --max-tokens "$max_tokens" | tail -n 1 | tr -d '[] ')"
"$bin" detokenize --model "$DS_MODEL" --ids "$ids${out:+,$out}"
echo
