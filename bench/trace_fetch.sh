#!/usr/bin/env bash
# Issue 39 on a GPU host: `gpuctl profile --trace` fetching every rank's
# Chrome trace through the coordinator, from two agents that each keep their
# ranks' traces in their own folder.
#
#   bench/trace_fetch.sh OUT
#
# A coordinator and two agents on this host, `host-a` (GPUs 0,1) and `host-b`
# (GPUs 2,3), each with its own work folder; ddp on both (4 ranks,
# MobileNetV2, batch 64, bf16) with `--profile --profile-steps $STEPS`. Then:
# 1. `gpuctl profile JOB --trace DIR` run from another folder, timed; each
#    fetched file's sha256 against the file in its agent's folder.
# 2. host-b's agent killed (SIGKILL); the same fetch again: it must exit 1,
#    name host-b's ranks only, and still bring host-a's.
# OUT/summary.txt holds the figures; OUT/trace-fetch.tar.gz the logs (not the
# traces, ~55 MiB each).
# Env: GPUCTL_BIN (.devbin), GPUCTL_SP, STEPS (20).
set -u
OUT=${1:-/tmp/gpuctl-trace-fetch}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$B/gpuctl" ] || B=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
STEPS=${STEPS:-20}
PORT=7395
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
WORK=$(mktemp -d /tmp/gpuctl-trace-fetch.XXXX)
PIDS=""
trap 'kill $PIDS 2>/dev/null; wait 2>/dev/null; rm -rf "$WORK"' EXIT
"$B/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$WORK/coordinator" \
  --metrics-listen off > "$OUT/coordinator.log" 2>&1 &
PIDS=$!
agent() { # name gpus
  "$B/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name "$1" --gpus "$2" \
    --libtorch "$SP" --work-dir "$WORK/$1" --metrics-listen off > "$OUT/agent-$1.log" 2>&1 &
  echo $!
}
A=$(agent host-a 0,1); BPID=$(agent host-b 2,3); PIDS="$PIDS $A $BPID"
for _ in $(seq 1 120); do
  [ "$("$B/gpuctl" nodes 2>/dev/null | grep -c ready)" -ge 2 ] && break; sleep 0.5
done
"$B/gpuctl" nodes > "$OUT/nodes.txt" 2>&1

timeout 600 "$B/gpuctl" submit ddp --nodes 2 --model mobilenet_v2 --batch-size 64 \
  --precision bf16 --steps 20 --warmup-steps 5 --profile --profile-steps "$STEPS" \
  --wait -o json > "$OUT/job.json" 2> "$OUT/job.err"
echo "ddp --profile rc=$?" | tee "$OUT/summary.txt"
JOB=$(sed -n 's/.*"job_id": *"\([^"]*\)".*/\1/p' "$OUT/job.json" | head -1)
"$B/gpuctl" report "$JOB" > "$OUT/report.txt" 2>&1
sed -n '1,3p' "$OUT/report.txt" | tee -a "$OUT/summary.txt"

compare() { # dir: each fetched trace against its agent's file
  for f in "$1"/profile-*.json; do
    [ -e "$f" ] || continue
    src=$(find "$WORK"/host-* -name "$(basename "$f")" | head -1)
    a=$(sha256sum < "$f" | cut -c1-16); b=$(sha256sum < "$src" | cut -c1-16)
    same=differs; [ "$a" = "$b" ] && same=same
    echo "  $(basename "$f") $(stat -c %s "$f") bytes, sha256 $a, $same as $src"
  done
}

mkdir -p "$WORK/cli" "$WORK/fetched" "$WORK/fetched2"
cd "$WORK/cli" || exit 1
t0=$(date +%s%N)
"$B/gpuctl" profile "$JOB" --trace "$WORK/fetched" > "$OUT/profile.txt" 2> "$OUT/fetch.err"
rc=$?; ms=$(( ($(date +%s%N) - t0) / 1000000 ))
{
  echo "== fetch of every rank's trace: rc=$rc in ${ms} ms"
  cat "$OUT/fetch.err"
  compare "$WORK/fetched"
  echo "  total $(du -cb "$WORK"/fetched/profile-*.json 2>/dev/null | tail -1 | cut -f1) bytes"
} | tee -a "$OUT/summary.txt"

kill -9 "$BPID"; sleep 1
t0=$(date +%s%N)
"$B/gpuctl" profile "$JOB" --trace "$WORK/fetched2" > /dev/null 2> "$OUT/fetch2.err"
rc=$?; ms=$(( ($(date +%s%N) - t0) / 1000000 ))
{
  echo "== the same with host-b's agent killed: rc=$rc in ${ms} ms"
  cat "$OUT/fetch2.err"
  compare "$WORK/fetched2"
} | tee -a "$OUT/summary.txt"
cd "$OUT" && tar czf trace-fetch.tar.gz --exclude trace-fetch.tar.gz . 2>/dev/null
