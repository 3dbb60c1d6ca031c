#!/usr/bin/env bash
# GPU check, run on the device machine from the repository root: runs the CUDA op and model
# tests from a build carried in .devbuild/ (made here by `tools/gpu_check.sh --pack`), keeps
# full logs under $OUT, and prints a short table last.
#   here:   tools/gpu_check.sh --pack          (builds, copies the GPU binaries to .devbuild/)
#   there:  tools/gpu_check.sh [tests|sweep]   (carry .devbuild; default both)
#     tests: the CUDA tests and the decode A/B of the GEMV settings; sweep: the full model sweeps
# A device command may run 600 s at most: run the serving benchmark (gpu_serve_bench.sh) and
# the soak (gpu_soak.sh, two calls) as commands of their own.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--pack" ]; then
  set -e
  tools/build.sh
  rm -rf .devbuild && mkdir -p .devbuild
  cp build/tests/test_cuda_ops build/tests/test_cuda_model build/deltaserve .devbuild/
  # Shared libraries the device image may lack (everything but glibc, libstdc++ and CUDA's own).
  mkdir -p .devbuild/lib
  ldd build/deltaserve | awk '/=> \//{print $3}' | grep -vE 'libc\.so|libm\.so|libstdc|libgcc|libpthread|libdl|librt|cublas|cuda' \
    | xargs -r -I{} cp -L {} .devbuild/lib/
  du -sh .devbuild
  exit 0
fi

OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
source tools/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1

PHASE="${1:-all}"
status=0
if [ "$PHASE" != sweep ]; then
  for t in test_cuda_ops test_cuda_model; do
    .devbuild/$t --gtest_output=json:"$OUT/$t.json" > "$OUT/$t.log" 2>&1 || status=1
  done
fi

# The 27B-shape model benchmark (random weights), beside the rooflines measured in the same run.
# env: DS_SKIP_BENCH=1 skips it (and the A/B); DS_BENCH=w4a16 runs only the W4A16 sweep.
BENCH=(.devbuild/deltaserve bench model --config configs/qwen3.8-27b.json --synthetic)
if [ "${DS_SKIP_BENCH:-0}" != 1 ] && [ "$PHASE" != sweep ]; then
  # Decode A/B, one process per setting name:DS_W4A16_GEMV_LOOP:DS_PDL:DS_FUSE_LINEARS:DS_W4A16_GEMV_MAX_TOKENS,
  # batch 1, 8 and 64 at 1k. env: DS_AB overrides the list; DS_AB=none skips it.
  AB="${DS_AB:-regs:regs:0:1:32 async4:async4:0:1:32 async8:async8:0:1:32 async4+pdl:async4:1:1:32 regs+pdl:regs:1:1:32 unfused:regs:0:0:32 tok64:regs:0:1:64}"
  [ "$AB" = none ] && AB=""
  for cfg in $AB; do
    IFS=: read -r name loop pdl fuse tokens <<< "$cfg"
    DS_W4A16_GEMV_LOOP=$loop DS_PDL=$pdl DS_FUSE_LINEARS=$fuse DS_W4A16_GEMV_MAX_TOKENS=$tokens "${BENCH[@]}" --w4a16 \
      --batches 1,8,64 --contexts 1024 --verify 0 --prefill 0 > "$OUT/ab_$name.txt" 2> "$OUT/ab_$name.log" || status=1
  done
fi
if [ "${DS_SKIP_BENCH:-0}" != 1 ] && [ "$PHASE" != tests ]; then
  "${BENCH[@]}" --w4a16 --prefill 1024,4096,16384,51200 --json "$OUT/bench_model_w4a16.jsonl" \
    > "$OUT/bench_model_w4a16.txt" 2> "$OUT/bench_model_w4a16.log" || status=1
  # Batch-1 decode with step graphs off: what the graphs save.
  DS_CUDA_GRAPHS=0 "${BENCH[@]}" --w4a16 --batches 1 --contexts 1024 --verify 0 --prefill 0 \
    > "$OUT/bench_model_w4a16_nographs.txt" 2> "$OUT/bench_model_w4a16_nographs.log" || status=1
  if [ "${DS_BENCH:-all}" != w4a16 ]; then
    "${BENCH[@]}" --batches 1,64 --contexts 1024 --verify 1,8 --prefill 4096 --json "$OUT/bench_model.jsonl" \
      > "$OUT/bench_model.txt" 2> "$OUT/bench_model.log" || status=1
  fi
fi

echo "== figures =="
grep -h "\[figure\]" "$OUT"/test_cuda_ops.log "$OUT"/test_cuda_model.log 2>/dev/null | sed 's/^\[figure\] //'
echo "== op errors (relative RMS vs the CPU twin) =="
python3 - "$OUT" <<'PY'
import json, sys, os
out = sys.argv[1]
for name in ("test_cuda_ops", "test_cuda_model"):
    p = os.path.join(out, name + ".json")
    if not os.path.exists(p):
        print(f"{name}: no result file"); continue
    j = json.load(open(p))
    for suite in j.get("testsuites", []):
        for t in suite.get("testsuite", []):
            props = {k: v for k, v in t.items() if k not in ("name", "file", "line", "status", "result", "timestamp", "time", "classname", "failures", "value_param", "type_param")}
            ok = "FAIL" if t.get("failures") else "ok"
            extra = " ".join(f"{k}={float(v):.2e}" for k, v in props.items() if v.replace('.','',1).replace('e-','',1).isdigit())
            print(f"{ok:4} {suite['name']}.{t['name']} {extra}")
    print(f"{name}: {j.get('tests')} tests, {j.get('failures')} failures")
PY
echo "== bench model (27B shape, bf16 weights, synthetic) =="
cat "$OUT/bench_model.txt" 2>/dev/null; tail -3 "$OUT/bench_model.log" 2>/dev/null
echo "== decode A/B (27B shape, W4A16, 1k context): GEMV loop, PDL, fused linears =="
for f in "$OUT"/ab_*.txt; do
  [ -e "$f" ] || continue
  echo "-- $(basename "$f" .txt | sed 's/^ab_//')"; grep -E "^decode" "$f"; tail -1 "${f%.txt}.log"
done
echo "== bench model (27B shape, W4A16 linears, synthetic): step graphs off =="
grep -E "^decode" "$OUT/bench_model_w4a16_nographs.txt" 2>/dev/null; tail -3 "$OUT/bench_model_w4a16_nographs.log" 2>/dev/null
echo "== bench model (27B shape, W4A16 linears, synthetic) =="
cat "$OUT/bench_model_w4a16.txt" 2>/dev/null; tail -3 "$OUT/bench_model_w4a16.log" 2>/dev/null
cat "$OUT/gpu.txt"
exit $status
