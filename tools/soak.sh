#!/usr/bin/env bash
# Soak benchmark (not a CI test): starts `deltaserve serve`, keeps `deltaserve bench serve`
# running at one concurrency for a duration, samples the server's RSS, its GPU memory and the
# /metrics pool usage every few seconds into a CSV, and ends with a summary and a pass/fail for
# "flat memory": after warm-up, RSS and GPU memory drift less than --max-drift percent.
#
# Usage: tools/soak.sh [options] -- SERVE_ARGS...
#   --duration S      load time in seconds (600)
#   --interval S      sampling period in seconds (10)
#   --warmup S        samples before this are not judged (default: a tenth of the duration)
#   --concurrency C   bench serve concurrency (64)
#   --bench-args "A"  extra bench serve arguments ("--num-prompts 128 --input-len 128 --output-len 128")
#   --max-drift P     flat-memory limit in percent (1)
#   --out DIR         where the CSV, logs and bench reports go ($OUT, else a new temp dir)
# Env: DS_BIN (default build/deltaserve).
# Example (GPU): tools/soak.sh -- --config configs/qwen3.8-27b.json --synthetic --w4a16 --device cuda --gpu-memory 40
#   (with --synthetic, add --bench-args "--prompt-vocab 1000 ..." : that model takes token-id prompts)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${DS_BIN:-$root/build/deltaserve}"
duration=600 interval=10 warmup="" concurrency=64 max_drift=1
bench_args="--num-prompts 128 --input-len 128 --output-len 128"
out="${OUT:-}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --duration) duration="$2"; shift 2 ;;
    --interval) interval="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --concurrency) concurrency="$2"; shift 2 ;;
    --bench-args) bench_args="$2"; shift 2 ;;
    --max-drift) max_drift="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "soak.sh: unknown option $1 (serve arguments go after --)" >&2; exit 2 ;;
  esac
done
serve_args=("$@")
warmup="${warmup:-$((duration / 10))}"
[[ -n "$out" ]] || out="$(mktemp -d)"
mkdir -p "$out"
csv="$out/soak.csv"

server_pid="" bench_pid="" sampler_pid=""
cleanup() {
  for pid in "$bench_pid" "$sampler_pid" "$server_pid"; do
    [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  done
  return 0
}
trap cleanup EXIT

# --- the server, on a free port ---
"$bin" serve --port 0 "${serve_args[@]}" >"$out/server.stdout" 2>"$out/server.log" &
server_pid=$!
url=""
for _ in $(seq 1 1200); do  # loading real-shape synthetic weights takes a while
  url="$(sed -n 's/^listening on \(http:[^ ]*\).*/\1/p' "$out/server.stdout" | head -n 1)"
  [[ -n "$url" ]] && break
  kill -0 "$server_pid" 2>/dev/null || { echo "soak.sh: the server exited; see $out/server.log" >&2; exit 1; }
  sleep 0.5
done
[[ -n "$url" ]] || { echo "soak.sh: the server did not start listening" >&2; exit 1; }
model="$(curl -s "$url/v1/models" | grep -o '"id": *"[^"]*"' | head -n 1 | sed 's/.*"\([^"]*\)"$/\1/')"
echo "soak: server pid $server_pid at $url, model '$model'; ${duration}s at concurrency $concurrency; output in $out"

# --- the sampler: one CSV row per interval ---
metric() {  # metric NAME < /metrics text
  awk -v n="$1" '$1 == n { print $2; found = 1 } END { if (!found) print "" }'
}
gpu_mib() {  # this server's GPU memory (MiB), else the whole GPU's, else empty
  command -v nvidia-smi >/dev/null || return 0
  local v
  v="$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
       awk -F', *' -v p="$server_pid" '$1 == p { print $2 }')"
  [[ -n "$v" ]] || v="$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -n 1)"
  echo "$v"
}
sample_loop() {
  local t0=$SECONDS
  echo "t_s,rss_mib,gpu_mib,kv_cache_usage,kv_blocks_used,state_slots_used,requests_running,generation_tokens_total" >"$csv"
  while kill -0 "$server_pid" 2>/dev/null; do
    local m rss
    m="$(curl -s --max-time 5 "$url/metrics" || true)"
    rss="$(awk '/^VmRSS:/ { printf "%.1f", $2 / 1024 }' "/proc/$server_pid/status" 2>/dev/null || true)"
    echo "$((SECONDS - t0)),$rss,$(gpu_mib),$(metric deltaserve_kv_cache_usage <<<"$m"),$(metric deltaserve_kv_blocks_used <<<"$m"),$(metric deltaserve_state_slots_used <<<"$m"),$(metric deltaserve_requests_running <<<"$m"),$(metric deltaserve_generation_tokens_total <<<"$m")" >>"$csv"
    sleep "$interval"
  done
}
sample_loop &
sampler_pid=$!

# --- the load: bench serve runs back to back until the duration is over ---
start=$SECONDS
run=0
read -r -a extra <<<"$bench_args"
while ((SECONDS - start < duration)); do
  run=$((run + 1))
  "$bin" bench serve --url "$url" --model "$model" --concurrency "$concurrency" "${extra[@]}" \
    >"$out/bench_$run.json" 2>"$out/bench_$run.log" &
  bench_pid=$!
  while kill -0 "$bench_pid" 2>/dev/null && ((SECONDS - start < duration)); do sleep 1; done
  if kill -0 "$bench_pid" 2>/dev/null; then  # the time is up mid-run: that run is not reported
    kill "$bench_pid" 2>/dev/null || true
    wait "$bench_pid" 2>/dev/null || true
    rm -f "$out/bench_$run.json" "$out/bench_$run.log"
    run=$((run - 1))
  else
    wait "$bench_pid" || { echo "soak.sh: bench serve failed; see $out/bench_$run.log" >&2; exit 1; }
  fi
  bench_pid=""
done
sleep "$interval"  # one more sample after the load
kill "$sampler_pid" 2>/dev/null || true
wait "$sampler_pid" 2>/dev/null || true
sampler_pid=""

# --- summary ---
echo "soak: $run complete bench runs; samples in $csv"
grep -h "server overhead" "$out"/bench_*.log 2>/dev/null | tail -n 3 || true
awk -F, -v warm="$warmup" -v lim="$max_drift" '
  NR == 1 { next }
  {
    for (c = 2; c <= 3; ++c) {
      if ($c == "") continue
      v = $c + 0
      if (!(c in n)) { first[c] = v; max[c] = v }
      n[c]++; last[c] = v; if (v > max[c]) max[c] = v
      if ($1 + 0 >= warm) { if (!(c in wn)) wfirst[c] = v; wn[c]++; wlast[c] = v }
    }
  }
  END {
    name[2] = "RSS"; name[3] = "GPU memory"; fail = 0; judged = 0
    for (c = 2; c <= 3; ++c) {
      if (!(c in n)) { printf "%-10s  not sampled\n", name[c]; continue }
      line = sprintf("%-10s  first %.1f MiB, last %.1f MiB, max %.1f MiB", name[c], first[c], last[c], max[c])
      if (c in wn && wn[c] >= 2 && wfirst[c] > 0) {
        d = (wlast[c] - wfirst[c]) / wfirst[c] * 100
        ok = (d < lim && d > -lim); judged++; if (!ok) fail = 1
        line = line sprintf("; after %ds warm-up %.1f -> %.1f MiB, drift %+.2f%% (%s)", warm, wfirst[c], wlast[c], d, ok ? "flat" : "NOT flat")
      } else {
        line = line "; too few samples after warm-up to judge"
      }
      print line
    }
    if (!judged) { print "flat memory: UNDECIDED (no samples after warm-up)"; exit 2 }
    print (fail ? "flat memory: FAIL" : "flat memory: PASS") " (limit " lim "%)"
    exit fail
  }' "$csv"
