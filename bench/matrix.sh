#!/usr/bin/env bash
# The healthy-run matrix on a GPU host (issue 47): every workload, the models
# and sizes gpuctl offers, several dtypes, run healthy on one agent owning every
# GPU, then `accept --level quick` and pairs on one-GPU agents. Each job must
# pass with no finding; the table counts FAIL and WARN per host kind, and for
# each job the share of its ranks' time in measured phases against set-up,
# warm-up and verification (the budget: non-measured phases under 10 % of a
# training job's wall time at every model size, on GPU).
#
#   bench/matrix.sh OUT           the whole matrix (~25 jobs, ~12 min on 2 x H200)
#   SET=train bench/matrix.sh OUT only the training rows (one agent)
#   SET=gen bench/matrix.sh OUT   the rest: stress, nccl, p2p, maxbatch (one
#                                 agent), then the one-GPU agents' rows; each
#                                 set fits one 10-minute device call
#
# Runs through bench/falsealarm.sh (JOBS_FILE), which samples NVML directly
# beside it. OUT/matrix.txt is the table.
set -u
OUT=${1:-/tmp/gpuctl-matrix}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${GPUCTL_PY:-/opt/torch/.venv/bin/python3}
SET=${SET:-all}
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
JOBS_FILE="$OUT/jobs.txt"
(
  if [ "$SET" != train ]; then
    for p in bf16 fp16 tf32 fp32 fp8; do echo "stress-$p 120 stress --nodes 1 --duration 10s --precision $p"; done
    echo "stress-comm 120 stress --nodes 1 --duration 10s --with-comm"
    echo "nccl 180 nccl --nodes 1 --min-bytes 64M --max-bytes 1G"
    # p2p copies between two GPUs, and one-GPU agents need two to pair.
    [ "$NGPU" -ge 2 ] && echo "p2p 120 p2p --nodes 1"
    echo "maxbatch-resnet50 240 maxbatch --nodes 1 --model resnet50 --limit 512"
  fi
  if [ "$SET" != train ]; then
    # Requests that cannot run: the job's error, no node's (summary's req- rows).
    echo "req-maxbatch-toolarge 150 maxbatch --nodes 1 --model gpt --gpt-size 2.7b --seq-len 262144 --limit 4"
    echo "req-env-rank 30 stress --nodes 1 --duration 5s --env RANK=1"
  fi
  [ "$SET" = gen ] && exit 0
  for m in "resnet50 bf16" "resnet50 fp32" "resnet18 fp16" "mobilenet_v2 bf16" "resnet152 bf16"; do
    set -- $m; echo "ddp-$1-$2 240 ddp --nodes 1 --model $1 --precision $2 --steps 30"
  done
  for g in 124m 350m 1.3b 2.7b; do
    echo "ddp-gpt$g 300 ddp --nodes 1 --model gpt --gpt-size $g --precision bf16 --batch-size 4 --steps 20"
  done
  for g in 350m 1.3b 2.7b; do
    echo "fsdp-gpt$g 300 fsdp --nodes 1 --model gpt --gpt-size $g --precision bf16 --batch-size 4 --steps 20"
  done
  echo "fsdp-resnet50 240 fsdp --nodes 1 --model resnet50 --precision bf16 --steps 20"
  # The catalogue's default length, and a suite's: how the share outside the
  # measured phase falls as a job runs longer.
  echo "ddp-resnet50-default 240 ddp --nodes 1 --model resnet50 --precision bf16"
  echo "ddp-resnet50-500 300 ddp --nodes 1 --model resnet50 --precision bf16 --steps 500"
) > "$JOBS_FILE"
JOBS_FILE="$JOBS_FILE" bash "$ROOT/bench/falsealarm.sh" one "$OUT/one"
[ "$SET" != train ] && [ "$NGPU" -ge 2 ] && REPEATS=1 bash "$ROOT/bench/falsealarm.sh" split "$OUT/split"
"$PY" "$ROOT/bench/matrix_summary.py" "$OUT" | tee "$OUT/matrix.txt"
