#!/usr/bin/env bash
# Issue 39 on a GPU host: gpuctl's loader sweep against PyTorch's own
# DataLoader sweep, same model (MobileNetV2), batch (64), host work per sample
# (WORK augment passes) and GPU, one after the other, both tables printed.
#
#   bench/loader.sh OUT
#
# gpuctl: a coordinator and one agent owning GPU $GPU (0), sampling NVML every
# 0.5 s (--sample-interval 500ms, as the old tool), `ddp --loader-workers
# $WORKERS --loader-steps $STEPS --loader-work $WORK --profile`; OUT/gpuctl.json
# is the report, OUT/gpuctl.txt its table (LOADER and PROFILE sections).
# torch: bench/loader_torch.py, OUT/torch.json and OUT/torch.txt. Then
# bench/torch_profile.py, torch.profiler's top 10 on the same model beside gpuctl's
# (Named torch_profile.py: a script named profile.py beside loader_torch.py
# shadows the standard library's profile module that torch imports.)
# (OUT/profile.txt). OUT/loader.tar.gz holds everything.
# GPUS=0,1,2,3 gives gpuctl's agent those GPUs instead: one rank per GPU, all
# sweeping at once on the one host (each rank alone, no communication), which
# is the acceptance question (can this host's CPUs feed all its GPUs?);
# PyTorch's sweep stays on GPU $GPU.
# CALIBRATE=1 runs PyTorch's sweep first and gives gpuctl the CPU a sample
# cost DataLoader's workers (--loader-cpu-us, the median of its settings with
# workers), so that both make a sample for the same CPU; then prints the two
# curves side by side with gpuctl ÷ DataLoader per setting (OUT/ratio.txt).
# Env: GPUCTL_BIN (.devbin), GPUCTL_SP, GPUCTL_PY, WORKERS (0,2,4,8), STEPS
# (100), WORK (2), BATCH (64), GPU (0), GPUS ($GPU); TORCH=0 runs gpuctl's
# sweep alone (another build's beside one full run, in the same call);
# CPU_US sets --loader-cpu-us by hand; TORCH_PROFILE=0 leaves out torch.profiler.
set -u
OUT=${1:-/tmp/gpuctl-loader}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$B/gpuctl" ] || B=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PY=${GPUCTL_PY:-/opt/torch/.venv/bin/python3}
WORKERS=${WORKERS:-0,2,4,8}; STEPS=${STEPS:-100}; WORK=${WORK:-2}; BATCH=${BATCH:-64}; GPU=${GPU:-0}
GPUS=${GPUS:-$GPU}
PORT=7390
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
PIDS=""
trap 'kill $PIDS 2>/dev/null; wait 2>/dev/null' EXIT
"$B/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$OUT/coordinator" \
  --metrics-listen off > "$OUT/coordinator.log" 2>&1 &
PIDS=$!
"$B/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name "gpu-host" --gpus "$GPUS" \
  --libtorch "$SP" --work-dir "$OUT/agent" --metrics-listen off --sample-interval 500ms \
  > "$OUT/agent.log" 2>&1 &
PIDS="$PIDS $!"
for _ in $(seq 1 120); do "$B/gpuctl" nodes 2>/dev/null | grep -q ready && break; sleep 0.5; done
"$B/gpuctl" nodes > "$OUT/nodes.txt" 2>&1

CPU_US=${CPU_US:-0}
if [ "${CALIBRATE:-0}" = 1 ]; then
  echo "== torch DataLoader (first: its workers' CPU a sample calibrates gpuctl's)"
  "$PY" "$ROOT/bench/loader_torch.py" --workers "$WORKERS" --steps "$STEPS" --batch "$BATCH" \
    --work "$WORK" --gpu "$GPU" --json "$OUT/torch.json" 2>&1 | tee "$OUT/torch.txt"
  CPU_US=$("$PY" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["sample_cpu_us"] or 0))' "$OUT/torch.json")
  echo "DataLoader's workers: $CPU_US µs of CPU a sample: gpuctl --loader-cpu-us $CPU_US"
fi

t0=$(date +%s%N)
timeout 900 "$B/gpuctl" submit ddp --nodes 1 --model mobilenet_v2 --batch-size "$BATCH" \
  --precision bf16 --steps 20 --warmup-steps 5 --loader-workers "$WORKERS" \
  --loader-steps "$STEPS" --loader-work "$WORK" --loader-cpu-us "$CPU_US" --profile --profile-steps 20 \
  --wait -o json > "$OUT/gpuctl.json" 2> "$OUT/gpuctl.err"
echo "gpuctl rc=$? $(( ($(date +%s%N) - t0) / 1000000 ))ms" | tee "$OUT/runs.txt"
JOB=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["job_id"])' "$OUT/gpuctl.json")
"$B/gpuctl" report "$JOB" > "$OUT/gpuctl.txt" 2>&1
mkdir -p "$OUT/traces"
"$B/gpuctl" profile "$JOB" --trace "$OUT/traces" > "$OUT/gpuctl-profile.txt" 2>&1
echo "== gpuctl (job $JOB)"
sed -n '/^LOADER (/,/^$/p' "$OUT/gpuctl.txt"

if [ "${TORCH:-1}" = 0 ]; then exit 0; fi
if [ "${CALIBRATE:-0}" != 1 ]; then
  echo "== torch DataLoader"
  "$PY" "$ROOT/bench/loader_torch.py" --workers "$WORKERS" --steps "$STEPS" --batch "$BATCH" \
    --work "$WORK" --gpu "$GPU" --json "$OUT/torch.json" 2>&1 | tee "$OUT/torch.txt"
fi
echo "== gpuctl ÷ DataLoader per setting (rank 0)"
"$PY" - "$OUT/gpuctl.json" "$OUT/torch.json" <<'PY' | tee "$OUT/ratio.txt"
import json, sys
g, t = (json.load(open(p)) for p in sys.argv[1:3])
rank = g["nodes"][0]["ranks"][0]
mine = {s["workers"]: s["samples_per_s"] for tr in [rank["train"], *rank.get("more_train", [])]
        for s in tr.get("loader", [])}
print(f"{'WORKERS':>7} {'GPUCTL':>9} {'DATALOADER':>10} {'RATIO':>6}")
for r in t["rows"]:
    w, ref = r["workers"], r["samples_per_s"]
    got = mine.get(w)
    ratio = f"{got / ref:.3f}" if got and ref else "-"
    print(f"{w:>7} {got or 0:>9.1f} {ref:>10.1f} {ratio:>6}")
best = lambda d: max(d, key=d.get)
print(f"best: gpuctl {best(mine)} workers, DataLoader {t['best_workers']} workers")
PY

if [ "${TORCH_PROFILE:-1}" = 1 ]; then
  echo "== profile: torch.profiler beside gpuctl --profile"
  "$PY" "$ROOT/bench/torch_profile.py" --batch "$BATCH" --steps 20 --gpu "$GPU" \
    --gpuctl "$OUT/gpuctl.json" --trace "$OUT/traces/torch-profile.json" 2>&1 | tee "$OUT/profile.txt"
fi
tar czf "$OUT/loader.tar.gz" -C "$OUT" --exclude loader.tar.gz --exclude coordinator . 2>/dev/null
