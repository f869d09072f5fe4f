#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the main job on the embedded
# default: a local coordinator (redb store) and 4 agents with 2 CPU ranks each,
# a 30 s stress job and an nccl-style bandwidth sweep over the TCP ring, then
# the reports. On a GPU host the agents offer their GPUs instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-libtorch.sh
cargo build --release --workspace --locked

BIN="$PWD/target/release"
DATA="${GPUCTL_DATA_DIR:-$(mktemp -d /tmp/gpuctl-local.XXXXXX)}"
PORT="${GPUCTL_PORT:-7070}"
export GPUCTL_COORDINATOR="http://127.0.0.1:$PORT"

"$BIN/gpuctl" local up --agents 4 --cpu-ranks 2 --port "$PORT" --data-dir "$DATA" &
CLUSTER=$!
trap 'kill -TERM $CLUSTER 2>/dev/null; wait $CLUSTER 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  ready=$("$BIN/gpuctl" nodes --output json 2>/dev/null | python3 -c 'import json,sys; v=json.load(sys.stdin); v=v.get("nodes", v) if isinstance(v, dict) else v; print(sum(n.get("state") == "ready" for n in v))' 2>/dev/null || echo 0)
  [ "$ready" = 4 ] && break
  sleep 0.5
done
"$BIN/gpuctl" nodes

status=0
"$BIN/gpuctl" submit stress --duration 30s --nodes 4 --wait || status=$?
"$BIN/gpuctl" submit nccl --nodes 4 --max-bytes 4M --wait || status=$?
"$BIN/gpuctl" jobs
echo
echo "data (store, logs) kept in $DATA; reports again with: GPUCTL_COORDINATOR=$GPUCTL_COORDINATOR $BIN/gpuctl report JOB"
exit $status
