"""gpuctl `ddp` ResNet-50 against PyTorch DDP under torchrun at its best setting
(bf16 autocast + channels_last, batch 256 per GPU; DDP plain and with
static_graph + gradient_as_bucket_view, the better one counts), on 1, 2 and 4
GPUs (those this host has), in one run.

Prints per-GPU rates, scaling efficiency (per-GPU rate on n GPUs / on 1 GPU)
for both, and gpuctl's overlap (share of communication hidden under backward,
communication and exposed communication per step, from the report's ranks).
Targets (issue 15): on 2 and 4 GPUs gpuctl's scaling >= PyTorch's, and
gpuctl's per-GPU rate >= 1.02 x PyTorch's best, as PASS/FAIL lines.
Usage: python3 bench/ddp.py [--steps 40] [--json OUT]"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import Fleet, PY, gpu_count, gpu_env, host_facts, ratio  # noqa: E402

TORCH_DDP = r"""
import sys, time, torch, torchvision, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl"); r = dist.get_rank(); w = dist.get_world_size(); torch.cuda.set_device(r)
bs, steps, variant = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
torch.backends.cudnn.benchmark = False  # as gpuctl (worker use_cudnn_heuristics)
net = torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last)
extra = dict(static_graph=True, gradient_as_bucket_view=True) if variant == "static" else {}
m = DDP(net, device_ids=[r], **extra)
x = torch.randn(bs, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (bs,), device="cuda")
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(m(x), y)
    loss.backward(); opt.step()
for _ in range(10): step()
torch.cuda.synchronize(); dist.barrier(); t = time.perf_counter()
for _ in range(steps): step()
torch.cuda.synchronize(); s = time.perf_counter() - t
rate = torch.tensor([bs * steps / s], device="cuda", dtype=torch.float64)
dist.all_reduce(rate)
if r == 0: print(f"PER_GPU {rate.item() / w:.1f}", flush=True)
dist.destroy_process_group()
"""

VARIANTS = ("plain", "static")
SCALING_COUNTS = (2, 4)
PER_GPU_TARGET = 1.02


def torch_ddp(n, bs, steps, variant):
    script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    script.write(TORCH_DDP)
    script.close()
    torchrun = os.path.join(os.path.dirname(PY), "torchrun")
    out = subprocess.run([torchrun, "--standalone", f"--nproc_per_node={n}", script.name, str(bs), str(steps),
                          variant], env=gpu_env(), capture_output=True, text=True)
    os.unlink(script.name)
    m = re.search(r"PER_GPU ([0-9.]+)", out.stdout)
    if not m:
        print(out.stdout[-2000:], out.stderr[-3000:], file=sys.stderr)
        return float("nan")
    return float(m.group(1))


def gpuctl_ddp(n, bs, steps, precision):
    agent_args = ["--gpus=" + ",".join(str(i) for i in range(n))]
    fleet = Fleet(agent_args=agent_args)
    try:
        return fleet.submit("ddp", "--model", "resnet50", "--precision", precision, "--batch-size", str(bs),
                            "--steps", str(steps), "--channels-last", "true")
    finally:
        fleet.close()


def train_ranks(rep):
    """The `train` object of every rank of a report, in report order."""
    return [r.get("train") or {} for nd in rep.get("nodes", []) for r in nd.get("ranks", [])]


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def overlap_of(trains):
    """gpuctl's communication per step, exposed part and overlap share, each
    averaged over the ranks (None where the report does not carry it)."""
    def field(k):
        vals = [t.get(k) for t in trains]
        return mean(vals) if any(v is not None for v in vals) else None
    return {"comm_ms_per_step": field("comm_ms_per_step"),
            "comm_exposed_ms_per_step": field("comm_exposed_ms_per_step"),
            "overlap_share": field("overlap_share"),
            "overlap_share_per_rank": [t.get("overlap_share") for t in trains]}


def fmt(x, spec=".3f"):
    return "n/a" if x is None else format(x, spec)


def verdict(ok):
    return "PASS" if ok else "FAIL"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="PyTorch DDP settings tried (plain, static); the best counts")
    ap.add_argument("--json")
    a = ap.parse_args()
    facts = host_facts()
    have = gpu_count()
    counts = sorted({1, 2, 4} & set(range(1, have + 1)))
    variants = [v for v in a.variants.split(",") if v]
    rows = []
    print(f"# ddp resnet50 batch {a.batch_size}/GPU: gpuctl ({a.precision}) vs torch DDP (bf16 autocast + "
          f"channels_last; {', '.join(variants)}), {facts['gpus']} x {facts['gpu']}, driver {facts['driver']}, "
          f"{facts['date']}")
    for n in counts:
        refs = {v: torch_ddp(n, a.batch_size, a.steps, v) for v in variants}
        good = {v: x for v, x in refs.items() if x == x}
        best_v = max(good, key=good.get) if good else None
        best = good[best_v] if best_v else float("nan")
        rep = gpuctl_ddp(n, a.batch_size, a.steps, a.precision)
        trains = train_ranks(rep)
        mine = mean([t.get("samples_per_s", 0.0) for t in trains]) if trains else 0.0
        ov = overlap_of(trains)
        rows.append({"gpus": n, "gpuctl_per_gpu": mine, "torch_per_gpu": best, "torch_best_setting": best_v,
                     "torch_by_setting": refs, "ratio": ratio(mine, best),
                     "gpuctl_inrun_scaling": mean([t.get("scaling_efficiency") for t in trains]) if n > 1 else None,
                     **ov, "verdict": rep.get("verdict"), "state": rep.get("state")})
        print(f"{n} GPU(s): gpuctl {mine:.0f} img/s/GPU, torch {best:.0f} img/s/GPU ({best_v}; "
              + ", ".join(f"{v} {x:.0f}" for v, x in refs.items())
              + f"), ratio {ratio(mine, best):.3f}; gpuctl verdict {rep.get('verdict')} {rep.get('reason', '')}")
        if n > 1:
            print(f"  gpuctl overlap: share {fmt(ov['overlap_share'])} (per rank "
                  f"{', '.join(fmt(x) for x in ov['overlap_share_per_rank'])}), comm "
                  f"{fmt(ov['comm_ms_per_step'], '.2f')} ms/step, exposed "
                  f"{fmt(ov['comm_exposed_ms_per_step'], '.2f')} ms/step")
    one = next((r for r in rows if r["gpus"] == 1), None)
    checks = []
    for row in rows:
        if one and row["gpus"] > 1:
            row["gpuctl_scaling"] = ratio(row["gpuctl_per_gpu"], one["gpuctl_per_gpu"])
            row["torch_scaling"] = ratio(row["torch_per_gpu"], one["torch_per_gpu"])
            print(f"scaling efficiency on {row['gpus']} GPUs (per-GPU rate against 1 GPU): gpuctl "
                  f"{row['gpuctl_scaling']:.3f} (in-run baseline {fmt(row['gpuctl_inrun_scaling'])}), "
                  f"torch {row['torch_scaling']:.3f}")
            if row["gpus"] in SCALING_COUNTS:
                ok = row["gpuctl_scaling"] >= row["torch_scaling"]
                checks.append((f"scaling on {row['gpus']} GPUs: gpuctl {row['gpuctl_scaling']:.3f} >= torch "
                               f"{row['torch_scaling']:.3f}", ok))
        ok = row["gpuctl_per_gpu"] >= PER_GPU_TARGET * row["torch_per_gpu"]
        checks.append((f"per-GPU on {row['gpus']} GPU(s): gpuctl/torch best {row['ratio']:.3f} >= "
                       f"{PER_GPU_TARGET}", ok))
    missing = [n for n in SCALING_COUNTS if n not in counts]
    for what, ok in checks:
        print(f"{verdict(ok)} {what}")
    if missing:
        print(f"(not checked: scaling on {', '.join(map(str, missing))} GPUs; this host has {have})")
    if a.json:
        json.dump({"facts": facts, "rows": rows,
                   "checks": [{"check": w, "pass": ok} for w, ok in checks]}, open(a.json, "w"), indent=1)
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
