#!/usr/bin/env bash
# The 10-minute C64 soak on the device machine, where one command may run at most 600 s: the
# soak (tools/soak.sh, build carried in .devbuild/) runs in its own process session, so it
# outlives the command that starts it while the machine stays held, and a second command,
# issued right after the first returns (the machine stays warm about 30 s), waits for it and
# prints its summary.
#   call 1:  tools/gpu_soak.sh start     (returns after about 560 s)
#   call 2:  tools/gpu_soak.sh collect   (waits for the end, then prints the summary)
# Output under /tmp/gpu_soak on the device (copy what you keep to $OUT in the second call).
# env: DS_SOAK_SECONDS (600), DS_SOAK_SERVE_ARGS (27B synthetic W4A16, --gpu-memory 24)
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=/tmp/gpu_soak
case "${1:-}" in
  start)
    rm -rf "$DIR" && mkdir -p "$DIR"
    source tools/gpu_env.sh
    # shellcheck disable=SC2086
    DS_BIN=.devbuild/deltaserve setsid nohup tools/soak.sh --duration "${DS_SOAK_SECONDS:-600}" --out "$DIR" \
      --bench-args "--prompt-vocab 248320 --num-prompts 128 --input-len 128 --output-len 128" -- \
      ${DS_SOAK_SERVE_ARGS:---config configs/qwen3.8-27b.json --synthetic --w4a16 --device cuda --gpu-memory 24 --max-num-seqs 64} \
      > "$DIR/soak.txt" 2>&1 < /dev/null &
    echo $! > "$DIR/pid"
    sleep "${DS_SOAK_START_WAIT:-560}"  # env: DS_SOAK_START_WAIT (seconds this call waits)
    tail -3 "$DIR/soak.csv" 2>/dev/null
    echo "soak still running: issue 'tools/gpu_soak.sh collect' now"
    ;;
  collect)
    pid=$(cat "$DIR/pid" 2>/dev/null) || { echo "no soak was started on this machine"; exit 1; }
    while kill -0 "$pid" 2>/dev/null; do sleep 5; done
    [ -n "${OUT:-}" ] && cp "$DIR/soak.csv" "$DIR/soak.txt" "$OUT/" 2>/dev/null
    cat "$DIR/soak.txt"
    echo "-- server.log (last lines)"; tail -5 "$DIR/server.log"
    grep -q "flat memory: PASS" "$DIR/soak.txt"
    ;;
  *) echo "usage: tools/gpu_soak.sh start|collect" >&2; exit 2 ;;
esac
