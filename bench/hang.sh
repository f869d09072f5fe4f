#!/usr/bin/env bash
# A hung rank on a GPU host, through the real path (docs/benchmarks.md): an
# nccl sweep on 2 GPUs, one worker stopped with SIGSTOP 8 s in. Records the
# time from the stop to the job's failure, what the report blames, whether any
# worker is left, and the GPUs' utilisation afterwards (a rank left spinning in
# NCCL shows as 99-100 %).
# Usage: bench/hang.sh OUTDIR   (GPUCTL_BIN, GPUCTL_SP, GPUCTL_PY, HANG_TIMEOUT)
set -u
OUTDIR=${1:-/tmp/gpuctl-hang}; mkdir -p "$OUTDIR"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$BIN/gpuctl" ] || BIN=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PY=${GPUCTL_PY:-/opt/torch/.venv/bin/python3}
HANG=${HANG_TIMEOUT:-30s}
export NCCL_NVLS_ENABLE=0
export GPUCTL_COORDINATOR=http://127.0.0.1:7320
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
S="$OUTDIR/summary.txt"; : > "$S"

"$BIN/gpuctl" local up --agents 1 --port 7320 --data-dir "$OUTDIR/fleet" \
  --agent-arg=--libtorch="$SP" > "$OUTDIR/local-up.txt" 2>&1 &
FLEET=$!
STOPPED=""
cleanup() { [ -n "$STOPPED" ] && kill -CONT "$STOPPED" 2>/dev/null; kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null; }
trap cleanup EXIT
for _ in $(seq 1 120); do "$BIN/gpuctl" nodes 2>/dev/null | grep -q ready && break; sleep 0.5; done
"$BIN/gpuctl" nodes > "$OUTDIR/nodes.txt" 2>&1

# A sweep long enough to be mid-way when the rank stops.
ID=$("$BIN/gpuctl" submit nccl --nodes 1 --gpus-per-node 2 --ops all_reduce,all_gather \
  --min-bytes 1M --max-bytes 4G --iters 200 --hang-timeout "$HANG" -o json \
  | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "job $ID hang-timeout $HANG" | tee -a "$S"
for _ in $(seq 1 120); do
  PIDS=$(pgrep -f "gpuctl-worker.*$ID" || true)
  [ "$(echo "$PIDS" | grep -c .)" -ge 2 ] && break; sleep 0.5
done
sleep 8
VICTIM=$(pgrep -f "gpuctl-worker.*$ID" | tail -1)
echo "stopping worker pid $VICTIM: $(tr '\0' ' ' < /proc/$VICTIM/cmdline | cut -c1-160)" | tee -a "$S"
grep -a -o 'GPUCTL_RANK=[0-9]*\|RANK=[0-9]*' /proc/$VICTIM/environ | head -2 | tee -a "$S"
kill -STOP "$VICTIM"; STOPPED=$VICTIM
T0=$(date +%s%N)
nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader > "$OUTDIR/smi-stopped.csv"
STATE=running
while [ "$STATE" = running ]; do
  sleep 0.5
  STATE=$("$BIN/gpuctl" status "$ID" -o json 2>/dev/null | "$PY" -c 'import json,sys; print(json.load(sys.stdin).get("state","?"))' 2>/dev/null || echo "?")
  [ $(( ($(date +%s%N) - T0) / 1000000000 )) -gt 400 ] && break
done
T1=$(date +%s%N)
echo "state $STATE after $(( (T1 - T0) / 1000000 )) ms from SIGSTOP" | tee -a "$S"
for _ in $(seq 1 40); do pgrep -f "gpuctl-worker.*$ID" > /dev/null || break; sleep 0.25; done
echo "workers left $(( ($(date +%s%N) - T1) / 1000000 )) ms after the failure: $(pgrep -f "gpuctl-worker.*$ID" | wc -l)" | tee -a "$S"
STOPPED=""
for i in 1 2 3 4 5; do
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader | tr '\n' ' ' | sed "s/^/after ${i}s: /" | tee -a "$S"; echo | tee -a "$S"
  sleep 1
done
"$BIN/gpuctl" report "$ID" > "$OUTDIR/report.txt" 2>&1
"$BIN/gpuctl" report "$ID" -o json > "$OUTDIR/report.json" 2>&1
head -12 "$OUTDIR/report.txt" | tee -a "$S"
