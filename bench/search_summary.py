"""The table of bench/search.sh: per job its verdict, time, the search's rounds and tests, every
node and link blamed (FAIL findings) with its detail, and the links below the floor; for a
quick suite, each stage's verdicts. Usage: search_summary.py OUT"""
import glob
import json
import os
import sys

out = sys.argv[1]
times = {}
for line in open(f"{out}/runs.txt") if os.path.exists(f"{out}/runs.txt") else []:
    name, rc, ms = line.split()
    times[name] = f"{rc} {float(ms.rstrip('ms')) / 1000:.1f}s"


def job(name, r):
    rounds = r.get("bisect", [])
    tests = sum(len(x["groups"]) for x in rounds)
    links = r.get("links", [])
    below = [f"{l['a']}-{l['b']} {l['op']}" for l in links if l.get("below_floor")]
    print(f"{name}: {r['verdict']} ({r.get('job_id', '')}, {times.get(name, '?')}, job {r.get('duration_ms', 0) / 1000:.0f}s)"
          f" rounds={len(rounds)} tests={tests} links={len(links)} below_floor={below}")
    for f in r.get("findings", []):
        if f["level"] in ("fail", "warn"):
            print(f"   {f['level']:4} {f['metric']} {f['node'] or f['key']}: {f['detail'][:200]}")
    for n in r.get("nodes", []):
        if n["verdict"] not in ("pass", "warn"):
            print(f"   node {n['name']}: {n['verdict']} {n.get('reason', '')[:160]}")
    if links:
        by = {}
        for l in links:
            by.setdefault(l["op"], []).append(l["busbw_gbps"])
        print("   links " + "; ".join(f"{op} {min(v):.2f}-{max(v):.2f} GB/s" for op, v in sorted(by.items())))
    for note in r.get("notes", []):
        if note.startswith("search:") or note.startswith("links ("):
            print(f"   note: {note[:200]}")


for path in sorted(glob.glob(f"{out}/*.json")):
    name = os.path.basename(path)[:-5]
    try:
        r = json.load(open(path))
    except Exception as e:  # a job that did not answer is said, not skipped
        print(f"{name}: no report ({e})")
        continue
    if name.endswith(".suite"):
        print(f"{name}: suite {r.get('verdict')} ({times.get(name[:-6], '?')})")
        for st in r.get("stages", []):
            rep = st.get("report") or {}
            print(f"   stage {st['name']}: {st['state']} {rep.get('verdict', '')} {st.get('note', '')}")
            if st["name"] == "links" and rep:
                job(f"{name}-links", rep)
        continue
    if "verdict" in r:
        job(name, r)
    else:
        print(f"{name}: no verdict in the answer")
