#!/usr/bin/env bash
# A node speaks only for itself (issue 46), on a GPU host: the healthy path and
# two faults after the change, with what the reports judged by.
#
#   bench/trust.sh healthy OUT   one agent owning every GPU: stress, the nccl sweep,
#                                ddp and p2p (bench/falsealarm.sh one, REPEATS=1)
#   bench/trust.sh faults OUT    one agent per GPU (NCCL_HOSTID apart): a co-tenant's
#                                GEMMs on the last GPU, and TF32 off in cuBLAS on the
#                                last agent (bench/falsealarm.sh faults)
#
# Beside them, in the same call: the GPU names NVML and CUDA give (a result's
# device name now comes from the plan, i.e. from NVML through the agent, and
# floors are picked by it), and every report's notes on the fleet reference and
# the floors. OUT/trust.txt is the table.
set -u
MODE=${1:?healthy|faults}; OUT=${2:-/tmp/gpuctl-trust}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${GPUCTL_PY:-/opt/torch/.venv/bin/python3}
{
  echo "== GPU names, NVML (nvidia-smi) and CUDA (torch)"
  nvidia-smi --query-gpu=index,name --format=csv,noheader
  "$PY" -c 'import torch; [print(i, torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]'
} > "$OUT/names.txt" 2>&1
case "$MODE" in
  healthy) REPEATS=1 JOBS=${JOBS:-"stress nccl ddp p2p"} bash "$ROOT/bench/falsealarm.sh" one "$OUT/run" ;;
  faults) FAULTS=${FAULTS:-"cotenant tf32"} bash "$ROOT/bench/falsealarm.sh" faults "$OUT/run" ;;
  *) echo "unknown mode $MODE: healthy|faults" >&2; exit 2 ;;
esac
{
  cat "$OUT/names.txt"
  echo "== notes on references (fleet, floors, digests)"
  for f in "$OUT"/run/*.json; do
    case "$f" in *.suite.json|*nvml-links*) continue ;; esac
    "$PY" - "$f" <<'PY'
import json, os, sys
r = json.load(open(sys.argv[1]))
name = os.path.basename(sys.argv[1])[:-5]
notes = [n for n in r.get("notes", []) if "fleet reference" in n or "floor" in n]
if r.get("sdc_note"):
    notes.append(r["sdc_note"])
print(f"{name}: {r.get('verdict')}")
for n in notes:
    print(f"  {n[:240]}")
for node in r.get("nodes", []):
    for rk in node.get("ranks", []):
        print(f"  rank {rk.get('rank')} {node.get('name')} {rk.get('device')} {rk.get('device_name')}: {rk.get('verdict')} {rk.get('reason', '')[:160]}")
PY
  done
  echo "== refused messages (none expected from honest agents)"
  grep -h "refused:" "$OUT"/run/coordinator.log | head -20
  echo "== summary"
  cat "$OUT/run/summary.txt"
} > "$OUT/trust.txt" 2>&1
cat "$OUT/trust.txt"
