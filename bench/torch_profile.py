"""torch.profiler around 20 training steps of MobileNetV2 (batch 64, bf16
autocast, channels_last, SGD): the top 10 operators by self CPU time, by CUDA
time and by memory (key_averages, as the old tool printed them) and a Chrome
trace, beside gpuctl's `--profile` tables of the same model on the same host
when a gpuctl report is given (bench/loader.sh passes its ddp job's).
Usage: python3 bench/torch_profile.py [--batch 64] [--steps 20] [--gpu 0]
       [--gpuctl REPORT.json] [--trace OUT.json]"""
import argparse
import json
import time

import torch
import torchvision
from torch.profiler import ProfilerActivity, profile


def gpuctl_tables(path):
    r = json.load(open(path))
    for n in r.get("nodes", []):
        for rk in n.get("ranks", []):
            p = (rk.get("train") or {}).get("profile")
            if not p:
                continue
            print(f"\ngpuctl --profile, rank {rk['rank']} on {n['name']}: {p['steps']} steps, "
                  f"{p['step_ms']:.1f} ms a step, trace {p['trace_path']} ({p['trace_bytes']} bytes)")
            for key, col, f in [("top_cpu", "SELF CPU MS", lambda o: f"{o['cpu_ms']:.3f}"),
                                ("top_cuda", "CUDA MS", lambda o: f"{o['cuda_ms']:.3f}"),
                                ("top_memory", "MEMORY B", lambda o: str(o['memory_bytes']))]:
                print(f"  {key}: {'OPERATOR':<60} {'CALLS':>6} {col:>12}")
                for o in p[key]:
                    print(f"  {'':<{len(key)}}  {o['name'][:60]:<60} {o['calls']:>6} {f(o):>12}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--gpuctl")
    ap.add_argument("--trace", default="torch-profile.json")
    a = ap.parse_args()
    dev = torch.device("cuda", a.gpu)
    torch.cuda.set_device(dev)
    torch.backends.cudnn.benchmark = False  # as gpuctl (worker use_cudnn_heuristics)
    net = torchvision.models.mobilenet_v2().to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(a.batch, 3, 224, 224, device=dev).to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (a.batch,), device=dev)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(net(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 profile_memory=True) as prof:
        t0 = time.time()
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
        ms = (time.time() - t0) * 1e3 / a.steps
    prof.export_chrome_trace(a.trace)
    ka = prof.key_averages()
    print(f"torch.profiler {torch.__version__}: mobilenet_v2 batch {a.batch}, {a.steps} steps, "
          f"{ms:.1f} ms a step while profiled, trace {a.trace}")
    for key in ["self_cpu_time_total", "self_device_time_total", "self_device_memory_usage"]:
        print(f"\ntop 10 by {key}")
        print(ka.table(sort_by=key, row_limit=10, max_name_column_width=60))
    if a.gpuctl:
        gpuctl_tables(a.gpuctl)


if __name__ == "__main__":
    main()
