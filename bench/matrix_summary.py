"""The table of bench/matrix.sh: per job its verdict, FAIL and WARN findings, wall time, and the
share of rank 0's timeline in each declared phase kind (measured, set-up, warm-up, verify, sweep).
Jobs named req-* are requests that cannot run: their row says whether the job's error names the
request and that no node failed; they are not counted among the healthy verdicts.
Usage: matrix_summary.py OUT"""
import collections
import glob
import os
import sys

from common import job_reports

out = sys.argv[1]


def path_of(name):
    found = glob.glob(f"{out}/*/{name}.err")
    return found[0] if found else f"{out}/{name}.err"

verdicts = collections.Counter()
findings = collections.Counter()
rows = []
for name, r, why in job_reports(f"{out}/*/*.json"):
    if r is None and name.startswith("req-"):
        # Refused at submit: what the CLI said (falsealarm.sh keeps it in NAME.err).
        err = open(path_of(name)).read().strip().splitlines() if os.path.exists(path_of(name)) else []
        rows.append(f"{name:24} refused at submit: {err[-1][:200] if err else why}")
        continue
    if r is None:  # a job that did not answer is said, not skipped
        rows.append(f"{name:24} {why}")
        verdicts["no report"] += 1
        continue
    if name.startswith("req-"):
        # A request that cannot run: the job's error, and no node failed for it.
        blamed = [n["name"] for n in r.get("nodes", []) if n.get("verdict") == "fail"]
        said = [f["detail"] for f in r.get("findings", []) if f["metric"] == "request"]
        rows.append(f"{name:24} {r['verdict']:5} request finding: {said[0][:160] if said else 'none'}; nodes failed: {blamed or 'none'}")
        continue
    verdicts[r["verdict"]] += 1
    bad = [f for f in r.get("findings", []) if f["level"] in ("fail", "warn")]
    for f in bad:
        findings[(f["level"], f["rule"] or f["metric"])] += 1
    wall = (r.get("finished_unix_ms", 0) - r.get("started_unix_ms", 0)) / 1e3
    kinds = collections.Counter()
    ranks = [k for n in r.get("nodes", []) for k in n.get("ranks", [])]
    marks = ranks[0].get("phases", []) if ranks else []
    for a, b in zip(marks, marks[1:]):
        kinds[a.get("kind", "phase")] += b["unix_ms"] - a["unix_ms"]
    span = sum(kinds.values()) or 1
    share = " ".join(f"{k} {v / span:.0%}" for k, v in sorted(kinds.items()))
    # Outside the measured phase, as a share of the job's wall time (the
    # budget of issue 47: under 10 %).
    outside = 1 - kinds.get("measured", 0) / 1e3 / wall if wall > 0 else 0
    rows.append(f"{name:24} {r['verdict']:5} {wall:6.1f}s  outside-measured {outside:4.0%}  {share}")
    unjudged = [n for n in r.get("notes", []) if n.startswith("judged against nothing")]
    if unjudged:
        rows.append(f"{'':26}note: {unjudged[0][:200]}")
    for f in bad:
        where = f"{f['node']}" + (f" gpu {f['gpu_index']}" if f.get("gpu_index") is not None else "")
        rows.append(f"{'':26}{f['level']} {f['rule'] or f['metric']} {where}: {f['detail'][:160]}")
print("\n".join(rows))
print("\n" + ", ".join(f"{v} {k}" for k, v in sorted(verdicts.items())) + f" of {sum(verdicts.values())} jobs")
for (level, rule), n in sorted(findings.items()):
    print(f"  {n:3} {level} {rule}")
