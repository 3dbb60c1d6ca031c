#!/usr/bin/env bash
# Kernel-time breakdown of decode steps on the device machine (build carried in .devbuild/):
# Nsight Compute times every kernel of the 27B-shape decode steps (random weights; setup is
# skipped), and a per-kernel table per step is printed: where a step's time goes, and how much
# of the host-timed step is launch gaps rather than kernels.
#   env: DS_PROFILE_ARGS  bench model arguments (default: --w4a16 --batches 1 --contexts 1024)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_profile}"
mkdir -p "$OUT"
source tools/gpu_env.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
[ -n "$NCU" ] || { echo "no ncu on this machine"; exit 1; }
TAG=${DS_PROFILE_TAG:-decode}
REPS=2  # timed steps; bench model also runs 2 warm-up steps, all four are profiled
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
if [ "${DS_PROFILE_DETAIL:-0}" = 1 ]; then
  # The first 4 GEMVs of a step: GDN in_proj (qkv+z), out_proj, MLP gate_up, down.
  # shellcheck disable=SC2086
  "$NCU" --clock-control none --cache-control none --profile-from-start off --set full --kernel-name regex:qgemv \
    --launch-count 4 --page details .devbuild/deltaserve bench model --config configs/qwen3.8-27b.json --synthetic \
    --profile --reps 1 --verify 0 --prefill 0 ${DS_PROFILE_ARGS:---w4a16 --batches 1 --contexts 1024} \
    > "$OUT/ncu_detail_$TAG.txt" 2>&1
  grep -E "qgemv_kernel|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|Eligible Warps|No Eligible|Warp Cycles Per Issued" \
    "$OUT/ncu_detail_$TAG.txt" | head -80
fi
