#!/usr/bin/env bash
# The issue's table alone, run on the device machine from the repository root with a build carried
# as .devbuild/ or .devpack.tar.xz (here: tools/gpu_check.sh --pack, then --tar): `bench model` over
# the issue's figures (a card under 100 GB skips the decode pairs above 524,288 KV tokens), then
# three rounds of C1 at 1k and verify 1 / 8 at 4k, 200 steps a figure, each a process of its own.
# env: DS_TABLE_ONLY_ON=NAME stops at once (exit 3) unless the GPU's name holds NAME (e.g. H200);
#      DS_TABLE_ENERGY=1 adds C1 over 1,000 steps as built, with the L2 window (DS_W4A16_L2_WEIGHTS=1,
#      wrong results) and with bf16 codes (DS_W4A16_F16=0): what a step's joules are made of.
# $OUT gets table.txt, table.jsonl and table_logs.tgz; the figures (ms, clock, power) print last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
command -v nvidia-smi > /dev/null || { echo "gpu_table.sh: no nvidia-smi, no GPU" >&2; exit 2; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [ -n "${DS_TABLE_ONLY_ON:-}" ] && [[ "$gpu" != *"$DS_TABLE_ONLY_ON"* ]]; then
  echo "not on $DS_TABLE_ONLY_ON: $gpu"; exit 3
fi
[ -f .devpack.tar.xz ] && [ ! -d .devbuild ] && tar xJf .devpack.tar.xz
source tools/gpu_env.sh
OUT="${OUT:-/tmp/gpu_table}"
LOG=/tmp/gpu_table_logs
rm -rf "$LOG" && mkdir -p "$OUT" "$LOG"
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv > "$LOG/gpu.txt" 2>&1
BENCH=(.devbuild/deltaserve bench model --config configs/qwen3.8-27b.json --synthetic --w4a16)
KV=($(table_kv_args))  # gpu_env.sh
status=0
"${BENCH[@]}" "${KV[@]}" --prefill 1024,4096,16384,51200 --json "$LOG/table.jsonl" > "$LOG/table.txt" \
  2> "$LOG/table.log" || status=1
cp "$LOG/table.txt" "$LOG/table.jsonl" "$OUT/" 2>/dev/null
for r in 1 2 3; do
  "${BENCH[@]}" --batches 1 --contexts 1024 --verify 1,8 --prefill 0 --reps 200 > "$LOG/round$r.txt" \
    2> "$LOG/round$r.log" || status=1
done
if [ "${DS_TABLE_ENERGY:-0}" = 1 ]; then
  for setting in built DS_W4A16_L2_WEIGHTS=1 DS_W4A16_F16=0; do
    vars=(); [[ "$setting" == *=* ]] && vars=("$setting")
    env "${vars[@]}" "${BENCH[@]}" --batches 1 --contexts 1024 --verify 0 --prefill 0 --reps 1000 \
      > "$LOG/energy_${setting%%=*}.txt" 2> "$LOG/energy_${setting%%=*}.log" || status=1
  done
fi
tar czf "$OUT/table_logs.tgz" -C "$LOG" .
for f in "$LOG"/table.txt "$LOG"/round*.txt "$LOG"/energy_*.txt; do
  [ -e "$f" ] || continue
  echo "-- $(basename "$f" .txt)"; grep -E "^(# ceilings|kind|decode|verify|prefill)" "$f"
done
tail -2 "$LOG/table.log"
cat "$LOG/gpu.txt"
exit $status
