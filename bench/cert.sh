#!/usr/bin/env bash
# Signed acceptance certificates on a GPU host (issue 50, docs/acceptance.md):
# one agent owning every GPU runs bench/cert-short.toml through `gpuctl
# accept`; the node's certificate, its evidence and the coordinator's public
# key are exported into OUT, with `cert show` and `cert check` beside them
# and NVML's own reading of the GPUs (nvidia-smi) to hold the identity
# against. Verify offline elsewhere:
#   gpuctl cert verify OUT/cert.json --key OUT/key.pem --evidence OUT/evidence
# Usage: bench/cert.sh OUT   (GPUCTL_BIN, GPUCTL_SP)
set -u
OUT=${1:-/tmp/gpuctl-cert}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${GPUCTL_BIN:-$ROOT/.devbin}
[ -x "$B/gpuctl" ] || B=$ROOT/target/release
SP=${GPUCTL_SP:-/opt/torch/.venv/lib/python3.12/site-packages}
PORT=7340
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$SP/torch/lib:$SP/nvidia/nccl/lib:$SP/nvidia/cu13/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=index,name,uuid,serial,vbios_version,inforom.img,driver_version,pci.bus_id --format=csv \
  > "$OUT/nvidia-smi.csv" 2>&1
nvidia-smi topo -m > "$OUT/topo.txt" 2>&1
"$B/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$OUT/coordinator" \
  --metrics-listen off > "$OUT/coordinator.log" 2>&1 &
PIDS=$!
"$B/gpuctl-agent" --coordinator "$GPUCTL_COORDINATOR" --name host-0 --libtorch "$SP" \
  --work-dir "$OUT/agent-0" --metrics-listen off > "$OUT/agent-0.log" 2>&1 &
PIDS="$PIDS $!"
trap 'kill $PIDS 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 1 120); do "$B/gpuctl" nodes 2>/dev/null | grep -q ready && break; sleep 0.5; done
start=$(date +%s)
"$B/gpuctl" accept --nodes all --suite "$ROOT/bench/cert-short.toml" > "$OUT/accept.txt" 2>&1
echo "accept rc=$? in $(( $(date +%s) - start )) s" | tee "$OUT/summary.txt"
"$B/gpuctl" cert key > "$OUT/key.pem" 2>> "$OUT/summary.txt"
"$B/gpuctl" cert export host-0 --out "$OUT/cert.json" --evidence "$OUT/evidence" >> "$OUT/summary.txt" 2>&1
echo "export rc=$?" >> "$OUT/summary.txt"
"$B/gpuctl" cert show "$OUT/cert.json" > "$OUT/show.txt" 2>&1
"$B/gpuctl" cert show "$OUT/cert.json" -o html --evidence "$OUT/evidence" > "$OUT/cert.html" 2>> "$OUT/summary.txt"
"$B/gpuctl" cert verify "$OUT/cert.json" --key "$OUT/key.pem" --evidence "$OUT/evidence" > "$OUT/verify.txt" 2>&1
echo "verify (on the host) rc=$?" >> "$OUT/summary.txt"
"$B/gpuctl" cert check --node host-0 > "$OUT/check.txt" 2>&1
echo "check rc=$?" >> "$OUT/summary.txt"
"$B/gpuctl" fleet > "$OUT/fleet.txt" 2>&1
cat "$OUT/summary.txt" "$OUT/show.txt" | head -80
