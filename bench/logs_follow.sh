#!/usr/bin/env bash
# `gpuctl logs JOB -f` on real workers: one coordinator and one agent owning
# every GPU, ROUNDS (3) stress jobs of 10 s; for each, `logs -f` started with
# the job, then how long after the job ended it returned and whether it
# printed every line the plain listing has afterwards, each once, in order
# (each rank's last line is a worker's own `stress done`). OUT/summary.txt.
#   bench/logs_follow.sh OUT
# Env: GPUCTL_BIN (.devbin), GPUCTL_SP, ROUNDS.
set -u
OUT=${1:-/tmp/gpuctl-logs-follow}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$B/gpuctl" ] || B=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PORT=7350
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
PIDS=""
trap 'kill $PIDS 2>/dev/null; wait 2>/dev/null' EXIT
"$B/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$OUT/coordinator" \
  --metrics-listen off > "$OUT/coordinator.log" 2>&1 &
PIDS=$!
"$B/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name host-0 --libtorch "$SP" \
  --work-dir "$OUT/agent" --metrics-listen off > "$OUT/agent.log" 2>&1 &
PIDS="$PIDS $!"
for _ in $(seq 1 120); do "$B/gpuctl" nodes 2>/dev/null | grep -q ready && break; sleep 0.5; done
echo "round job state ended_ms returned_ms after_end_ms lines_followed lines_listed same" > "$OUT/summary.txt"
for r in $(seq 1 "${ROUNDS:-3}"); do
  id=$("$B/gpuctl" submit stress --nodes 1 --duration 10s -o json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1)
  "$B/gpuctl" logs "$id" -f > "$OUT/$r-followed.txt" 2> "$OUT/$r-followed.err"
  returned=$(date +%s%3N)
  "$B/gpuctl" status "$id" -o json > "$OUT/$r-job.json"
  "$B/gpuctl" logs "$id" > "$OUT/$r-listed.txt"
  state=$(sed -n 's/.*"state": *"\([a-z]*\)".*/\1/p' "$OUT/$r-job.json" | head -1)
  ended=$(sed -n 's/.*"finished_unix_ms": *"\{0,1\}\([0-9]*\).*/\1/p' "$OUT/$r-job.json" | head -1)
  same=no; cmp -s "$OUT/$r-followed.txt" "$OUT/$r-listed.txt" && same=yes
  echo "$r $id $state $ended $returned $((returned - ended)) $(wc -l < "$OUT/$r-followed.txt") $(wc -l < "$OUT/$r-listed.txt") $same" >> "$OUT/summary.txt"
done
cat "$OUT/summary.txt"
