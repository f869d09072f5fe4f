#!/usr/bin/env bash
# Pre-started workers on a GPU host (run it where bench/reports.sh runs): one
# agent owning the host's GPUs, with --prestart-workers true then false. Shows
# that idle standbys hold no GPU (nvidia-smi lists no process, no libcuda
# mapped, one thread), that an --exclusive job (which fails on any other
# process holding GPU memory) runs on them, and submit -> running for 5 short
# one-GPU stress jobs in each mode.
# Usage: bench/startup-gpu.sh [OUTDIR]   (GPUCTL_BIN, GPUCTL_SP)
set -u
OUT=${1:-/tmp/gpuctl-startup-gpu}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$B/gpuctl" ] || B=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
export GPUCTL_COORDINATOR=http://127.0.0.1:7350 NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi -L
for mode in true false; do
  echo "===== prestart $mode"
  rm -rf $OUT/fleet; $B/gpuctl local up --agents 1 --port 7350 --data-dir $OUT/fleet --agent-arg=--libtorch=$SP --agent-arg=--prestart-workers=$mode > $OUT/up-$mode.txt 2>&1 &
  F=$!
  for i in $(seq 120); do $B/gpuctl nodes 2>/dev/null | grep -q ready && break; sleep 0.5; done
  sleep 3
  ps -eo pid,ppid,rss,args | grep gpuctl-worker | grep -v grep | cut -c1-100
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv
  for p in $(pgrep -f "gpuctl-worker --prestarted"); do echo "prestarted worker $p: $(grep -c 'libcuda.so' /proc/$p/maps) libcuda maps, $(ls /proc/$p/task | wc -l) threads"; done
  for j in 1 2 3 4 5; do
    id=$($B/gpuctl submit stress --duration 3s --nodes 1 --gpus-per-node 1 --exclusive)
    if [ $j = 1 ]; then sleep 2; ps -eo pid,args | grep gpuctl-worker | grep -v grep | cut -c1-160; nvidia-smi --query-compute-apps=pid,used_memory --format=csv; fi
    $B/gpuctl watch $id > /dev/null 2>&1
    c=$($B/gpuctl status $id -o json | python3 -c "import json,sys; j=json.load(sys.stdin); print(j['created_unix_ms'])")
    $B/gpuctl report $id -o json | python3 -c "import json,sys; r=json.load(sys.stdin); rk=[x for n in r['nodes'] for x in n['ranks']]; print('$id', r['verdict'], 'submit->running ms', max(x['phases'][0]['unix_ms'] for x in rk)-$c, rk[0]['device_name'], rk[0]['stress']['tflops_median'] if rk[0].get('stress') else rk[0]['error'][:300])"
    sleep 3
  done
  grep "worker started" $OUT/fleet/logs/*.log | tail -2 | cut -c1-220
  kill -TERM $F; wait $F
  ps -eo pid,args | grep gpuctl | grep -v grep
done
