#!/usr/bin/env bash
# Issue 51, the largest fleets: one coordinator against a simulated fleet of
# NODES × GPUS (16,384 × 8 by default), two parts (docs/benchmarks.md):
#
#  1. `gpuctl-sim bench`: register, idle, a LONG stress job on every node,
#     SHORT_JOBS short ones; every result in, sessions lost, the report's
#     delay after the last result, the coordinator's peak memory, the CLI's
#     p50/p99 (nodes, jobs, status, fleet) during the jobs, and what takes
#     the store (keys by prefix, per job). OUT/bench.txt, OUT/bench.json.
#  2. `gpuctl nodes -o json` and `gpuctl fleet -o json` (the real CLI) over
#     the whole fleet (`gpuctl-sim fleet` against a coordinator of its own):
#     bytes and seconds, which a fleet past one gRPC message lists page by
#     page. OUT/listing.txt.
#
#   bench/scale.sh [OUT]      (default /tmp/gpuctl-scale)
#
# Env: NODES (16384), GPUS (8), IDLE (10s), LONG (2m; the issue's headline
# is 15m), SHORT_JOBS (5), SHORT (5s), PART (both|bench|listing),
# FLEET_NICE (the simulated fleet's nice, default 19: on a host other work keeps
# busy at nice 0, 0 keeps the fleet from starving and losing its sessions),
# CLI_NICE (the nice of the thread making the CLI calls, -20..19; below 0 as root:
# a person's CLI has a machine of its own, here it shares two cores with the fleet),
# COORDINATOR_LOG (the coordinator's RUST_LOG; gpuctl-sim's default when unset),
# CONNECTIONS (HTTP/2 connections the simulated agents share; default one each,
# as a real fleet: on a starved host, fewer keep their pings answered),
# KEEP_DIR (set: keep the coordinator's store and log; bench.err names the folder),
# BIN (target/release, or $CARGO_TARGET_DIR/release). Build first:
#   cargo build --release -p gpuctl-sim -p gpuctl-coordinator -p gpuctl-cli
set -u
OUT=${1:-/tmp/gpuctl-scale}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
NODES=${NODES:-16384}; GPUS=${GPUS:-8}; IDLE=${IDLE:-10s}; LONG=${LONG:-2m}
SHORT_JOBS=${SHORT_JOBS:-5}; SHORT=${SHORT:-5s}; PART=${PART:-both}
for b in gpuctl-sim gpuctl-coordinator gpuctl; do
  [ -x "$BIN/$b" ] || { echo "no $BIN/$b: build it (see the top of $0) or set BIN" >&2; exit 2; }
done
# An agent's connection each, and the coordinator's as many again.
ulimit -n "$(ulimit -Hn)"
echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)" | tee "$OUT/host.txt"
# The host's load all along: other work on a shared host is part of the figures.
( while :; do echo "$(date -u +%T) $(cut -d' ' -f1-3 /proc/loadavg)"; sleep 10; done > "$OUT/load.txt" ) &
LOADER=$!
trap 'kill $LOADER 2>/dev/null' EXIT

if [ "$PART" = both ] || [ "$PART" = bench ]; then
  /usr/bin/time -v "$BIN/gpuctl-sim" bench --nodes "$NODES" --gpus "$GPUS" --idle "$IDLE" \
    --long "$LONG" --short-jobs "$SHORT_JOBS" --short "$SHORT" --json "$OUT/bench.json" ${KEEP_DIR:+--keep-dir} \
    ${FLEET_NICE:+--fleet-nice "$FLEET_NICE"} ${CONNECTIONS:+--connections "$CONNECTIONS"} \
    ${CLI_NICE:+--cli-nice "$CLI_NICE"} \
    ${COORDINATOR_LOG:+--coordinator-log "$COORDINATOR_LOG"} \
    > "$OUT/bench.txt" 2> "$OUT/bench.err"
  echo "bench: exit $?"; cat "$OUT/bench.txt"
  grep -E "Maximum resident|Elapsed" "$OUT/bench.err" | sed 's/^\s*/  simulator: /'
fi

if [ "$PART" = both ] || [ "$PART" = listing ]; then
  PORT=7450; URL=http://127.0.0.1:$PORT; PIDS=""
  trap 'kill $LOADER $PIDS 2>/dev/null; wait 2>/dev/null' EXIT
  rm -rf "$OUT/listing-store"
  "$BIN/gpuctl-coordinator" --listen 127.0.0.1:$PORT --data-dir "$OUT/listing-store" \
    --metrics-listen off --max-connections-per-peer 10000000 --node-timeout 60s \
    > "$OUT/listing-coordinator.log" 2>&1 &
  PIDS="$!"
  "$BIN/gpuctl-sim" fleet --nodes "$NODES" --gpus "$GPUS" --coordinator "$URL" \
    > "$OUT/listing-fleet.log" 2>&1 &
  PIDS="$PIDS $!"
  export GPUCTL_COORDINATOR=$URL
  count='import json,sys; d=json.load(sys.stdin); print(len(d if isinstance(d, list) else d.get("nodes", [])))'
  for _ in $(seq 600); do
    n=$("$BIN/gpuctl" nodes -o json 2>/dev/null | python3 -c "$count" 2>/dev/null)
    [ "${n:-0}" -ge "$NODES" ] && break
    sleep 1
  done
  # One job on every node, so that `fleet` has a run per node to list.
  "$BIN/gpuctl" submit stress --duration 5s --nodes all --wait > "$OUT/listing-job.txt" 2>&1
  {
    echo "nodes registered: $n of $NODES; a 5 s stress job on all: exit $?"
    for verb in nodes fleet; do
      for i in 1 2 3; do
        s=$(date +%s.%N)
        bytes=$("$BIN/gpuctl" $verb -o json | wc -c); rc=${PIPESTATUS[0]}
        e=$(date +%s.%N)
        printf 'gpuctl %s -o json: exit %s, %s bytes, %.2f s\n' "$verb" "$rc" "$bytes" "$(echo "$e - $s" | bc)"
      done
    done
  } | tee "$OUT/listing.txt"
fi
