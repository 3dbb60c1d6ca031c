#!/usr/bin/env bash
# The whole test suite: install packages, build, run every test with ctest. A run in which
# no test executed is a failure.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
[ ! -x tools/fetch_test_data.sh ] || tools/fetch_test_data.sh
tools/build.sh -DDS_FATAL_WARNINGS=ON
cd build
set +e
ctest --output-on-failure -j"$(nproc)" 2>&1 | tee ctest.log
rc=${PIPESTATUS[0]}
set -e
if grep -q "No tests were found" ctest.log || ! grep -qE "tests passed|tests failed" ctest.log; then
  echo "test.sh: no tests ran" >&2
  exit 1
fi
exit "$rc"
