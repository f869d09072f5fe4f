#!/usr/bin/env bash
# Issue 36 on a GPU host: one agent per GPU, so every GPU is a "node", and
# `nccl --pattern search` and `--pattern pairs` between them, healthy and
# with a slow node, the verdicts and the time each took (docs/benchmarks.md).
#
#   bench/search.sh sockets OUT   each agent with its own NCCL_HOSTID: NCCL takes
#                                 its network path (sockets) between them, as
#                                 between hosts
#   bench/search.sh nvlink OUT    no NCCL_HOSTID: NVLink between the agents
#   bench/search.sh starved OUT   as sockets, the agent of GPU $SLOW (2) and its
#                                 workers pinned to one CPU core that two busy
#                                 loops share: NCCL's socket threads starve, as on
#                                 a host whose CPUs another tenant holds
#
# JOBS (default "search pairs"), REPEATS (1), MAX (256M). Also `quick` in JOBS:
# `accept --level quick`, whose links stage is the search. OUT/summary.txt is
# the table (bench/search_summary.py); OUT/*.json every report.
# Env: GPUCTL_BIN (.devbin), GPUCTL_SP, GPUCTL_PY.
set -u
MODE=${1:?sockets|nvlink|starved}; OUT=${2:-/tmp/gpuctl-search}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$B/gpuctl" ] || B=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PY=${GPUCTL_PY:-/opt/torch/.venv/bin/python3}
JOBS=${JOBS:-search pairs}; REPEATS=${REPEATS:-1}; MAX=${MAX:-256M}; SLOW=${SLOW:-2}
PORT=7350
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
PIDS=""
trap 'kill $PIDS 2>/dev/null; wait 2>/dev/null' EXIT
"$B/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$OUT/coordinator" \
  --metrics-listen off > "$OUT/coordinator.log" 2>&1 &
PIDS=$!
CORE=$(( $(nproc) - 1 ))
for i in $(seq 0 $((NGPU - 1))); do
  envs="GPUCTL_X=1"; pin=""
  [ "$MODE" != nvlink ] && envs="NCCL_HOSTID=gpuctl-host-$i"
  if [ "$MODE" = starved ] && [ "$i" = "$SLOW" ]; then
    pin="taskset -c $CORE"
    for _ in 1 2; do taskset -c $CORE sh -c 'while :; do :; done' & PIDS="$PIDS $!"; done
  fi
  env $envs $pin "$B/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name "gpu-$i" \
    --gpus "$i" --libtorch "$SP" --work-dir "$OUT/agent-$i" --metrics-listen off \
    > "$OUT/agent-$i.log" 2>&1 &
  PIDS="$PIDS $!"
done
for _ in $(seq 1 120); do [ "$("$B/gpuctl" nodes 2>/dev/null | grep -c ready)" = "$NGPU" ] && break; sleep 0.5; done
"$B/gpuctl" nodes > "$OUT/nodes.txt" 2>&1

job() { # name timeout submit-args...
  local name=$1 t=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout "$t" "$B/gpuctl" submit "$@" --wait -o json > "$OUT/$name.json" 2> "$OUT/$name.err"
  echo "$name rc=$? $(( ($(date +%s%N) - t0) / 1000000 ))ms" >> "$OUT/runs.txt"
}
for r in $(seq 1 "$REPEATS"); do
  for j in $JOBS; do
    case $j in
      search) job "$MODE-$r-search" 240 nccl --nodes all --pattern search --max-bytes "$MAX" ;;
      pairs) job "$MODE-$r-pairs" 300 nccl --nodes all --pattern pairs --max-bytes "$MAX" ;;
      quick)
        t0=$(date +%s%N)
        timeout 300 "$B/gpuctl" accept --nodes all --level quick -o json > "$OUT/$MODE-$r-quick.suite.json" 2> "$OUT/$MODE-$r-quick.err"
        echo "$MODE-$r-quick rc=$? $(( ($(date +%s%N) - t0) / 1000000 ))ms" >> "$OUT/runs.txt" ;;
    esac
  done
done
"$B/gpuctl" fleet links > "$OUT/fleet-links.txt" 2>&1
"$PY" "$ROOT/bench/search_summary.py" "$OUT" | tee "$OUT/summary.txt"
