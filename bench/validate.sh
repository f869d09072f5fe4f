#!/usr/bin/env bash
# Validation of one GPU host through the real path (issue 5's list, minus the
# comparisons that bench/*.py make): gpuctl doctor, the agent's /metrics, a
# stress run on every GPU with --with-comm (telemetry and health verdicts in
# its report), fsdp beside ddp, maxbatch up to out-of-memory, fp16 ddp.
# Usage: bench/validate.sh OUTDIR   (GPUCTL_BIN, GPUCTL_SP, STRESS_DURATION)
set -u
OUTDIR=${1:-/tmp/gpuctl-validate}; mkdir -p "$OUTDIR"
BIN=${GPUCTL_BIN:-$(cd "$(dirname "$0")/.." && pwd)/target/release}
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PY=${GPUCTL_PY:-/opt/torch/.venv/bin/python3}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GPUCTL_COORDINATOR=http://127.0.0.1:7300
fetch() { "$PY" -c 'import sys,urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1"; }

"$BIN/gpuctl" doctor --libtorch "$SP" > "$OUTDIR/doctor.txt" 2>&1; echo "doctor rc=$?" | tee -a "$OUTDIR/doctor.txt"
"$BIN/gpuctl" local up --agents 1 --port 7300 --data-dir "$OUTDIR/fleet" \
  --agent-arg=--libtorch="$SP" --agent-arg=--metrics-listen=127.0.0.1:9401 > "$OUTDIR/local-up.txt" 2>&1 &
FLEET=$!
trap 'kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null' EXIT
for _ in $(seq 1 120); do "$BIN/gpuctl" nodes 2>/dev/null | grep -q ready && break; sleep 0.5; done
"$BIN/gpuctl" nodes > "$OUTDIR/nodes.txt" 2>&1

job() { # name timeout args...
  local name=$1 t=$2; shift 2
  timeout "$t" "$BIN/gpuctl" submit "$@" --nodes 1 --wait -o json > "$OUTDIR/$name.json" 2> "$OUTDIR/$name.err"
  echo "$name rc=$?"
  local id; id=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("job_id",""))' "$OUTDIR/$name.json" 2>/dev/null)
  [ -n "$id" ] && "$BIN/gpuctl" report "$id" > "$OUTDIR/$name.txt" 2>&1
}
(sleep 60; fetch http://127.0.0.1:9401/metrics > "$OUTDIR/agent-metrics.txt" 2>&1) &
job stress 420 stress --duration "${STRESS_DURATION:-5m}" --with-comm
job ddp 50 ddp --model resnet50 --precision bf16 --steps 10
job fsdp 50 fsdp --model resnet50 --precision bf16 --steps 10
job maxbatch 130 maxbatch --model resnet50 --precision bf16 --start 512
job fp16 45 ddp --model resnet50 --precision fp16 --steps 10
