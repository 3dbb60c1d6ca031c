#!/usr/bin/env bash
# Interleaved decode A/B on the device machine: settings (a build and environment switches) run
# in rounds, every setting once per configuration in each round, each run a process of its own,
# so drift of the machine falls on all settings alike. Prints every setting's rows (decode and
# verify lines of `bench model`) sorted by setting, then the optional kernel timelines, then each
# setting's medians and their differences from the first setting's (tools/ab_table.py).
#   builds: .devbuild/ (tools/gpu_check.sh --pack) and experiment builds .devbuild-alt/REV/
#           (tools/gpu_check.sh --pack-alt REV), carried as tools/gpu_check.sh describes.
#   env: AB_VARS    "NAME:BUILD[:VAR=VALUE[,VAR=VALUE...][:ARG[+ARG...]]] ..."; BUILD "." is
#                   .devbuild, else a directory of .devbuild-alt; ARGs are added to every bench
#                   model call of the setting, e.g. "a8:.::--w4a8+mlp,self_attn" (default: ".:."
#                   only, the plain build)
#        AB_ROUNDS  rounds (default 2)
#        AB_CFGS    bench model arguments of each configuration, ";"-separated (default: batch 1
#                   and 8 at 1k; verify 1 and 8 at 4k)
#        AB_TRACES  "NAME:TOKENS ..." of settings in AB_VARS: a kernel timeline of each
#                   (tools/gpu_trace.sh; TOKENS 1: decode steps at 1k, v1: one-token steps at 4k
#                   (decode, the verify ratio's base), else verify blocks of that many tokens at 4k)
#        AB_TRACE_LINES lines of each timeline's table printed (default 20)
#        DS_TRACE_BY_PREV 1: the timelines' rows also by the kernel before (tools/gpu_trace.sh)
# Logs and the timelines' tables go to $OUT/ab/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
source tools/gpu_env.sh
OUT="${OUT:-/tmp/gpu_ab}"
L="$OUT/ab"
mkdir -p "$L"
: > "$L/summary.txt"
ARGS=(--config configs/qwen3.8-27b.json --synthetic --w4a16 --prefill 0)
IFS=';' read -ra CFGS <<< "${AB_CFGS:---batches 1,8 --contexts 1024 --verify 0;--batches 1 --contexts 4096 --verify 1,8}"

binary_of() {  # BUILD -> its deltaserve
  if [ "$1" = . ]; then echo .devbuild/deltaserve; else echo ".devbuild-alt/$1/deltaserve"; fi
}
setting() {  # SPEC -> name, bin, vars, args (globals)
  IFS=: read -r name build vars args <<< "$1"
  bin=$(binary_of "${build:-.}")
  [ -x "$bin" ] || { echo "gpu_ab: no $bin for setting $name" >&2; return 1; }
}

status=0
for r in $(seq 1 "${AB_ROUNDS:-2}"); do
  for spec in ${AB_VARS:-.:.}; do
    setting "$spec" || { status=1; continue; }
    for i in "${!CFGS[@]}"; do
      log="$L/${name}_r${r}_c$i"
      # shellcheck disable=SC2086
      env ${vars//,/ } "$bin" bench model "${ARGS[@]}" ${CFGS[$i]} ${args//+/ } > "$log.txt" 2> "$log.log" || status=1
      grep -E "^(decode|verify)" "$log.txt" | sed "s/^/$name r$r: /" >> "$L/summary.txt"
    done
  done
done
sort -s -k1,1 "$L/summary.txt" | cut -c1-110

for spec in ${AB_TRACES:-}; do
  IFS=: read -r tname tokens <<< "$spec"
  match=""
  for s in ${AB_VARS:-.:.}; do [ "${s%%:*}" = "$tname" ] && match=$s; done
  if [ -z "$match" ] || ! setting "$match"; then
    echo "gpu_ab: no setting $tname to trace" >&2
    status=1
    continue
  fi
  case "$tokens" in
    1) targs="--batches 1 --contexts 1024 --verify 0"; step_tokens=1 ;;
    v1) targs="--batches 1 --contexts 4096 --verify 0"; step_tokens=1 ;;
    *) targs="--batches 1 --contexts 4096 --verify $tokens"; step_tokens=$tokens ;;
  esac
  # shellcheck disable=SC2086
  env ${vars//,/ } OUT="$L" DS_TRACE_BIN="$bin" DS_TRACE_ARGS="$targs ${args//+/ }" DS_TRACE_TOKENS="$step_tokens" \
    DS_TRACE_TAG="${tname}_t$tokens" tools/gpu_trace.sh > /dev/null 2>&1 || status=1
  echo "== timeline: $tname, $targs"
  head -"${AB_TRACE_LINES:-20}" "$L/trace_${tname}_t$tokens.txt" 2>/dev/null | cut -c1-200
done
echo "== medians"
python3 tools/ab_table.py "$L/summary.txt" || status=1
exit $status
