#!/usr/bin/env bash
# Serving benchmark on the device machine (from a build carried in .devbuild/, see
# tools/gpu_check.sh): starts `deltaserve serve` on random weights of the 27B shape, prints its
# memory report, runs `bench serve` at concurrency 1, 8 and 64 with token-id prompts, and
# packs the logs and JSON reports into $OUT/serve_logs.tgz (few files come back from $OUT).
#   env: DS_SERVE_ARGS   extra serve arguments (default: --w4a16 --gpu-memory 40)
#        DS_INPUT_LEN / DS_OUTPUT_LEN   prompt and completion tokens (default 512 / 128)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_serve}"
LOG=/tmp/gpu_serve_logs
rm -rf "$LOG" && mkdir -p "$OUT" "$LOG"
source tools/gpu_env.sh
BIN=.devbuild/deltaserve
CONFIG=configs/qwen3.8-27b.json
IN=${DS_INPUT_LEN:-512}
OUTLEN=${DS_OUTPUT_LEN:-128}
VOCAB=$(python3 -c "import json; c=json.load(open('$CONFIG')); print(c.get('text_config', c)['vocab_size'])")

# shellcheck disable=SC2086
$BIN serve --config $CONFIG --synthetic --device cuda --port 0 --max-num-seqs 64 ${DS_SERVE_ARGS:---w4a16 --gpu-memory 40} \
  > "$LOG/serve.out" 2> "$LOG/serve.log" &
SERVER=$!
for _ in $(seq 1 300); do
  grep -q "listening on" "$LOG/serve.out" 2>/dev/null && break
  kill -0 $SERVER 2>/dev/null || { echo "serve exited:"; tail -20 "$LOG/serve.log"; tar czf "$OUT/serve_logs.tgz" -C "$LOG" .; exit 1; }
  sleep 1
done
URL=$(sed -n 's/^listening on //p' "$LOG/serve.out" | head -1)
MODEL=$(curl -s "$URL/v1/models" | python3 -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
echo "== memory report =="
grep -i -E "memory|weights|kv|slots" "$LOG/serve.log" | head -12
status=0
for spec in 1:8 8:32 64:192; do
  c=${spec%%:*}; n=${spec##*:}
  $BIN bench serve --url "$URL" --model "$MODEL" --concurrency "$c" --num-prompts "$n" --input-len "$IN" \
    --output-len "$OUTLEN" --prompt-vocab "$VOCAB" --seed 7 --out "$LOG/bench_serve_c$c.json" \
    > "$LOG/bench_serve_c$c.txt" 2>&1 || status=1
done
curl -s "$URL/metrics" > "$LOG/metrics.txt"
kill -INT $SERVER; wait $SERVER
echo "== bench serve (27B shape, synthetic, input $IN, output $OUTLEN) =="
cat "$LOG"/bench_serve_c1.txt "$LOG"/bench_serve_c8.txt "$LOG"/bench_serve_c64.txt
tar czf "$OUT/serve_logs.tgz" -C "$LOG" .
exit $status
