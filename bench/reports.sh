#!/usr/bin/env bash
# The report formats on a GPU host, through the real path: a local fleet of one
# agent owning the host's GPUs runs a stress, an nccl sweep, a maxbatch and a
# ddp job comparing two models; each report is written as HTML, JSON and
# table, with its Chrome trace. Open the HTML files in a browser (the test
# cli/tests/html.rs does the same on CPU ranks in headless Chromium).
# Usage: bench/reports.sh OUTDIR   (GPUCTL_BIN, GPUCTL_SP, GPUS)
set -u
OUTDIR=${1:-/tmp/gpuctl-reports}; mkdir -p "$OUTDIR"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$BIN/gpuctl" ] || BIN=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
GPUS=${GPUS:-2}
export NCCL_NVLS_ENABLE=0
export GPUCTL_COORDINATOR=http://127.0.0.1:7330
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"

"$BIN/gpuctl" local up --agents 1 --port 7330 --data-dir "$OUTDIR/fleet" \
  --agent-arg=--libtorch="$SP" > "$OUTDIR/local-up.txt" 2>&1 &
FLEET=$!
trap 'kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null' EXIT
for _ in $(seq 1 120); do "$BIN/gpuctl" nodes 2>/dev/null | grep -q ready && break; sleep 0.5; done
"$BIN/gpuctl" nodes > "$OUTDIR/nodes.txt" 2>&1

run() {
  local name=$1; shift
  local id
  id=$("$BIN/gpuctl" submit "$@" --nodes 1 --gpus-per-node "$GPUS")
  "$BIN/gpuctl" watch "$id" > /dev/null 2>&1
  "$BIN/gpuctl" report "$id" > "$OUTDIR/$name.txt" 2>&1
  "$BIN/gpuctl" report "$id" -o json > "$OUTDIR/$name.json" 2>/dev/null
  "$BIN/gpuctl" report "$id" -o html > "$OUTDIR/$name.html" 2>/dev/null
  "$BIN/gpuctl" trace "$id" --out "$OUTDIR/$name.trace.json" 2>> "$OUTDIR/trace.txt"
  echo "$name $id $(head -c 0 /dev/null)$(grep -m1 VERDICT "$OUTDIR/$name.txt")"
}
run stress stress --duration 20s
run nccl nccl --ops all_reduce,all_gather --min-bytes 1M --max-bytes 1G
run maxbatch maxbatch --model resnet50 --precision bf16 --start 64 --limit 4096
run ddp ddp --model resnet18,mobilenet_v2 --batch-size 128 --steps 30
