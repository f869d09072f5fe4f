"""gpuctl `nccl` against NVIDIA nccl-tests on this host, in one run.

Builds nccl-tests (NCCL_TESTS_SRC, default .fetched/nccl-tests) against the NCCL
that PyTorch ships, runs every op from 1 MiB to 1 GiB on all GPUs, runs the same
sweep through gpuctl (local fleet, one agent owning every GPU), and prints busbw
ratios. Target: >= 0.98 for every op at >= 64 MiB.
Usage: python3 bench/nccl.py [--max-bytes 1G] [--json OUT]"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
from common import Fleet, SP, ROOT, gpu_count, gpu_env, host_facts, ratio  # noqa: E402

OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "alltoall", "sendrecv"]


def build_nccl_tests():
    src = os.environ.get("NCCL_TESTS_SRC", f"{ROOT}/.fetched/nccl-tests")
    nccl = f"{SP}/nvidia/nccl"
    link = f"{nccl}/lib/libnccl.so"
    if not os.path.exists(link):
        os.symlink("libnccl.so.2", link)
    if not os.path.exists(f"{src}/build/all_reduce_perf"):
        subprocess.run(["make", "-C", src, "-j16", "MPI=0", f"NCCL_HOME={nccl}",
                        "CUDA_HOME=/usr/local/cuda",
                        # Hopper only: the default builds every architecture and takes minutes.
                        "NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90"],
                       check=True, stdout=subprocess.DEVNULL)
    return f"{src}/build"


def parse_nccl_tests(text):
    rows = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 13 and parts[0].isdigit():
            size = int(parts[0])
            rows[size] = {"time_us": float(parts[5]), "algbw": float(parts[6]),
                          "busbw": float(parts[7]), "wrong": parts[8],
                          "busbw_ip": float(parts[11]), "wrong_ip": parts[12]}
    return rows


def run_one(n, a, build):
    ref, version = {}, []
    for op in OPS:
        out = subprocess.run([f"{build}/{op}_perf", "-b", a.min_bytes, "-e", a.max_bytes, "-f", "2",
                              "-g", str(n), "-w", a.warmup, "-n", a.iters, "-d", "float"],
                             env=gpu_env(), capture_output=True, text=True)
        if out.returncode != 0:
            print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
        ref[op] = parse_nccl_tests(out.stdout)
        version = version or [l for l in out.stdout.splitlines() if "NCCL version" in l]
    fleet = Fleet(agent_args=["--gpus=" + ",".join(str(i) for i in range(n))])
    try:
        rep = fleet.submit("nccl", "--min-bytes", a.min_bytes, "--max-bytes", a.max_bytes,
                           "--factor", "2", "--iters", a.iters, "--warmup", a.warmup, "--dtype", "float")
    finally:
        fleet.close()
    facts = host_facts()
    facts["nccl"] = rep.get("nccl_version") or (version[0].strip() if version else "?")
    print(f"# nccl on {n} GPUs: gpuctl vs nccl-tests, {facts['gpu']}, driver {facts['driver']}, "
          f"NCCL {facts['nccl']}, {facts['date']}; gpuctl state {rep.get('state')} verdict {rep.get('verdict')}")
    print(f"{'op':<15}{'bytes':>12}{'gpuctl busbw':>14}{'nccl-tests':>12}{'ratio':>8}{'  #wrong'}")
    results, worst = [], {}
    for row in rep.get("collectives", []):
        op, size = row["op"], row["bytes"]
        r = ref.get(op, {}).get(size)
        if not r:
            continue
        q = ratio(row["busbw_gbps"], r["busbw"])
        results.append({"op": op, "bytes": size, "gpuctl_busbw": row["busbw_gbps"],
                        "nccl_tests_busbw": r["busbw"], "ratio": q, "wrong": row["wrong"]})
        if size >= 64 << 20:
            worst[op] = min(worst.get(op, 9.9), q)
        print(f"{op:<15}{size:>12}{row['busbw_gbps']:>14.2f}{r['busbw']:>12.2f}{q:>8.3f}  {row['wrong']}")
    print(f"# worst ratio at >= 64 MiB on {n} GPUs (target 0.98):")
    for op in OPS:
        if op in worst:
            print(f"  {op:<15}{worst[op]:.3f}  {'ok' if worst[op] >= 0.98 else 'BELOW TARGET'}")
    return {"gpus": n, "facts": facts, "rows": results, "worst": worst}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-bytes", default="1M")
    ap.add_argument("--max-bytes", default="1G")
    ap.add_argument("--iters", default="20")
    ap.add_argument("--warmup", default="5")
    ap.add_argument("--gpus", default="", help="GPU counts to run, e.g. 2,4 (default: all GPUs)")
    ap.add_argument("--json")
    a = ap.parse_args()
    counts = [int(x) for x in a.gpus.split(",") if x] or [gpu_count()]
    build = build_nccl_tests()
    out = [run_one(n, a, build) for n in counts]
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
