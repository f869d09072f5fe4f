"""gpuctl `stress` bf16 TFLOP/s against PyTorch torch.matmul on the same GPUs, in one run.
Target: ratio >= 0.98. Usage: python3 bench/stress.py [--size 8192] [--duration 30s]"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import Fleet, PY, gpu_env, host_facts, ratio  # noqa: E402

TORCH_MM = r"""
import sys, time, torch
n, secs = int(sys.argv[1]), float(sys.argv[2])
torch.manual_seed(1234)
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5): a @ b
torch.cuda.synchronize()
best, t_end = [], time.time() + secs
while time.time() < t_end:
    t = time.perf_counter(); k = 0
    while time.perf_counter() - t < 1.0:
        for _ in range(10): a @ b
        torch.cuda.synchronize(); k += 10
    best.append(2 * n**3 * k / (time.perf_counter() - t) / 1e12)
best.sort()
print(best[len(best) // 2])
"""


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="8192")
    ap.add_argument("--duration", default="30s")
    ap.add_argument("--json")
    a = ap.parse_args()
    secs = float(a.duration.rstrip("s"))
    ref = float(subprocess.run([PY, "-c", TORCH_MM, a.size, str(secs)], env=gpu_env(),
                               capture_output=True, text=True, check=True).stdout.strip())
    fleet = Fleet()
    try:
        rep = fleet.submit("stress", "--duration", a.duration, "--precision", "bf16", "--size", a.size)
    finally:
        fleet.close()
    facts = host_facts()
    print(f"# stress bf16 n={a.size}: gpuctl vs torch.matmul, {facts['gpus']} x {facts['gpu']}, "
          f"driver {facts['driver']}, {facts['date']}; state {rep.get('state')} verdict {rep.get('verdict')}")
    rows = []
    for node in rep.get("nodes", []):
        for r in node.get("ranks", []):
            s = r.get("stress") or {}
            q = ratio(s.get("tflops_median", 0), ref)
            rows.append({"rank": r["rank"], "device": r.get("device"), "tflops_median": s.get("tflops_median"),
                         "torch_tflops": ref, "ratio": q, "verdict": r.get("verdict")})
            print(f"rank {r['rank']} {r.get('device')}: gpuctl {s.get('tflops_median', 0):.1f} TFLOP/s "
                  f"(min {s.get('tflops_min', 0):.1f} max {s.get('tflops_max', 0):.1f}), torch {ref:.1f}, "
                  f"ratio {q:.3f} {'ok' if q >= 0.98 else 'BELOW TARGET'}; check {r.get('verdict')}")
    if a.json:
        json.dump({"facts": facts, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
