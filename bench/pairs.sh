#!/usr/bin/env bash
# `nccl --pattern pairs` between two "nodes" of one GPU host: two agents, each
# owning one GPU and started with its own NCCL_HOSTID, so NCCL takes its
# network path between them (sockets) instead of NVLink, as between two hosts.
# Usage: bench/pairs.sh OUTDIR   (GPUCTL_BIN, GPUCTL_SP, GPUCTL_PY)
set -u
OUTDIR=${1:-/tmp/gpuctl-pairs}; mkdir -p "$OUTDIR"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$BIN/gpuctl" ] || BIN=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PORT=7320
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT NCCL_NVLS_ENABLE=0
"$BIN/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$OUTDIR/coordinator" \
  --metrics-listen off > "$OUTDIR/coordinator.log" 2>&1 &
PIDS=$!
for i in 0 1; do
  NCCL_HOSTID=gpuctl-host-$i "$BIN/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name gpu-$i \
    --gpus $i --libtorch "$SP" --work-dir "$OUTDIR/agent-$i" --metrics-listen off \
    > "$OUTDIR/agent-$i.log" 2>&1 &
  PIDS="$PIDS $!"
done
trap 'kill $PIDS 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 1 120); do [ "$("$BIN/gpuctl" nodes 2>/dev/null | grep -c ready)" = 2 ] && break; sleep 0.5; done
"$BIN/gpuctl" nodes > "$OUTDIR/nodes.txt" 2>&1

job() { # name args...
  local name=$1; shift
  timeout 240 "$BIN/gpuctl" submit "$@" --nodes 2 --wait -o json > "$OUTDIR/$name.json" 2> "$OUTDIR/$name.err"
  echo "$name rc=$?" | tee -a "$OUTDIR/summary.txt"
  local id; id=$(grep -o '"job_id": *"[^"]*"' "$OUTDIR/$name.json" | head -1 | cut -d'"' -f4)
  [ -n "$id" ] && "$BIN/gpuctl" report "$id" > "$OUTDIR/$name.txt" 2>&1
}
job pairs nccl --pattern pairs --max-bytes 1G --iters 10 --warmup 3
job all nccl --ops all_reduce --min-bytes 1G --max-bytes 1G --iters 10 --warmup 3
"$BIN/gpuctl" fleet links > "$OUTDIR/fleet-links.txt" 2>&1
grep -A8 '^LINKS' "$OUTDIR/pairs.txt" | tee -a "$OUTDIR/summary.txt"
grep -E '^VERDICT|1073741824' "$OUTDIR/pairs.txt" "$OUTDIR/all.txt" | tee -a "$OUTDIR/summary.txt"
