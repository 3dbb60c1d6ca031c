#!/usr/bin/env bash
# GPU check, run on the device machine from the repository root: runs the CUDA op and model
# tests from a build carried in .devbuild/ (made here by `tools/gpu_check.sh --pack`), each test
# in a process of its own (a kernel fault costs that test only, and the first two are re-run
# under compute-sanitizer), then the benchmarks, and prints a short table last. $OUT gets two
# files: table.txt and gpu_check_logs.tgz (every log and JSON result).
#   here:   tools/gpu_check.sh --pack          (builds, copies the GPU binaries to .devbuild/)
#           tools/gpu_check.sh --pack-alt REV [NAME]  (optional, repeatable: builds commit REV
#                                               apart, into .devbuild-alt/NAME/, NAME REV's short
#                                               hash unless given: tools/gpu_ab.sh's BUILD)
#           tools/gpu_check.sh --pack-stamps   (optional: deltaserve with the GEMV block stamps of
#                                               gemv_stamps.cuh, as .devbuild/deltaserve-stamps)
#           tools/gpu_check.sh --tar           (optional: both in .devpack.tar.xz, to carry instead)
#   there:  tools/gpu_check.sh [tests|sweep]   (carry .devbuild [and .devbuild-alt]; default both)
#     tests: the CUDA tests, the decode A/B of the switches and ncu breakdowns; sweep: the full
#     model sweeps
# A device command may run 600 s at most: run the serving benchmark (gpu_serve_bench.sh) and
# the soak (gpu_soak.sh, two calls) as commands of their own.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--pack-alt" ]; then
  # Another commit's binaries (an experiment branch), for the tests phase to run its GEMV tests
  # and decode benchmark beside this tree's: .devbuild-alt/NAME/ (the name the A/B settings give
  # as their build), built in build-alt/REV/ (a tree per commit: git archive gives files the
  # commit's time, which ninja would not see as newer).
  set -e
  rev=$(git rev-parse --short "${2:?usage: tools/gpu_check.sh --pack-alt REV [NAME]}")
  name=${3:-$rev}
  # (a shell name's characters: the tests phase reads DS_ALT_AB_NAME)
  [[ "$name" =~ ^[A-Za-z0-9_]+$ ]] || { echo "--pack-alt: NAME in letters, digits and '_'" >&2; exit 1; }
  rm -rf "build-alt/$rev" && mkdir -p "build-alt/$rev/src"
  git archive "$rev" | tar -x -C "build-alt/$rev/src"
  cmake -S "build-alt/$rev/src" -B "build-alt/$rev/build" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "build-alt/$rev/build" -j"$(nproc)" --target deltaserve test_cuda_ops test_cuda_model
  rm -rf ".devbuild-alt/$name" && mkdir -p ".devbuild-alt/$name"
  cp "build-alt/$rev/build/tests/test_cuda_ops" "build-alt/$rev/build/tests/test_cuda_model" \
    "build-alt/$rev/build/deltaserve" ".devbuild-alt/$name/"
  echo "$rev" > ".devbuild-alt/$name/REV"
  du -sh .devbuild-alt/*
  exit 0
fi

if [ "${1:-}" = "--pack-stamps" ]; then
  # deltaserve with the TMA GEMV's block stamps compiled in (src/backend/cuda/gemv_stamps.cuh), as
  # .devbuild/deltaserve-stamps (after --pack): run it with DS_GEMV_STAMPS_OUT=FILE, then
  # tools/gemv_stamps.py FILE. Built in build-stamps/.
  set -e
  cmake -S . -B build-stamps -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_FLAGS=-DDS_GEMV_STAMPS > /dev/null
  cmake --build build-stamps -j"$(nproc)" --target deltaserve
  mkdir -p .devbuild && cp build-stamps/deltaserve .devbuild/deltaserve-stamps
  exit 0
fi

if [ "${1:-}" = "--tar" ]; then
  # The packed builds in one compressed file, to carry when the repository, .devbuild and
  # .devbuild-alt together exceed the device's 64 MiB carry limit (the tracked tree alone is about
  # 35 MiB); unpacked there on start. Files of one name side by side and xz's 64 MiB dictionary:
  # the builds share most of their bytes (each binary holds every kernel), so main and five
  # alternates packed into 18 MB against 57 MB as a plain tar.xz (s50).
  find .devbuild $([ -d .devbuild-alt ] && echo .devbuild-alt) -type f | awk -F/ '{print $NF "\t" $0}' | sort \
    | cut -f2 | tar cf - -T - | xz -9e -T1 > .devpack.tar.xz
  ls -la .devpack.tar.xz
  exit 0
fi

if [ "${1:-}" = "--pack" ]; then
  set -e
  tools/build.sh
  rm -rf .devbuild && mkdir -p .devbuild
  cp build/tests/test_cuda_ops build/tests/test_cuda_model build/deltaserve .devbuild/
  # Shared libraries the device image may lack (everything but glibc, libstdc++ and CUDA's own).
  mkdir -p .devbuild/lib
  ldd build/deltaserve | awk '/=> \//{print $3}' | grep -vE 'libc\.so|libm\.so|libstdc|libgcc|libpthread|libdl|librt|cublas|cuda' \
    | xargs -r -I{} cp -L {} .devbuild/lib/
  # The kernel timeline tracer (tools/kernel_trace.cpp) and the CUPTI it needs.
  CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
  if [ -f "$CUDA_HOME/include/cupti.h" ]; then
    g++ -std=c++17 -O2 -Wall -Wextra -shared -fPIC tools/kernel_trace.cpp -I"$CUDA_HOME/include" \
      -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib" -lcupti -o .devbuild/lib/libds_kernel_trace.so
    cp -L "$(ldd .devbuild/lib/libds_kernel_trace.so | awk '/libcupti/{print $3}')" .devbuild/lib/
  fi
  du -sh .devbuild
  exit 0
fi

[ -f .devpack.tar.xz ] && [ ! -d .devbuild ] && tar xJf .devpack.tar.xz
OUT="${OUT:-/tmp/gpu_check}"
LOG=/tmp/gpu_check_logs  # everything, packed into $OUT at the end (few files come back)
rm -rf "$LOG" && mkdir -p "$OUT" "$LOG/tests"
source tools/gpu_env.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem --format=csv > "$LOG/gpu.txt" 2>&1
SANITIZER=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)

PHASE="${1:-all}"
status=0
sanitized=0
# env DS_DEADLINE=S: no benchmark starts after S seconds (the table still gets written).
over() { [ "$SECONDS" -ge "${DS_DEADLINE:-1000000}" ] && echo "skipped after ${SECONDS}s: $*" >> "$LOG/skipped.txt"; }
run_tests() {  # BINARY: each test in its own process, its log appended to $LOG/BINARY.log
  local bin=$1 t f rc
  : > "$LOG/$bin.log"
  for t in $(.devbuild/"$bin" --gtest_list_tests | awk '/^[^ ]/ { suite = $1 } /^  / { print suite $1 }'); do
    f="$LOG/tests/$bin.$(echo "$t" | tr '/' '_')"
    timeout "${DS_TEST_TIMEOUT:-120}" .devbuild/"$bin" --gtest_filter="$t" --gtest_output=json:"$f.json" > "$f.log" 2>&1
    rc=$?
    cat "$f.log" >> "$LOG/$bin.log"
    [ $rc -eq 0 ] && continue
    status=1
    echo "$bin $t: exit $rc" >> "$LOG/failed.txt"
    if [ $rc -gt 1 ] && [ -n "$SANITIZER" ] && [ "$sanitized" -lt 2 ]; then  # a crash, not a failed expectation
      sanitized=$((sanitized + 1))  # the first two only: a common fault would spend the call on them
      timeout 240 "$SANITIZER" --print-limit 5 .devbuild/"$bin" --gtest_filter="$t" > "$f.sanitizer.log" 2>&1
    fi
  done
}
if [ "$PHASE" != sweep ]; then
  for b in test_cuda_ops test_cuda_model; do run_tests "$b"; done
fi

# The 27B-shape model benchmark (random weights), beside the rooflines measured in the same run.
# env: DS_SKIP_BENCH=1 skips it (and the A/B); DS_BENCH=w4a16 runs only the W4A16 sweep.
BENCH=(.devbuild/deltaserve bench model --config configs/qwen3.8-27b.json --synthetic)
if [ "${DS_SKIP_BENCH:-0}" != 1 ] && [ "$PHASE" != sweep ]; then
  # Decode A/B, one process per setting NAME[:VAR=VALUE[,VAR=VALUE...]] (the defaults, then each
  # switch), batch 1, 8 and 64 at 1k and verify 1/8 at 4k. env: DS_AB overrides the list;
  # DS_AB=none skips it.
  AB="default regs:DS_W4A16_GEMV=regs"
  AB="$AB noxsmem:DS_W4A16_X_SMEM=0 nof16:DS_W4A16_F16=0 nopdl:DS_PDL=0"
  AB="$AB unfused:DS_FUSE_LINEARS=0 nographs:DS_CUDA_GRAPHS=0"
  AB="$AB nowide:DS_W4A16_WIDE=0 nowgmma:DS_W4A16_WGMMA=0 tok32:DS_W4A16_GEMV_MAX_TOKENS=32"
  AB="${DS_AB:-$AB}"
  [ "$AB" = none ] && AB=""
  for cfg in $AB; do
    over "ab $cfg" && continue
    name=${cfg%%:*}; vars=""
    [ "$name" != "$cfg" ] && vars=${cfg#*:}
    # shellcheck disable=SC2086
    env ${vars//,/ } "${BENCH[@]}" --w4a16 --batches 1,8,64 --contexts 1024 --verify 1,8 --prefill 0 \
      > "$LOG/ab_$name.txt" 2> "$LOG/ab_$name.log" || status=1
  done
  # The SASS of this build's GEMVs (instruction counts of their loops: read with any script).
  CUOBJDUMP=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null || true)
  [ -n "$CUOBJDUMP" ] && "$CUOBJDUMP" -sass .devbuild/deltaserve 2>/dev/null \
    | awk '/Function : /{keep = /qgemv/} keep' > "$LOG/sass_qgemv.txt"
  # Experiment builds (--pack-alt): their GEMV and GDN tests and timings, their model tests (a change
  # to the model's path shows there, not in the op tests, which build their own inputs), their decode
  # at 1k (once per setting in DS_ALT_AB_<NAME>, else DS_ALT_AB, NAME:VAR=VALUE[,...], default one
  # run), and the SASS of their GEMVs.
  for dir in .devbuild-alt/*/; do
    [ -x "$dir/deltaserve" ] || continue
    alt=$(basename "$dir")
    over "alt $alt" && continue
    settings="DS_ALT_AB_$alt"
    if [ "${DS_ALT_TESTS:-1}" != 0 ]; then  # env DS_ALT_TESTS=0: their decode only
      timeout 300 "$dir/test_cuda_ops" --gtest_filter='CudaLinearQuantTest.*' > "$LOG/alt_$alt.log" 2>&1 || {
        status=1; echo "alt $alt: CudaLinearQuantTest failed" >> "$LOG/failed.txt"; }
      # The GDN kernels' tests too (the producers of out_proj's input).
      timeout 200 "$dir/test_cuda_ops" --gtest_filter='CudaOpsTest.*Gdn*' > "$LOG/alt_${alt}_gdn.log" 2>&1 || {
        status=1; echo "alt $alt: CudaOpsTest.*Gdn* failed" >> "$LOG/failed.txt"; }
      if [ -x "$dir/test_cuda_model" ]; then
        DS_TEST_DATA_DIR="$PWD/tests/data" timeout 300 "$dir/test_cuda_model" > "$LOG/alt_${alt}_model.log" 2>&1 || {
          status=1; echo "alt $alt: test_cuda_model failed" >> "$LOG/failed.txt"; }
      fi
    fi
    for cfg in ${!settings:-${DS_ALT_AB:-default}}; do
      over "alt $alt $cfg" && continue
      name=${cfg%%:*}; vars=""
      [ "$name" != "$cfg" ] && vars=${cfg#*:}
      # shellcheck disable=SC2086
      env ${vars//,/ } "$dir/deltaserve" bench model --config configs/qwen3.8-27b.json --synthetic --w4a16 \
        --batches 1,8,64 --contexts 1024 --verify 1,8 --prefill 0 > "$LOG/ab_alt_${alt}_$name.txt" \
        2> "$LOG/ab_alt_${alt}_$name.log" || status=1
    done
    [ -n "$CUOBJDUMP" ] && "$CUOBJDUMP" -sass "$dir/deltaserve" 2>/dev/null \
      | awk '/Function : /{keep = /qgemv/} keep' > "$LOG/sass_qgemv_$alt.txt"
  done
  # Decode attention A/B: the split-KV CUDA-core kernel (DS_ATTN_DECODE=simt) or the tensor-core
  # kernel with the GQA heads packed (default), batch 1 and 64 at 1k and 16k, verify 1/8 at 4k.
  # env DS_ATTN_AB overrides the list (none: skipped).
  for attn in ${DS_ATTN_AB:-simt tc}; do
    [ "$attn" = none ] && continue
    over "attention $attn" && continue
    DS_ATTN_DECODE=$attn "${BENCH[@]}" --w4a16 --batches 1,64 --contexts 1024,16384 --verify 1,8 --prefill 0 \
      > "$LOG/ab_attn_$attn.txt" 2> "$LOG/ab_attn_$attn.log" || status=1
  done
  # Where a step's time goes: kernel breakdowns of decode steps, NAME:BATCH:CONTEXT (the first
  # with the full sections of its first GEMVs). env: DS_PROFILES overrides the list (none: skipped).
  detail=1
  for p in ${DS_PROFILES:-b1:1:1024 b1_16k:1:16384 b64:64:1024}; do
    [ "$p" = none ] && continue
    over "profile $p" && continue
    IFS=: read -r tag batch ctx <<< "$p"
    OUT="$LOG" DS_PROFILE_DETAIL=$detail DS_PROFILE_TAG=$tag DS_PROFILE_ARGS="--w4a16 --batches $batch --contexts $ctx" \
      tools/gpu_profile.sh > "$LOG/profile_$tag.txt" 2>&1
    detail=0
  done
  # Where a step's time goes in place: kernel timelines (tools/gpu_trace.sh), NAME:BATCH:VERIFY
  # (VERIFY 0: decode steps at 1k; else verify blocks of that many tokens). env DS_TRACES
  # overrides the list (none: skipped).
  for p in ${DS_TRACES:-b1:1:0 v8:1:8}; do
    [ "$p" = none ] && continue
    over "trace $p" && continue
    IFS=: read -r tag batch verify <<< "$p"
    tokens=$batch; [ "$verify" != 0 ] && tokens=$verify
    OUT="$LOG" DS_TRACE_TAG="$tag" DS_TRACE_TOKENS="$tokens" \
      DS_TRACE_ARGS="--batches $batch --contexts 1024 --verify $verify" tools/gpu_trace.sh > /dev/null 2>&1
  done
fi
if [ "${DS_SKIP_BENCH:-0}" != 1 ] && [ "$PHASE" != tests ] && ! over sweep; then
  KV=($(table_kv_args))  # gpu_env.sh: the cap an 80 GB card needs
  "${BENCH[@]}" --w4a16 "${KV[@]}" --prefill 1024,4096,16384,51200 --json "$LOG/bench_model_w4a16.jsonl" \
    > "$LOG/bench_model_w4a16.txt" 2> "$LOG/bench_model_w4a16.log" || status=1
  if [ "${DS_BENCH:-all}" != w4a16 ]; then
    "${BENCH[@]}" --batches 1,64 --contexts 1024 --verify 1,8 --prefill 4096 --json "$LOG/bench_model.jsonl" \
      > "$LOG/bench_model.txt" 2> "$LOG/bench_model.log" || status=1
  fi
fi

table() {
echo "== figures =="
grep -h "\[figure\]" "$LOG"/test_cuda_ops.log "$LOG"/test_cuda_model.log 2>/dev/null | sed 's/^\[figure\] //'
echo "== tests (one process each; crashes re-run under compute-sanitizer) =="
python3 - "$LOG/tests" <<'PY'
import glob, json, os, sys
results = {}
for p in sorted(glob.glob(os.path.join(sys.argv[1], "*.log"))):
    if p.endswith(".sanitizer.log"): continue
    stem = p[:-4]
    binary = os.path.basename(stem).split(".")[0]
    name = os.path.basename(stem)[len(binary) + 1:]
    res = "CRASH"
    if os.path.exists(stem + ".json"):
        j = json.load(open(stem + ".json"))
        cases = [t for s in j.get("testsuites", []) for t in s.get("testsuite", [])]
        res = "FAIL" if any(t.get("failures") for t in cases) else \
              "skip" if cases and all(t.get("result") == "SKIPPED" for t in cases) else "ok"
    results.setdefault(binary, []).append((res, name))
for binary, rs in results.items():
    for res, name in rs:
        if res in ("FAIL", "CRASH"): print(f"{res:5} {binary} {name}")
    counts = {k: sum(1 for r, _ in rs if r == k) for k in ("ok", "FAIL", "CRASH", "skip")}
    print(f"{binary}: {len(rs)} tests: " + ", ".join(f"{v} {k}" for k, v in counts.items()))
PY
for f in "$LOG"/tests/*.sanitizer.log; do
  [ -e "$f" ] || continue
  echo "-- $(basename "$f")"; grep -m 8 -E "Invalid|Error|at 0x|by thread|in .*\.cu" "$f"
done
echo "== bench model (27B shape, bf16 weights, synthetic) =="
cat "$LOG/bench_model.txt" 2>/dev/null; tail -3 "$LOG/bench_model.log" 2>/dev/null
echo "== decode A/B (27B shape, W4A16): the defaults, then each switch (DS_AB); attention simt/tc =="
for f in "$LOG"/ab_*.txt; do
  [ -e "$f" ] || continue
  echo "-- $(basename "$f" .txt | sed 's/^ab_//')"; grep -E "^(decode|verify)" "$f"; tail -1 "${f%.txt}.log"
done
for f in "$LOG"/alt_*.log; do
  [ -e "$f" ] || continue
  echo "== experiment build $(basename "$f" .log | sed 's/^alt_//'): tests (GEMV, _gdn, _model) and step sums =="
  grep -E "^\[  (PASSED|FAILED)|decode-step linears|int8 lm_head" "$f"
done
[ -f "$LOG/skipped.txt" ] && { echo "== skipped (DS_DEADLINE) =="; cat "$LOG/skipped.txt"; }
echo "== kernel time per decode step (Nsight Compute, caches not flushed) =="
for f in "$LOG"/profile_*.txt; do [ -e "$f" ] && { echo "-- $(basename "$f" .txt)"; cat "$f"; }; done
echo "== kernel timelines: a launch's share of the step, in place (tools/gpu_trace.sh) =="
for f in "$LOG"/trace_*.txt; do
  case "$f" in *.bench.txt) continue ;; esac
  [ -e "$f" ] && { echo "-- $(basename "$f" .txt)"; head -16 "$f"; }
done
echo "== bench model (27B shape, W4A16 linears, synthetic) =="
cat "$LOG/bench_model_w4a16.txt" 2>/dev/null; tail -3 "$LOG/bench_model_w4a16.log" 2>/dev/null
cat "$LOG/gpu.txt"
}
table | tee "$OUT/table.txt"
tar czf "$OUT/gpu_check_logs.tgz" -C "$LOG" .
exit $status
