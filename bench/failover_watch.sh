#!/usr/bin/env bash
# Issue 51: `gpuctl-sim failover` with what it does not measure itself, sampled
# every second into OUT/cpu.log: each process's CPU ticks and resident MB (the
# coordinators, the simulator, etcd), the coordinators' CPU by thread name
# (`fleet` is the scheduler's), and the host's listen-queue overflows (nstat);
# from the kill on, `gpuctl jobs` against the standby every 0.5 s into
# OUT/cli.log (start, seconds, exit status), a client outside the simulator.
#
#   bench/failover_watch.sh [OUT]     (default /tmp/gpuctl-failover-watch)
#
# Env: BIN (target/release: the binaries), NODES (16384), JOB (90s), KILL_AFTER (15s), PROCS (2: the simulated
# fleet split over this many processes, each with its own open files; one
# process cannot hold 16,384 reconnecting agents here), FLEET_NICE (0: the
# simulated fleet shares the cores evenly; at 19 it starved and came back
# late), SIMLOG (the simulator's
# RUST_LOG, e.g. warn,gpuctl_sim::fleet=debug for each agent's reconnect
# times), KEEP=1 (keep etcd's data and the coordinators' logs), PERF=1 (perf
# record of the new leader, PERF_DELAY s after the kill for PERF_SECS s).
set -u
OUT=${1:-/tmp/gpuctl-failover-watch}; rm -rf "$OUT"; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd); BIN=${BIN:-$ROOT/target/release}
for b in gpuctl gpuctl-sim gpuctl-coordinator; do
  [ -x "$BIN/$b" ] || { echo "no $BIN/$b: cargo build --release first" >&2; exit 2; }
done
RUST_LOG=${SIMLOG:-warn} "$BIN/gpuctl-sim" failover ${KEEP:+--keep-dir} --nodes "${NODES:-16384}" \
  --gpus 8 --job "${JOB:-90s}" --kill-after "${KILL_AFTER:-15s}" --fleet-nice "${FLEET_NICE:-0}" \
  --fleet-processes "${PROCS:-2}" \
  --json "$OUT/failover.json" > "$OUT/sim.log" 2>&1 &
SIM=$!
watching=0
while kill -0 $SIM 2>/dev/null; do
  t=$(date +%s.%N)
  for p in $(pgrep -f 'gpuctl-coordinator|gpuctl-sim failover|gpuctl-sim fleet|etcd --name gpuctl-sim'); do
    [ -r "/proc/$p/stat" ] || continue
    echo "$t $p $(awk '{print $14 + $15}' "/proc/$p/stat") rss=$(awk '/VmRSS/{print int($2 / 1024)}' "/proc/$p/status") $(tr '\0' ' ' < "/proc/$p/cmdline" | cut -c1-60)"
  done >> "$OUT/cpu.log" 2>/dev/null
  echo "$t nstat $(nstat -az 2>/dev/null | awk '/ListenOverflows|ListenDrops/{printf "%s=%s ", $1, $2}')" >> "$OUT/cpu.log"
  for p in $(pgrep -f gpuctl-coordinator); do
    for tk in /proc/$p/task/*; do echo "$(cat "$tk/comm") $(awk '{print $14 + $15}' "$tk/stat")"; done 2>/dev/null \
      | awk '{a[$1] += $2} END {for (k in a) printf "%s=%d ", k, a[k]; print ""}' | sed "s/^/$t threads $p /" >> "$OUT/cpu.log"
  done
  if [ $watching = 0 ] && [ "$(pgrep -fc gpuctl-coordinator)" = 1 ] && grep -q "killing the leader" "$OUT/sim.log"; then
    watching=1
    B=$(grep -o "standby http://[0-9.:]*" "$OUT/sim.log" | cut -d' ' -f2)
    ( for _ in $(seq 150); do
        s=$(date +%s.%N); timeout 60 "$BIN/gpuctl" --coordinator "$B" jobs > /dev/null 2>&1; rc=$?
        echo "$s $(awk -v s="$s" -v e="$(date +%s.%N)" 'BEGIN{print e - s}') $rc" >> "$OUT/cli.log"; sleep 0.5
      done ) &
    # The new leader's connections by peer address, 20 s after the kill.
    ( sleep 20; ss -tn state established "( sport = :${B##*:} )" \
        | awk 'NR > 1 {split($4, a, ":"); n[a[1]]++} END {for (k in n) m[n[k]]++; for (c in m) print m[c], "addresses hold", c, "connections each"}' > "$OUT/peers.log" ) &
    if [ -n "${PERF:-}" ]; then
      pid=$(pgrep -f gpuctl-coordinator)
      ( sleep "${PERF_DELAY:-12}"; perf record -F 199 -g -p "$pid" -o "$OUT/perf.data" -- sleep "${PERF_SECS:-30}" > "$OUT/perf.log" 2>&1 ) &
    fi
  fi
  sleep 1
done
wait $SIM; rc=$?
grep -v "DEBUG\|INFO\|gpuctl_sim::ranks" "$OUT/sim.log" | tail -15
exit $rc
