#!/usr/bin/env bash
# Performance verdicts on a GPU host, through the real path (docs/benchmarks.md):
# 1. a foreign process holds GPU memory when a job starts: the job's preflight
#    (taken at job start) names it with pid, name and MiB;
# 2. stress and nccl on every GPU, judged against the built-in floors;
# 3. stress again while another process runs GEMMs on the last GPU: that GPU is
#    named, the others pass.
# Usage: bench/verdicts.sh OUTDIR   (GPUCTL_BIN, GPUCTL_SP, GPUCTL_PY, STRESS_DURATION)
set -u
OUTDIR=${1:-/tmp/gpuctl-verdicts}; mkdir -p "$OUTDIR"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$BIN/gpuctl" ] || BIN=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PY=${GPUCTL_PY:-/opt/torch/.venv/bin/python3}
DUR=${STRESS_DURATION:-20s}
export NCCL_NVLS_ENABLE=0
export GPUCTL_COORDINATOR=http://127.0.0.1:7310
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
NGPU=$(nvidia-smi -L | grep -c '^GPU ')
LAST=$((NGPU - 1))
nvidia-smi --query-gpu=index,name,uuid,driver_version --format=csv > "$OUTDIR/gpus.csv"

"$BIN/gpuctl" local up --agents 1 --port 7310 --data-dir "$OUTDIR/fleet" \
  --agent-arg=--libtorch="$SP" > "$OUTDIR/local-up.txt" 2>&1 &
FLEET=$!
OTHER=""
cleanup() { [ -n "$OTHER" ] && kill "$OTHER" 2>/dev/null; kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null; }
trap cleanup EXIT
for _ in $(seq 1 120); do "$BIN/gpuctl" nodes 2>/dev/null | grep -q ready && break; sleep 0.5; done
"$BIN/gpuctl" nodes > "$OUTDIR/nodes.txt" 2>&1

job() { # name timeout args...
  local name=$1 t=$2; shift 2
  local t0; t0=$(date +%s%N)
  timeout "$t" "$BIN/gpuctl" submit "$@" --nodes 1 --wait -o json > "$OUTDIR/$name.json" 2> "$OUTDIR/$name.err"
  local rc=$?
  echo "$name rc=$rc wall=$(( ($(date +%s%N) - t0) / 1000000 ))ms" | tee -a "$OUTDIR/summary.txt"
  local id; id=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("job_id",""))' "$OUTDIR/$name.json" 2>/dev/null)
  [ -n "$id" ] && "$BIN/gpuctl" report "$id" > "$OUTDIR/$name.txt" 2>&1
}

# 1. Memory held by a stranger, started after the agent registered.
CUDA_VISIBLE_DEVICES=$LAST "$PY" -c '
import time, torch
x = torch.empty(20 * 2**30, dtype=torch.uint8, device="cuda")
print("holding", flush=True); time.sleep(600)' > "$OUTDIR/holder.txt" 2>&1 &
OTHER=$!
for _ in $(seq 1 60); do grep -q holding "$OUTDIR/holder.txt" && break; sleep 0.5; done
echo "holder pid $OTHER" >> "$OUTDIR/summary.txt"
job held 120 stress --duration 10s
kill "$OTHER"; wait "$OTHER" 2>/dev/null; OTHER=""

# 2. Healthy: floors for stress and for all_reduce inside the host.
job healthy 180 stress --duration "$DUR"
job nccl 300 nccl --ops all_reduce --min-bytes 64M --max-bytes 1G

# 3. The last GPU shared with a process running GEMMs the whole time.
CUDA_VISIBLE_DEVICES=$LAST "$PY" "$ROOT/bench/cotenant.py" > "$OUTDIR/gemm.txt" 2>&1 &
OTHER=$!
for _ in $(seq 1 60); do grep -q busy "$OUTDIR/gemm.txt" && break; sleep 0.5; done
job slowed 180 stress --duration "$DUR"
kill "$OTHER"; wait "$OTHER" 2>/dev/null; OTHER=""

"$PY" - "$OUTDIR" <<'PY' | tee -a "$OUTDIR/summary.txt"
import json, sys
d = sys.argv[1]
for name in ("held", "healthy", "nccl", "slowed"):
    try:
        r = json.load(open(f"{d}/{name}.json"))
    except Exception as e:
        print(name, "no report:", e); continue
    print(f"== {name}: verdict {r['verdict']}: {r['reason'][:200]}")
    for n in r["nodes"]:
        for k in n["ranks"]:
            s = k.get("stress") or {}
            if s:
                print(f"  rank {k['rank']} {k['device']} {k['verdict']}: median {s['tflops_median']:.1f} min {s['tflops_min']:.1f} TFLOP/s")
    for f in r.get("findings", []):
        print(f"  {f['level']} {f['metric']} {f['key']} gpu={f['gpu_index']} value={f['value']:.1f} ref={f['reference']:.1f} ({f['reference_kind']}): {f['detail'][:160]}")
    for c in r.get("preflight", []):
        if c["name"] == "gpu_processes":
            print(f"  preflight gpu_processes {c['verdict']}: {c['detail'][:200]}")
    for row in r.get("collectives", []):
        if row["bytes"] >= 1 << 30:
            print(f"  {row['op']} {row['bytes']} busbw {row['busbw_gbps']:.1f} GB/s")
PY
