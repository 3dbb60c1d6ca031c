#!/usr/bin/env bash
# Kernel-time breakdown of decode steps on the device machine (build carried in .devbuild/):
# Nsight Compute times every kernel of the 27B-shape decode steps (random weights; setup is
# skipped), and a per-kernel table per step is printed: where a step's time goes, and how much
# of the host-timed step is launch gaps rather than kernels.
#   env: DS_PROFILE_ARGS  bench model arguments (default: --w4a16 --batches 1 --contexts 1024)
#        DS_PROFILE_DETAIL=1  also the full sections of DS_PROFILE_LAUNCHES (default 4) launches of
#                         the kernels matching DS_PROFILE_KERNEL (a regex, default qgemv: a step's
#                         first four GEMVs), after DS_PROFILE_SKIP (default 0) matching launches
#        DS_PROFILE_TIMES=0  skip the per-kernel table (the detail pass alone)
#        DS_PROFILE_SECTIONS  the detail pass's ncu sections (default "--set full"); e.g.
#                         "--section WarpStateStats --section SourceCounters" for the stall reasons
#        DS_PROFILE_REPLAY=application  the detail pass replays the whole run for each of its
#                         passes instead of the kernel (default kernel: ncu runs the kernel again
#                         for each pass, so the passes after the first find its code in the SM's
#                         instruction caches; application replay keeps the step's own order, and
#                         with few sections costs a few runs)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_profile}"
mkdir -p "$OUT"
source tools/gpu_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
TAG=${DS_PROFILE_TAG:-decode}
REPS=2  # timed steps; bench model also runs 2 warm-up steps, all four are profiled
if [ "${DS_PROFILE_TIMES:-1}" != 0 ]; then
# shellcheck disable=SC2086
"$NCU" --clock-control none --cache-control none --profile-from-start off --metrics gpu__time_duration.sum --csv \
  --page raw \
  .devbuild/deltaserve bench model --config configs/qwen3.8-27b.json --synthetic --profile --reps $REPS \
  --verify 0 --prefill 0 ${DS_PROFILE_ARGS:---w4a16 --batches 1 --contexts 1024} \
  > "$OUT/ncu_$TAG.csv" 2> "$OUT/ncu_$TAG.log"
python3 - "$OUT/ncu_$TAG.csv" $((REPS + 2)) <<'PY'
import csv, sys, collections
path, steps = sys.argv[1], int(sys.argv[2])
rows = [l for l in open(path) if l.startswith('"')]
r = list(csv.DictReader(rows))
scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(r[0].get("gpu__time_duration.sum", ""), 1.0) if r else 1.0
tot = collections.defaultdict(float); cnt = collections.Counter()
for x in r:
    try: t = float(x["gpu__time_duration.sum"].replace(",", "")) * scale
    except (KeyError, ValueError): continue
    name = x["Kernel Name"].split("(")[0][:60]
    tot[name] += t; cnt[name] += 1
all_t = sum(tot.values())
print(f"kernels per step: {sum(cnt.values())/steps:.0f}; kernel time per step: {all_t/steps/1e6:.3f} ms")
for n, t in sorted(tot.items(), key=lambda kv: -kv[1])[:25]:
    print(f"{t/steps/1e3:10.1f} us/step {cnt[n]/steps:6.0f} launches  {100*t/all_t:5.1f}%  {n}")
PY
grep -E "^(kind|decode)" "$OUT/ncu_$TAG.csv" | head -3
fi
if [ "${DS_PROFILE_DETAIL:-0}" = 1 ]; then
  # By default the first 4 GEMVs of a step: GDN in_proj (qkv+z), out_proj, MLP gate_up, down; full
  # sections into a report, then its details, its raw warp-stall counters, and the sampled stalls
  # of each SASS instruction (sass_stalls_$TAG.csv; the busiest of each kernel printed).
  # shellcheck disable=SC2086
  "$NCU" --clock-control none --cache-control none --profile-from-start off ${DS_PROFILE_SECTIONS:---set full} \
    --replay-mode "${DS_PROFILE_REPLAY:-kernel}" \
    --kernel-name "regex:${DS_PROFILE_KERNEL:-qgemv}" --launch-skip "${DS_PROFILE_SKIP:-0}" \
    --launch-count "${DS_PROFILE_LAUNCHES:-4}" --import-source no -f -o "$OUT/ncu_detail_$TAG" .devbuild/deltaserve bench model \
    --config configs/qwen3.8-27b.json --synthetic --profile --reps 1 --verify 0 --prefill 0 \
    ${DS_PROFILE_ARGS:---w4a16 --batches 1 --contexts 1024} > "$OUT/ncu_detail_$TAG.log" 2>&1
  "$NCU" -i "$OUT/ncu_detail_$TAG.ncu-rep" --page details > "$OUT/ncu_detail_$TAG.txt" 2>&1
  "$NCU" -i "$OUT/ncu_detail_$TAG.ncu-rep" --page raw --csv > "$OUT/ncu_raw_$TAG.csv" 2>&1
  "$NCU" -i "$OUT/ncu_detail_$TAG.ncu-rep" --page source --csv --print-source sass \
    > "$OUT/sass_stalls_$TAG.csv" 2>&1
  fields="${DS_PROFILE_KERNEL:-qgemv}|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy"
  fields="$fields|Eligible Warps|No Eligible|Warp Cycles Per Issued"
  grep -E "$fields" "$OUT/ncu_detail_$TAG.txt" | head -80
  python3 - "$OUT/ncu_raw_$TAG.csv" "$OUT/sass_stalls_$TAG.csv" <<'PY'
import csv, sys
# Warp stall reasons per GEMV launch (warps stalled per issued instruction), from the raw page.
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
r = list(csv.DictReader(rows))
pre, suf = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
for x in r[1:]:  # r[0]: units
    vals = {}
    for k, v in x.items():
        if k.startswith(pre) and k.endswith(suf):
            try: vals[k[len(pre):-len(suf)]] = float(v.replace(",", ""))
            except ValueError: pass
    top = sorted(vals.items(), key=lambda kv: -kv[1])[:9]
    print("stalls per issue:", x.get("Grid Size", ""), " ".join(f"{k}={v:.2f}" for k, v in top))
# The SASS instructions with the most sampled stalls, in each kernel of the page (a "Kernel Name"
# line, then a table, per kernel).
def num(v):
    try: return float(v.replace(",", ""))
    except ValueError: return 0.0
col = "Warp Stall Sampling (All Samples)"
lines = open(sys.argv[2]).read().splitlines()
starts = [i for i, l in enumerate(lines) if l.startswith('"Kernel Name"')] + [len(lines)]
# (kernel name line, its table) of each kernel with sampled stalls
tables = [(lines[a], list(csv.DictReader(lines[a + 1:b]))) for a, b in zip(starts, starts[1:])]
tables = [(name, t) for name, t in tables if t and col in t[0]]
if not tables:
    print("no sampled stalls in the source page:", " ".join(lines[:2])[:300])
for name, s in tables:
    tot = sum(num(x[col]) for x in s) or 1
    reasons = [c for c in s[0] if c.startswith("stall_") and "Not Issued" not in c]
    share = sorted(((sum(num(x[c]) for x in s) / tot, c[6:]) for c in reasons), reverse=True)[:10]
    print(name[:120])
    print(f"sampled stalls ({len(s)} SASS lines):", " ".join(f"{k}={100 * v:.1f}%" for v, k in share))
    for x in sorted(s, key=lambda x: -num(x[col]))[:30]:
        top = sorted(((num(x[c]), c[6:]) for c in reasons), reverse=True)[:3]
        print(f"{100 * num(x[col]) / tot:5.1f}% {x.get('Address', '')[-5:]} {x.get('Source', '')[:58]:58} "
              f"exec {x.get('Instructions Executed', '')} " + " ".join(f"{k}={100 * v / tot:.1f}" for v, k in top if v))
PY
fi
