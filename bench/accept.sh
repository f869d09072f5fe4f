#!/usr/bin/env bash
# Acceptance suites on one GPU host. `quick`: two agents, each owning one GPU
# with its own NCCL_HOSTID (two "nodes" whose NCCL traffic takes the network
# path, as between hosts, so the pairs stage has a pair). `standard`: one
# agent owning every GPU (one node: the pairs stage is skipped). SUITE=FILE
# runs that suite file instead of the level on the one agent (LEVEL names
# the output files), e.g. SUITE=bench/standard-short.toml bench/accept.sh
# standard-short OUT: the standard suite's stages in ~7 minutes.
# Usage: bench/accept.sh LEVEL OUTDIR   (GPUCTL_BIN, GPUCTL_SP, SUITE)
set -u
LEVEL=${1:-quick}; OUT=${2:-/tmp/gpuctl-accept}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$B/gpuctl" ] || B=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PORT=7330
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT NCCL_NVLS_ENABLE=0
"$B/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$OUT/coordinator" \
  --metrics-listen off > "$OUT/coordinator.log" 2>&1 &
PIDS=$!
if [ "$LEVEL" = quick ]; then
  for i in 0 1; do
    NCCL_HOSTID=gpuctl-host-$i "$B/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name gpu-$i \
      --gpus $i --libtorch "$SP" --work-dir "$OUT/agent-$i" --metrics-listen off \
      > "$OUT/agent-$i.log" 2>&1 &
    PIDS="$PIDS $!"
  done
  N=2
else
  "$B/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name host-0 --libtorch "$SP" \
    --work-dir "$OUT/agent-0" --metrics-listen off > "$OUT/agent-0.log" 2>&1 &
  PIDS="$PIDS $!"
  N=1
fi
trap 'kill $PIDS 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 1 120); do [ "$("$B/gpuctl" nodes 2>/dev/null | grep -c ready)" = $N ] && break; sleep 0.5; done
"$B/gpuctl" nodes > "$OUT/nodes.txt" 2>&1
start=$(date +%s)
if [ -n "${SUITE:-}" ]; then WHICH=(--suite "$SUITE"); else WHICH=(--level "$LEVEL"); fi
"$B/gpuctl" accept --nodes all "${WHICH[@]}" -o json > "$OUT/$LEVEL.json" 2> "$OUT/$LEVEL.err"
rc=$?
echo "$LEVEL rc=$rc in $(( $(date +%s) - start )) s" | tee "$OUT/summary.txt"
id=$(grep -o '"suite": *"[^"]*"' "$OUT/$LEVEL.json" | head -1 | cut -d'"' -f4)
python3 - "$OUT/$LEVEL.json" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
s = json.load(open(sys.argv[1]))
print("suite", s["suite"], s["level"], "verdict", s["verdict"], s["message"])
for n in s["nodes"]:
    print("  node", n["name"], n["verdict"], n["stage"], n["reason"][:200])
for st in s["stages"]:
    t = (st["finished_unix_ms"] - st["started_unix_ms"]) / 1000 if st["finished_unix_ms"] else 0
    r = st["report"] or {}
    print("  stage %-11s %-9s %-10s %-9s nodes %d  %5.1f s  %s %s" % (
        st["name"], st["workload"], st["job_id"] or "-", st["state"], len(st["nodes"]), t,
        r.get("verdict", "-"), st["note"]))
EOF
"$B/gpuctl" fleet > "$OUT/fleet.txt" 2>&1
for j in $(python3 -c "import json; print(' '.join(s['job_id'] for s in json.load(open('$OUT/$LEVEL.json'))['stages'] if s['job_id']))"); do
  "$B/gpuctl" report "$j" > "$OUT/report-$j.txt" 2>&1
done
cat "$OUT/fleet.txt"
