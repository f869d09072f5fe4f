#!/usr/bin/env bash
# Submit -> every rank running, with pre-started workers off and on (issue 13:
# at most 0.5 s on a local 4-agent fleet). Starts a local CPU fleet
# (`gpuctl local up`, 4 agents with its default 2 CPU ranks each) once with
# `--prestart-workers false`, once with it on, submits JOBS short stress jobs
# on every node each time, one after the other with PAUSE seconds between
# them, and reads for each job:
#   submitted  the job's created_unix_ms (gpuctl status)
#   scheduled  its started_unix_ms (the coordinator placed it and sent the assignments)
#   spawned    the last "worker started" line of the agents' logs (assignment
#              delivered, worker process started or standby handed its job)
#   running    the last rank's first phase mark (`gpuctl report -o json`,
#              ranks[].phases[0]: the worker's main is up, libraries loaded)
# and prints p50/max of submitted -> running for off and on, their ratio, and
# the medians of each step.
# Usage: bench/startup.sh [OUTDIR]   (GPUCTL_BIN: binaries, default: build
#        target/release; JOBS=10, PAUSE=3, AGENTS=4, CPU_RANKS=2, PORT=7340)
set -u
OUTDIR=${1:-/tmp/gpuctl-startup}; rm -rf "$OUTDIR"; mkdir -p "$OUTDIR"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
JOBS=${JOBS:-10}; PAUSE=${PAUSE:-3}; AGENTS=${AGENTS:-4}; CPU_RANKS=${CPU_RANKS:-2}
PORT=${PORT:-7340}
if [ -n "${GPUCTL_BIN:-}" ]; then
  BIN=$GPUCTL_BIN
else
  (cd "$ROOT" && cargo build --release -p gpuctl-cli -p gpuctl-coordinator -p gpuctl-agent -p gpuctl-worker) || exit 1
  BIN=$ROOT/target/release
fi
export GPUCTL_COORDINATOR=http://127.0.0.1:$PORT

for prestart in false true; do
  dir=$OUTDIR/prestart-$prestart; mkdir -p "$dir/jobs"
  "$BIN/gpuctl" local up --agents "$AGENTS" --cpu-ranks "$CPU_RANKS" --port "$PORT" \
    --data-dir "$dir/fleet" --agent-arg=--prestart-workers="$prestart" > "$dir/local-up.txt" 2>&1 &
  FLEET=$!
  trap 'kill -TERM $FLEET 2>/dev/null; wait $FLEET 2>/dev/null' EXIT
  for _ in $(seq 1 120); do
    [ "$("$BIN/gpuctl" nodes 2>/dev/null | grep -c ' ready ')" = "$AGENTS" ] && break
    sleep 0.5
  done
  sleep "$PAUSE" # standbys (when on) load their libraries
  for i in $(seq 1 "$JOBS"); do
    id=$("$BIN/gpuctl" submit stress --duration 2s --nodes "$AGENTS")
    "$BIN/gpuctl" watch "$id" > /dev/null 2>&1
    "$BIN/gpuctl" status "$id" -o json > "$dir/jobs/$id.status.json" 2>/dev/null
    "$BIN/gpuctl" report "$id" -o json > "$dir/jobs/$id.report.json" 2>/dev/null
    sleep "$PAUSE"
  done
  kill -TERM $FLEET; wait $FLEET 2>/dev/null
  trap - EXIT
done

python3 - "$OUTDIR" "$AGENTS" "$CPU_RANKS" "$PAUSE" <<'EOF'
import datetime, glob, json, os, re, statistics, sys

out, agents, cpu_ranks, pause = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]

def spawned(fleet):
    """job id -> unix ms of each 'worker started' line in the agents' logs."""
    times = {}
    for log in glob.glob(os.path.join(fleet, "logs", "*.log")):
        for line in open(log, errors="replace"):
            if "worker started" not in line:
                continue
            m = re.search(r"job=(\S+)", line)
            ts = datetime.datetime.fromisoformat(line.split()[0].replace("Z", "+00:00"))
            times.setdefault(m.group(1), []).append(ts.timestamp() * 1000)
    return times

def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]

summary = {}
for prestart in ("false", "true"):
    d = os.path.join(out, f"prestart-{prestart}")
    starts = spawned(os.path.join(d, "fleet"))
    rows = []
    for st in sorted(glob.glob(os.path.join(d, "jobs", "*.status.json"))):
        status = json.load(open(st))
        report = json.load(open(st.replace(".status.", ".report.")))
        ranks = [r for n in report["nodes"] for r in n["ranks"]]
        first = [min(p["unix_ms"] for p in r["phases"]) for r in ranks if r.get("phases")]
        if len(first) != len(ranks) or not ranks:
            print(f"{status['id']}: a rank without phase marks; skipped", file=sys.stderr)
            continue
        c, s = status["created_unix_ms"], status["started_unix_ms"]
        sp = max(starts.get(status["id"], [s]))
        rows.append(dict(total=max(first) - c, sched=s - c, spawn=sp - s, run=max(first) - sp,
                         ok=report["verdict"] == "pass", ranks=len(ranks)))
    summary[prestart] = rows
    tot = [r["total"] for r in rows]
    print(f"prestart {prestart:5}: {len(rows)} jobs x {rows[0]['ranks'] if rows else 0} ranks, "
          f"{sum(r['ok'] for r in rows)} PASS; submit -> all running p50 {pct(tot, 50):.0f} ms, "
          f"max {max(tot):.0f} ms  (medians: scheduled {statistics.median(r['sched'] for r in rows):.0f} ms, "
          f"workers spawned {statistics.median(r['spawn'] for r in rows):.0f} ms, "
          f"first mark {statistics.median(r['run'] for r in rows):.0f} ms)")
off = [r["total"] for r in summary["false"]]
on = [r["total"] for r in summary["true"]]
if off and on:
    print(f"on/off: p50 {pct(on, 50) / pct(off, 50):.2f}, max {max(on) / max(off):.2f} "
          f"({agents} agents x {cpu_ranks} CPU ranks, {pause} s between jobs)")
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=1)
EOF
