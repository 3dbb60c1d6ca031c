#!/usr/bin/env bash
# e2e with the official openai npm client: builds the test model, installs `openai` (npm, into
# the git-ignored build folder), starts two servers on free ports and runs the node tests.
# usage: run_e2e.sh DELTASERVE_BINARY WORK_DIR. Exit 77 (skipped) when node/npm are absent.
set -euo pipefail
bin=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
mkdir -p "$2"; work=$(cd "$2" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
command -v node >/dev/null && command -v npm >/dev/null || { echo "e2e: node/npm not found, skipping" >&2; exit 77; }
mkdir -p "$work"
if [ ! -d "$work/node_modules/openai" ]; then
  (cd "$work" && npm install --no-audit --no-fund --silent --no-save openai@4 >&2)
fi
node "$here/make_test_model.mjs" "$root" "$work/model" >/dev/null

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
start() {  # start LOG ARGS... -> prints the base URL
  local log=$1; shift
  "$bin" serve --model "$work/model" --device cpu --port 0 "$@" >"$log.out" 2>"$log.err" &
  pids+=($!)
  for _ in $(seq 100); do
    if grep -q "listening on" "$log.out" 2>/dev/null; then sed -n 's/^listening on //p' "$log.out"; return; fi
    sleep 0.1
  done
  echo "e2e: server did not start:" >&2; cat "$log.err" >&2; exit 1
}
export BASE_URL=$(start "$work/main" --max-model-len 1024 --max-num-seqs 8)
export LIMITED_URL=$(start "$work/limited" --max-num-seqs 1 --max-waiting 1 --api-key secret --max-body-bytes 2000)
export MODEL=model
cp "$here/openai_e2e.test.mjs" "$work/"  # ES modules resolve `openai` from the file's folder
cd "$work"
node --test --test-concurrency=1 openai_e2e.test.mjs
# bench serve smoke against the same server: every request completes, percentiles present
report=$("$bin" bench serve --url "$BASE_URL" --model model --concurrency 1,4 --num-prompts 4 --input-len 8 --output-len 4 --seed 3 --prompt-vocab 300)
node -e '
const r = JSON.parse(process.argv[1]);
for (const x of r.results) {
  if (x.completed !== 4 || x.total_output_tokens !== 16 || !(x.ttft.p99_ms > 0) || !(x.output_throughput > 0)) {
    console.error("bench serve smoke failed:", JSON.stringify(x)); process.exit(1);
  }
}
console.log("ok - bench serve smoke (C1, C4)");' "$report"
