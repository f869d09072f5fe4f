#!/usr/bin/env bash
# Issue 51: the coordinator's memory when the fleet falls behind, its jobs
# fail and their results come late (docs/benchmarks.md, "The coordinator's
# memory with failed jobs and late results"). `gpuctl-sim bench` with the
# simulator, not the coordinator it starts, slowed by cgroup v1 (root):
#  - SIM_CPU_PCT: the simulator held to this % of one core all along
#    (cpu.cfs_quota_us); 0 (default): not held;
#  - FREEZE_S: once the short jobs begin, the simulator frozen this long
#    (freezer.state), FREEZES times 20 s apart: past the bench's 60 s
#    --node-timeout its nodes are lost, the job fails, and its ranks send
#    their results after its end.
# Every 2 s OUT/samples.txt gets the coordinator's resident memory, the
# allocator's live bytes, gpuctl_jobs_held_ranks and gpuctl_jobs_stored_bytes.
#
#   bench/late_results.sh [OUT]      (default /tmp/gpuctl-late)
#
# Env: NODES (2048), SHORT_JOBS (3), LONG (30s), SIM_CPU_PCT (0), FREEZE_S
# (70; 0: no freeze), FREEZES (2), BIN (as bench/scale.sh). Build first:
#   cargo build --release -p gpuctl-sim -p gpuctl-coordinator
set -u
OUT=${1:-/tmp/gpuctl-late}; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
NODES=${NODES:-2048}; SHORT_JOBS=${SHORT_JOBS:-3}; LONG=${LONG:-30s}
SIM_CPU_PCT=${SIM_CPU_PCT:-0}; FREEZE_S=${FREEZE_S:-70}; FREEZES=${FREEZES:-2}
CPU=/sys/fs/cgroup/cpu; FRZ=/sys/fs/cgroup/freezer
for d in "$CPU" "$FRZ"; do
  [ -w "$d" ] || { echo "$d is not there or not writable: run as root on a cgroup v1 host" >&2; exit 2; }
done
ulimit -n "$(ulimit -Hn)"
CG=$CPU/gpuctl-late; FZ=$FRZ/gpuctl-late; mkdir -p "$CG" "$FZ"
echo THAWED > "$FZ/freezer.state"
if [ "$SIM_CPU_PCT" -gt 0 ]; then
  echo 100000 > "$CG/cpu.cfs_period_us"; echo $((SIM_CPU_PCT * 1000)) > "$CG/cpu.cfs_quota_us"
else
  echo -1 > "$CG/cpu.cfs_quota_us"
fi
echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg), $(date -u +%FT%TZ)" | tee "$OUT/host.txt"
"$BIN/gpuctl-sim" bench --nodes "$NODES" --gpus 8 --idle 5s --long "$LONG" \
  --short-jobs "$SHORT_JOBS" --short 5s --fleet-nice 0 --json "$OUT/bench.json" \
  > "$OUT/bench.txt" 2> "$OUT/bench.err" &
SIM=$!
trap 'echo THAWED > "$FZ/freezer.state"; kill $SIM 2>/dev/null; wait $SIM 2>/dev/null; rmdir "$CG" "$FZ" 2>/dev/null' EXIT
echo $SIM > "$CG/cgroup.procs"
CO=""
for _ in $(seq 100); do CO=$(pgrep -P $SIM -f gpuctl-coordinator) && break; sleep 0.1; done
[ -n "$CO" ] || { echo "the bench started no coordinator: $OUT/bench.err" >&2; exit 1; }
# The coordinator back out of the simulator's groups: only the fleet falls behind.
echo "$CO" > "$CPU/cgroup.procs"; echo "$SIM" > "$FZ/cgroup.procs"
METRICS=$(tr '\0' ' ' < /proc/$CO/cmdline | grep -o 'metrics-listen [^ ]*' | cut -d' ' -f2)
if [ "$FREEZE_S" -gt 0 ]; then
  (
    until grep -q "short jobs in a row" "$OUT/bench.err" 2>/dev/null; do sleep 1; done
    for _ in $(seq "$FREEZES"); do
      sleep 3; echo "$(date -u +%T) frozen" >> "$OUT/freeze.log"
      echo FROZEN > "$FZ/freezer.state"; sleep "$FREEZE_S"; echo THAWED > "$FZ/freezer.state"
      echo "$(date -u +%T) thawed" >> "$OUT/freeze.log"; sleep 20
    done
  ) &
fi
while kill -0 "$CO" 2>/dev/null; do
  m=$(curl -s --max-time 5 "http://$METRICS/metrics")
  g() { echo "$m" | awk -v n="$1" '$1==n{print $2}'; }
  heap=$(echo "$m" | awk '/^gpuctl_coordinator_heap_bytes\{kind="allocated"\}/{print $2}')
  echo "$(date -u +%T) rss_kb=$(awk '/VmRSS/{print $2}' /proc/$CO/status 2>/dev/null) heap=$heap" \
    "held_ranks=$(g gpuctl_jobs_held_ranks) stored_bytes=$(g gpuctl_jobs_stored_bytes)" \
    "load=$(cut -d' ' -f1 /proc/loadavg)"
  sleep 2
done > "$OUT/samples.txt"
wait $SIM; echo "bench: exit $?"; cat "$OUT/bench.txt"
awk '{split($2,a,"="); if (a[2]>m) m=a[2]} END {printf "coordinator resident, most: %.0f MB\n", m/1024}' "$OUT/samples.txt"
