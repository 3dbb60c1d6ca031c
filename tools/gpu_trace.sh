#!/usr/bin/env bash
# Kernel timeline of decode or verify steps on the device machine (build carried in .devbuild/):
# runs the 27B-shape benchmark (random weights) under the CUPTI tracer (tools/kernel_trace.cpp,
# built into .devbuild/lib by tools/gpu_check.sh --pack) and prints tools/kernel_trace.py's
# per-step table: each kind of launch's share of a step, in place, with the step's other kernels
# overlapping as they do.
#   env: DS_TRACE_BIN   deltaserve to run (default .devbuild/deltaserve)
#        DS_TRACE_ARGS  bench model arguments (default: --batches 1 --contexts 1024 --verify 0)
#        DS_TRACE_TOKENS  only steps of this many tokens (e.g. 8 for --batches 1 --verify 8)
#        DS_TRACE_TAG   name of the CSV and table in $OUT (default decode)
#        DS_TRACE_TIMELINE  "FIRST COUNT": also list those kernels of the middle step
#        DS_TRACE_BY_PREV  1: launches also told apart by the kernel before them (kernel_trace.py
#                          --by-prev: down_proj, out_proj and o_proj share a kernel and grid)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_trace}"
mkdir -p "$OUT"
source tools/gpu_env.sh
LIB="$PWD/.devbuild/lib/libds_kernel_trace.so"
[ -f "$LIB" ] || { echo "no $LIB (tools/gpu_check.sh --pack builds it where CUPTI's headers are)"; exit 1; }
TAG=${DS_TRACE_TAG:-decode}
# shellcheck disable=SC2086
CUDA_INJECTION64_PATH="$LIB" DS_KERNEL_TRACE="$OUT/trace_$TAG.csv" "${DS_TRACE_BIN:-.devbuild/deltaserve}" \
  bench model --config configs/qwen3.8-27b.json --synthetic --w4a16 --prefill 0 \
  ${DS_TRACE_ARGS:---batches 1 --contexts 1024 --verify 0} > "$OUT/trace_$TAG.bench.txt" 2> "$OUT/trace_$TAG.log"
grep -E "^(decode|verify)" "$OUT/trace_$TAG.bench.txt"
# shellcheck disable=SC2086
python3 tools/kernel_trace.py "$OUT/trace_$TAG.csv" ${DS_TRACE_TOKENS:+--tokens $DS_TRACE_TOKENS} \
  $([ "${DS_TRACE_BY_PREV:-0}" = 1 ] && echo --by-prev) ${DS_TRACE_TIMELINE:+--timeline $DS_TRACE_TIMELINE} \
  | tee "$OUT/trace_$TAG.txt"
xz -f "$OUT/trace_$TAG.csv"
