#!/usr/bin/env bash
# The false-alarm rate on a GPU host (issue 34, docs/benchmarks.md): healthy
# jobs counted by the findings they raise, and real faults counted by whether
# they were named, and only their GPU or node.
#
#   bench/falsealarm.sh one OUT     one agent owning every GPU; REPEATS (2) rounds of
#                                   stress, stress --with-comm, the nccl sweep, ddp,
#                                   fsdp, maxbatch and p2p (JOBS picks some; `p2phog`
#                                   is a fault: p2p while another process copies
#                                   the second-last GPU -> the last without pause; `cotenant-comm` one too:
#                                   stress --with-comm while another process runs GEMMs
#                                   on the last GPU)
#                                   (JOBS_FILE: the jobs from a file instead, bench/matrix.sh)
#   bench/falsealarm.sh split OUT   one agent per GPU, each with its own NCCL_HOSTID
#                                   (NCCL takes its socket path between them, as between
#                                   hosts): REPEATS rounds of `accept --level quick`
#                                   and `nccl --pattern pairs`
#   bench/falsealarm.sh faults OUT  one agent per GPU as in `split`, the last agent
#                                   started with NVIDIA_TF32_OVERRIDE=0: a co-tenant
#                                   GEMM, a memory hog, a SIGSTOPped rank, a killed rank,
#                                   tf32 stress (that node's GEMMs run in full fp32: its
#                                   numerics differ, which the bit-for-bit check exists for),
#                                   p2p while another process copies host -> GPU 1 without
#                                   pause; FAULTS picks some ("cotenant memhog stop kill tf32 h2dhog")
#
# Beside every mode, in the same run: NVML read directly every 0.5 s
# (../shared/tools/nvml_links.py, copied to the carried bin folder), and
# `nvidia-smi nvlink -s` / `-e` before and after, to hold the agent's NVLink
# readings against. OUT/summary.txt is the table; OUT/*.json every report.
# Env: GPUCTL_BIN (.devbin), GPUCTL_SP, GPUCTL_PY, REPEATS.
set -u
MODE=${1:?one|split|faults}; OUT=${2:-/tmp/gpuctl-falsealarm}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$B/gpuctl" ] || B=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PY=${GPUCTL_PY:-/opt/torch/.venv/bin/python3}
REPEATS=${REPEATS:-2}
PORT=7340
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
LAST=$((NGPU - 1))
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv > "$OUT/gpus.csv"
nvidia-smi nvlink -s > "$OUT/nvlink-s-before.txt" 2>&1
nvidia-smi nvlink -e > "$OUT/nvlink-e-before.txt" 2>&1

PIDS=""; OTHER=""
cleanup() {
  [ -n "$OTHER" ] && kill "$OTHER" 2>/dev/null
  [ -n "${SAMPLER:-}" ] && kill -TERM "$SAMPLER" 2>/dev/null && wait "$SAMPLER" 2>/dev/null
  kill $PIDS 2>/dev/null; wait 2>/dev/null
}
trap cleanup EXIT
if [ -f "$B/nvml_links.py" ]; then
  "$PY" "$B/nvml_links.py" 3600 "$OUT/nvml-links.json" > "$OUT/nvml-links.txt" 2>&1 &
  SAMPLER=$!
fi

"$B/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$OUT/coordinator" \
  --metrics-listen off > "$OUT/coordinator.log" 2>&1 &
PIDS=$!
agent() { # name env... -- args...
  local name=$1; shift
  env "$@" "$B/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name "$name" \
    --libtorch "$SP" --work-dir "$OUT/agent-$name" --metrics-listen off ${AGENT_ARGS:-} \
    > "$OUT/agent-$name.log" 2>&1 &
  PIDS="$PIDS $!"
}
if [ "$MODE" = one ]; then
  agent host-0 GPUCTL_X=1
  N=1
else
  for i in $(seq 0 $LAST); do
    envs="NCCL_HOSTID=gpuctl-host-$i"
    [ "$MODE" = faults ] && [ "$i" = "$LAST" ] && envs="$envs NVIDIA_TF32_OVERRIDE=0"
    AGENT_ARGS="--gpus $i" agent "gpu-$i" $envs
  done
  N=$NGPU
fi
for _ in $(seq 1 120); do [ "$("$B/gpuctl" nodes 2>/dev/null | grep -c ready)" = "$N" ] && break; sleep 0.5; done
"$B/gpuctl" nodes > "$OUT/nodes.txt" 2>&1

job() { # name timeout submit-args...
  local name=$1 t=$2; shift 2
  local t0; t0=$(date +%s)
  timeout "$t" "$B/gpuctl" submit "$@" --wait -o json > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" >> "$OUT/runs.txt"
}
accept() { # name
  local t0; t0=$(date +%s)
  timeout 240 "$B/gpuctl" accept --nodes all --level quick -o json > "$OUT/$1.suite.json" 2> "$OUT/$1.err"
  echo "$1 rc=$? $(( $(date +%s) - t0 ))s" >> "$OUT/runs.txt"
  "$PY" - "$OUT/$1.suite.json" "$OUT/$1" "$B/gpuctl" <<'PY'
import json, subprocess, sys
s = json.load(open(sys.argv[1]))
for st in s["stages"]:
    if st.get("job_id"):
        with open(f"{sys.argv[2]}-{st['name']}.json", "w") as f:
            subprocess.run([sys.argv[3], "report", st["job_id"], "-o", "json"], stdout=f)
PY
}
started() { for _ in $(seq 1 120); do grep -q "$2" "$1" 2>/dev/null && return; sleep 0.5; done; }
# Another process running bf16 GEMMs on the last GPU without pause; OTHER is its pid.
cotenant() {
  CUDA_VISIBLE_DEVICES=$LAST "$PY" "$ROOT/bench/cotenant.py" > "$OUT/cotenant.txt" 2>&1 &
  OTHER=$!; started "$OUT/cotenant.txt" busy
}

case "$MODE" in
one)
  # JOBS_FILE: one job a line, "NAME TIMEOUT SUBMIT-ARGS..." (bench/matrix.sh).
  if [ -n "${JOBS_FILE:-}" ]; then
    while read -r name t args; do
      case "$name" in ''|'#'*) continue ;; esac
      # shellcheck disable=SC2086
      job "$name" "$t" $args < /dev/null
    done < "$JOBS_FILE"
    JOBS=""; REPEATS=0
  fi
  JOBS=${JOBS-stress stress-comm nccl ddp fsdp maxbatch p2p}
  for r in $(seq 1 "$REPEATS"); do
    for j in $JOBS; do
      case $j in
        stress) job "h$r-stress" 120 stress --nodes 1 --duration 15s ;;
        stress-comm) job "h$r-stress-comm" 120 stress --nodes 1 --duration 15s --with-comm ;;
        nccl) job "h$r-nccl" 180 nccl --nodes 1 --min-bytes 64M --max-bytes 1G ;;
        ddp) job "h$r-ddp" 180 ddp --nodes 1 --steps 30 ;;
        fsdp) job "h$r-fsdp" 180 fsdp --nodes 1 --steps 20 ;;
        maxbatch) job "h$r-maxbatch" 180 maxbatch --nodes 1 --limit 512 ;;
        p2p) job "h$r-p2p" 120 p2p --nodes 1 ;;
        cotenant-comm)
          cotenant
          job "f$r-cotenant-comm" 120 stress --nodes 1 --duration 15s --with-comm
          kill "$OTHER"; wait "$OTHER" 2>/dev/null; OTHER="" ;;
        p2phog)
          "$PY" -c '
import sys, torch
src, dst = int(sys.argv[1]), int(sys.argv[2])
a = torch.ones(2**28, device=f"cuda:{src}"); b = torch.empty_like(a, device=f"cuda:{dst}")
print("copying", flush=True)
while True:
    for _ in range(20): b.copy_(a)
    torch.cuda.synchronize(dst)' $((LAST - 1)) $LAST > "$OUT/p2phog.txt" 2>&1 &
          OTHER=$!; started "$OUT/p2phog.txt" copying
          job "f$r-p2phog" 120 p2p --nodes 1
          kill "$OTHER"; wait "$OTHER" 2>/dev/null; OTHER="" ;;
      esac
    done
  done ;;
split)
  for r in $(seq 1 "$REPEATS"); do
    accept "h$r-quick"
    job "h$r-pairs" 180 nccl --nodes all --pattern pairs --ops all_reduce,sendrecv --min-bytes 256M --max-bytes 256M
  done ;;
faults)
  FAULTS=${FAULTS:-cotenant memhog stop kill tf32 h2dhog}
  want() { case " $FAULTS " in *" $1 "*) return 0;; esac; return 1; }
  # A co-tenant's GEMMs on the last GPU.
  if want cotenant; then
    cotenant
    job "f-cotenant" 120 stress --nodes all --duration 15s
    kill "$OTHER"; wait "$OTHER" 2>/dev/null; OTHER=""
  fi
  if want memhog; then
    # 60 GiB held on GPU 0 by another process.
    CUDA_VISIBLE_DEVICES=0 "$PY" -c '
import time, torch
x = torch.empty(60 * 2**30, dtype=torch.uint8, device="cuda")
print("holding", flush=True); time.sleep(600)' > "$OUT/hog.txt" 2>&1 &
    OTHER=$!; started "$OUT/hog.txt" holding
    job "f-memhog" 120 stress --nodes all --duration 10s --target-memory 0.9
    kill "$OTHER"; wait "$OTHER" 2>/dev/null; OTHER=""
  fi
  # A stopped rank (the worker on GPU 1), then a killed one (GPU 2): the
  # worker is the one its agent logs as started for the job after those
  # before it (a worker of the last job may still be exiting).
  for sig in STOP KILL; do
    want "$(echo $sig | tr A-Z a-z)" || continue
    gpu=1; [ "$sig" = KILL ] && gpu=2
    log="$OUT/agent-gpu-$gpu.log"; seen=$(grep -c "worker started" "$log")
    ( for _ in $(seq 1 120); do
        if [ "$(grep -c "worker started" "$log")" -gt "$seen" ]; then
          p=$(grep "worker started" "$log" | tail -1 | grep -o 'pid=[0-9]*' | cut -d= -f2)
          sleep 8; kill -$sig "$p" && echo "SIG$sig $p on GPU $gpu" >> "$OUT/runs.txt"; break
        fi
        sleep 0.5
      done ) &
    KILLER=$!
    # Default iterations: a rank's progress counts each collective as it is
    # queued, and 200 at 256 MiB over sockets outlast a 20 s hang timeout
    # between two counts on healthy ranks.
    job "f-sig$sig" 180 nccl --nodes all --min-bytes 64M --max-bytes 256M --hang-timeout 20s
    wait $KILLER 2>/dev/null
    pkill -CONT -f gpuctl-worker 2>/dev/null
  done
  # Numerics that differ on one node: TF32 GEMMs everywhere but where that
  # agent's environment turns TF32 off in cuBLAS.
  want tf32 && job "f-tf32" 120 stress --nodes all --duration 10s --precision tf32
  # Another process copying from pinned host memory to GPU 1 without pause:
  # that GPU's PCIe link is shared, its host-to-device figure drops.
  if want h2dhog; then
    CUDA_VISIBLE_DEVICES=1 "$PY" -c '
import torch
h = torch.ones(2**28).pin_memory(); d = torch.empty_like(h, device="cuda")
print("copying", flush=True)
while True:
    for _ in range(20): d.copy_(h, non_blocking=True)
    torch.cuda.synchronize()' > "$OUT/h2dhog.txt" 2>&1 &
    OTHER=$!; started "$OUT/h2dhog.txt" copying
    job "f-h2dhog" 120 p2p --nodes all
    kill "$OTHER"; wait "$OTHER" 2>/dev/null; OTHER=""
  fi
  ;;
esac

kill -TERM "${SAMPLER:-}" 2>/dev/null; wait "${SAMPLER:-}" 2>/dev/null; SAMPLER=""
nvidia-smi nvlink -s > "$OUT/nvlink-s-after.txt" 2>&1
nvidia-smi nvlink -e > "$OUT/nvlink-e-after.txt" 2>&1
grep -h "NVLink state could not be read" "$OUT"/agent-*.log | head -20 > "$OUT/agent-nvlink-read-errors.txt"
"$PY" "$ROOT/bench/falsealarm_summary.py" "$OUT" "$MODE" | tee "$OUT/summary.txt"
