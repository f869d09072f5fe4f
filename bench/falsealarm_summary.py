"""The table of bench/falsealarm.sh: per job its verdict and every FAIL and WARN finding (rule,
node, GPU, the detail's start), the findings tallied per rule, the NVLink counters and readings
the agent reported beside what NVML answered directly. Usage: falsealarm_summary.py OUT MODE"""
import collections
import json
import os
import sys

from common import job_reports

out, mode = sys.argv[1], sys.argv[2]
tally = collections.Counter()
jobs = 0
verdicts = collections.Counter()
print(f"== mode {mode}")
for name, r, why in job_reports(f"{out}/*.json"):
    if r is None:  # a job that did not answer is said, not skipped
        print(f"{name}: {why}")
        continue
    jobs += 1
    verdicts[r["verdict"]] += 1
    print(f"{name}: {r['verdict']} ({r.get('workload', '')}, {r.get('job_id', '')})")
    for f in r.get("findings", []):
        if f["level"] not in ("fail", "warn"):
            continue
        rule = f["rule"] or f["metric"]
        tally[(f["level"], f["metric"], rule)] += 1
        where = f"{f['node']}" + (f" gpu {f['gpu_index']}" if f.get("gpu_index") is not None else "")
        print(f"   {f['level']:4} {f['metric']}/{rule} {where}: {f['detail'][:230]}")
    pairs = r.get("gpu_pairs", [])
    if pairs:
        v = [p["gbps"] for p in pairs]
        slow = [f"{p['src_gpu']}->{p['dst_gpu']}" for p in pairs if p["verdict"] != "pass"]
        print(f"   pairs: {len(v)} {min(v):.1f}-{max(v):.1f} GB/s (ref {pairs[0]['reference_gbps']:.1f}); slow: {slow}")
        print("   pair passes: " + " ".join(
            f"{p['src_gpu']}->{p['dst_gpu']}={p['first_gbps']:.0f}/{p['repeat_gbps']:.0f}" for p in pairs))
    for n in r.get("nodes", []):
        for k in n.get("ranks", []):
            x = k.get("p2p")
            if x:
                print(f"   copies {n['name']} rank {k['rank']}: h2d {x['h2d_gbps']:.1f}/{x['h2d_repeat_gbps']:.1f}"
                      f" d2h {x['d2h_gbps']:.1f}/{x['d2h_repeat_gbps']:.1f} GB/s")
    for t in r.get("telemetry", []):
        print(
            f"   tele {t['node']} gpu {t['index']}: n={t['samples']} measured={t.get('measured_samples', 0)}"
            f" idle(all)={t['util_low_share']:.2f} idle(measured)={t.get('measured_util_low_share', 0):.2f}"
            f" down_samples={t.get('nvlink_down_samples', 0)} crc flit/data={t.get('nvlink_crc_flit_delta', 0)}"
            f"/{t.get('nvlink_crc_data_delta', 0)} replay={t.get('nvlink_replay_delta', 0)}"
            f" recovery={t.get('nvlink_recovery_delta', 0)}"
        )
print(f"\n{jobs} jobs: " + ", ".join(f"{v} {k}" for k, v in sorted(verdicts.items())))
for (level, metric, rule), n in sorted(tally.items()):
    print(f"  {n:3} {level} {metric}/{rule}")

try:
    rows = json.load(open(f"{out}/nvml-links.json"))
    gpus = sorted({x["gpu"] for x in rows})
    for g in gpus:
        r = [x for x in rows if x["gpu"] == g]
        worst = min(sum(1 for s in x["state"] if s == 1) for x in r)
        bad = sum(1 for x in r for c in x["rc"] if c != 0)
        mins = max((r[-1]["t"] - r[0]["t"]) / 60, 1e-9)

        def delta(k):
            return sum((b or 0) - (a or 0) for a, b in zip(r[0][k], r[-1][k]))

        print(
            f"NVML direct GPU {g}: {len(r)} samples, active links at worst {worst}/18, failed calls {bad},"
            f" per minute crc_flit {delta('flit') / mins:.0f} crc_data {delta('data') / mins:.0f}"
            f" replay {delta('replay') / mins:.1f} recovery {delta('recovery') / mins:.1f}"
        )
except FileNotFoundError:
    print("NVML direct: not sampled (nvml_links.py not in the bin folder)")
errs = open(f"{out}/agent-nvlink-read-errors.txt").read().strip() if os.path.exists(
    f"{out}/agent-nvlink-read-errors.txt") else ""
print("agent NVLink read errors:", errs[:1500] if errs else "none logged")
