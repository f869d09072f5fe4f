#!/usr/bin/env bash
# Issue 51: what the real agent costs its node, idle and during a job (the
# target: at most 1 % of a core and 50 MB resident). A local CPU fleet
# (`gpuctl local up`, AGENTS agents with CPU_RANKS ranks each), then for
# each agent process: its own CPU time (utime + stime of /proc/PID/stat,
# not its workers') over SECONDS of idle and over a stress job of SECONDS,
# as % of one core, and its resident memory (VmRSS, and VmHWM the peak).
#
#   bench/agent_cost.sh [OUT]     (default /tmp/gpuctl-agent-cost)
#
# Env: BIN (a folder with gpuctl, gpuctl-coordinator, gpuctl-agent and
# gpuctl-worker; default $CARGO_TARGET_DIR/release or target/release),
# AGENTS (2), CPU_RANKS (1), SECONDS_EACH (60), PORT (7460). On a GPU host:
# CPU_RANKS=0 AGENTS=1 LIBTORCH=<site-packages of PyTorch>: the agent then
# reads NVML for each GPU every second, and the job runs on the GPUs
# (nvidia-smi is read during it, a second view of the same GPUs).
set -u
OUT=${1:-/tmp/gpuctl-agent-cost}; rm -rf "$OUT"; mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
AGENTS=${AGENTS:-2}; CPU_RANKS=${CPU_RANKS:-1}; SECS=${SECONDS_EACH:-60}; PORT=${PORT:-7460}
LOCAL_ARGS=()
[ "$CPU_RANKS" != 0 ] && LOCAL_ARGS+=(--cpu-ranks "$CPU_RANKS")
[ -n "${LIBTORCH:-}" ] && LOCAL_ARGS+=("--agent-arg=--libtorch=$LIBTORCH")
for b in gpuctl gpuctl-coordinator gpuctl-agent gpuctl-worker; do
  [ -x "$BIN/$b" ] || { echo "no $BIN/$b: build it or set BIN" >&2; exit 2; }
done
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT
TICK=$(getconf CLK_TCK)
"$BIN/gpuctl" local up --agents "$AGENTS" "${LOCAL_ARGS[@]}" --port "$PORT" \
  --data-dir "$OUT/fleet" > "$OUT/local-up.txt" 2>&1 &
FLEET=$!
trap 'kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null' EXIT
for _ in $(seq 120); do
  [ "$("$BIN/gpuctl" nodes 2>/dev/null | grep -c ' ready ')" = "$AGENTS" ] && break
  sleep 0.5
done
AGENT_PIDS=$(pgrep -f "$BIN/gpuctl-agent" | tr '\n' ' ')
[ -n "$AGENT_PIDS" ] || { echo "no agent process found" >&2; exit 1; }
echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); agents: $AGENT_PIDS" | tee "$OUT/cost.txt"

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
kb() { awk -v k="$2:" '$1 == k {print $2}' "/proc/$1/status"; }

# measure LABEL: every agent's CPU over SECS, with whatever runs meanwhile.
measure() {
  declare -A t0
  for p in $AGENT_PIDS; do t0[$p]=$(cpu_ticks "$p"); done
  s=$(date +%s.%N); sleep "$SECS"; e=$(date +%s.%N)
  for p in $AGENT_PIDS; do
    t1=$(cpu_ticks "$p")
    # awk, not bc: GPU hosts often lack bc.
    printf '%-6s agent %s: CPU %.3f %% of a core (%d ticks in %.1f s; ps says %s in all), RSS %d MB (peak %d MB)\n' "$1" "$p" \
      "$(awk -v a="${t0[$p]}" -v b="$t1" -v k="$TICK" -v s="$s" -v e="$e" 'BEGIN{print (b - a) / k / (e - s) * 100}')" \
      "$((t1 - ${t0[$p]}))" "$(awk -v s="$s" -v e="$e" 'BEGIN{print e - s}')" "$(ps -o time= -p "$p")" \
      $(( $(kb "$p" VmRSS) / 1024 )) $(( $(kb "$p" VmHWM) / 1024 ))
  done | tee -a "$OUT/cost.txt"
}

sleep 5 # registration settles
measure idle
id=$("$BIN/gpuctl" submit stress --duration "$((SECS + 10))s" --nodes "$AGENTS")
echo "job $id: stress for $((SECS + 10)) s on every node" | tee -a "$OUT/cost.txt"
sleep 5
if command -v nvidia-smi > /dev/null && [ "$CPU_RANKS" = 0 ]; then
  nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader \
    | sed 's/^/nvidia-smi during the job: GPU /' | tee -a "$OUT/cost.txt"
fi
measure job
"$BIN/gpuctl" watch "$id" > /dev/null 2>&1
"$BIN/gpuctl" status "$id" | head -3 | tee -a "$OUT/cost.txt"
