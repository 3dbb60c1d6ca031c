#!/usr/bin/env bash
# One device call of a session, run on the device machine from the repository root, every step
# held to what is left of LIMIT seconds: the issue's table (on an H200 only), main's GEMV and
# model tests, a figures test, the experiment builds' GEMV and model tests, then an interleaved
# A/B (tools/gpu_ab.sh). The lighter sibling of tools/gpu_check.sh, for calls that must fit the
# device's 600 s and a session's 1,800. Builds carried as tools/gpu_check.sh describes (--pack,
# --pack-alt REV NAME, --tar: carry .devpack.tar.xz).
#   env: LIMIT          seconds for the whole call (default 400; give run's timeout_s some more)
#        SKIP_TABLE, SKIP_OPS, SKIP_MAIN_MODEL, SKIP_AB   set: that step left out
#        PROBE_FILTER   a gtest filter of main's test_cuda_ops to run for its [figure] lines
#                       (e.g. '*StreamingFromL2*')
#        ALT_TESTS      names of .devbuild-alt builds whose GEMV and model tests to run
#        AB_VARS, AB_ROUNDS, AB_CFGS, AB_TRACES   as tools/gpu_ab.sh takes them
# Logs go to /tmp/gpu_session_logs, packed into $OUT/gpu_session_logs.tgz; the table's figures,
# the A/B's medians, the probe's figures and any failures print last.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
SECONDS=0
LIMIT=${LIMIT:-400}
OUT="${OUT:-/tmp/gpu_session}"
[ -d .devbuild ] || tar xJf .devpack.tar.xz
source tools/gpu_env.sh
L=/tmp/gpu_session_logs
rm -rf "$L" && mkdir -p "$L" "$OUT"
left() { echo $((LIMIT - SECONDS > 1 ? LIMIT - SECONDS : 1)); }
passed() { grep -E '^\[  (PASSED|FAILED)' "$1" | tr '\n' ' '; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > "$L/gpu.txt" 2>&1
cat "$L/gpu.txt"

# The main build's GEMV tests (the W4A16 kernels and their fused forms) and the experiments' (the
# same less the deferred norm's and SwiGLU's, which experiments have not touched).
GEMV_TESTS='*KSlice*:*DeferredNorm*:*Unsplit*:*Parts*:*Swiglu*:*W4A16*:*Gemv*'
ALT_GEMV_TESTS='*KSlice*:*Unsplit*:*Parts*:*W4A16*:*Gemv*'
if [ -z "${SKIP_TABLE:-}" ]; then
  OUT=$L/table DS_TABLE_ONLY_ON=H200 timeout "$(left)" tools/gpu_table.sh > "$L/table.out" 2>&1
  echo "table: exit $?"
fi
if [ -z "${SKIP_OPS:-}" ]; then
  timeout "$(left)" .devbuild/test_cuda_ops --gtest_filter="$GEMV_TESTS" > "$L/ops_main.txt" 2>&1
  echo "GEMV tests, main: exit $? $(passed "$L/ops_main.txt")"
fi
if [ -z "${SKIP_MAIN_MODEL:-}" ]; then
  timeout "$(left)" .devbuild/test_cuda_model > "$L/model_main.txt" 2>&1
  echo "model tests, main: exit $? $(passed "$L/model_main.txt")"
fi
if [ -n "${PROBE_FILTER:-}" ]; then
  timeout "$(left)" .devbuild/test_cuda_ops --gtest_filter="$PROBE_FILTER" > "$L/probe.txt" 2>&1
  echo "probe: exit $?"
fi
for a in ${ALT_TESTS:-}; do
  timeout "$(left)" ".devbuild-alt/$a/test_cuda_ops" --gtest_filter="$ALT_GEMV_TESTS" > "$L/ops_$a.txt" 2>&1
  echo "GEMV tests, $a: exit $? $(passed "$L/ops_$a.txt")"
  timeout "$(left)" ".devbuild-alt/$a/test_cuda_model" > "$L/model_$a.txt" 2>&1
  echo "model tests, $a: exit $? $(passed "$L/model_$a.txt")"
done
if [ -z "${SKIP_AB:-}" ]; then
  OUT=$L timeout "$(left)" tools/gpu_ab.sh > "$L/ab.out" 2>&1
  echo "A/B: exit $?"
fi
tar czf "$OUT/gpu_session_logs.tgz" -C /tmp gpu_session_logs
echo "=== table"; tail -25 "$L/table.out" 2>/dev/null
echo "=== A/B"; tail -60 "$L/ab.out" 2>/dev/null
echo "=== probe"; grep -h '\[figure\]' "$L/probe.txt" 2>/dev/null | head -40
echo "=== failures"; grep -h 'FAILED\|Failure' "$L"/ops_*.txt "$L"/model_*.txt 2>/dev/null | head -20
echo "elapsed ${SECONDS} s"
