"""gpuctl `ddp` ResNet-50 against PyTorch DDP under torchrun at its best setting
(bf16 autocast + channels_last, batch 256 per GPU), on 1 GPU and on every GPU of
this host, in one run. Target: >= 0.95 per GPU. Usage: python3 bench/ddp.py"""
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
bs, steps = int(sys.argv[1]), int(sys.argv[2]); torch.backends.cudnn.benchmark = True
m = DDP(torchvision.models.resnet50().cuda().to(memory_format=torch.channels_last), device_ids=[r])
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
if r == 0: print(f"PER_GPU {bs*steps/s:.1f}", flush=True)
dist.destroy_process_group()
"""


def torch_ddp(n, bs, steps):
    script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    script.write(TORCH_DDP)
    script.close()
    torchrun = os.path.join(os.path.dirname(PY), "torchrun")
    out = subprocess.run([torchrun, "--standalone", f"--nproc_per_node={n}", script.name, str(bs), str(steps)],
                         env=gpu_env(), capture_output=True, text=True)
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--json")
    a = ap.parse_args()
    facts = host_facts()
    counts = sorted({1, 2, gpu_count()} & set(range(1, gpu_count() + 1)))
    rows = []
    print(f"# ddp resnet50 batch {a.batch_size}/GPU: gpuctl ({a.precision}) vs torch DDP (bf16 autocast + "
          f"channels_last), {facts['gpus']} x {facts['gpu']}, driver {facts['driver']}, {facts['date']}")
    for n in counts:
        ref = torch_ddp(n, a.batch_size, a.steps)
        rep = gpuctl_ddp(n, a.batch_size, a.steps, a.precision)
        per = [r.get("train", {}).get("samples_per_s", 0) for nd in rep.get("nodes", []) for r in nd.get("ranks", [])]
        mine = sum(per) / len(per) if per else 0.0
        q = ratio(mine, ref)
        rows.append({"gpus": n, "gpuctl_per_gpu": mine, "torch_per_gpu": ref, "ratio": q,
                     "verdict": rep.get("verdict"), "state": rep.get("state")})
        print(f"{n} GPU(s): gpuctl {mine:.0f} img/s/GPU, torch {ref:.0f} img/s/GPU, ratio {q:.3f} "
              f"{'ok' if q >= 0.95 else 'BELOW TARGET'}; gpuctl verdict {rep.get('verdict')} {rep.get('reason', '')}")
    for row in rows[1:]:
        for who in ("gpuctl_per_gpu", "torch_per_gpu"):
            print(f"scaling efficiency on {row['gpus']} GPUs, {who.split('_')[0]}: "
                  f"{ratio(row[who], rows[0][who]):.3f} (per-GPU rate against 1 GPU)")
    if a.json:
        json.dump({"facts": facts, "rows": rows}, open(a.json, "w"), indent=1)


if __name__ == "__main__":
    main()
