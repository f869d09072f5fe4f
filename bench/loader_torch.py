"""PyTorch's own DataLoader sweep, the reference for gpuctl's loader sweep
(`ddp --loader-workers`, bench/loader.sh runs both on the same host): the
same model, batch and host work per sample (a seeded image of bytes 8/7 of
the side, then WORK passes of random crop, random flip and normalisation into
fp32 CHW), pin_memory=True, a non_blocking copy, torchvision's MobileNetV2 in
bf16 autocast with channels_last, SGD. GPU utilisation sampled every 0.5 s by
nvidia-smi in the background; per setting: samples/s, the share of time the
loop waited for a batch, utilisation mean, standard deviation and idle share
(under 10 %), the process's CPU cores (its live workers' too), the time, and
with workers the CPU µs a sample cost them (US/SAMPLE; the JSON's median is
what bench/loader.sh CALIBRATE=1 gives gpuctl's --loader-cpu-us).
Usage: python3 bench/loader_torch.py [--workers 0,2,4,8] [--steps 100]
       [--batch 64] [--work 2] [--gpu 0] [--json OUT]"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import threading
import time

import numpy as np
import torch
import torchvision

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


class Synthetic(torch.utils.data.Dataset):
    def __init__(self, n, side, work, classes=1000):
        self.n, self.side, self.work, self.classes = n, side, work, classes
        self.full = side * 8 // 7

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        decoded = rng.integers(0, 256, (self.full, self.full, 3), dtype=np.uint8)
        s = self.side
        for _ in range(max(1, self.work)):
            top, left = rng.integers(0, self.full - s + 1, 2)
            img = decoded[top:top + s, left:left + s]
            if rng.integers(0, 2):
                img = img[:, ::-1]
            out = (img.transpose(2, 0, 1).astype(np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(np.ascontiguousarray(out)), int(rng.integers(0, self.classes))


def sampler(gpu, stop, out):
    p = subprocess.Popen(
        ["nvidia-smi", "-i", str(gpu), "--query-gpu=utilization.gpu",
         "--format=csv,noheader,nounits", "-lms", "500"],
        stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if stop.is_set():
            break
        try:
            out.append((time.time(), float(line.strip())))
        except ValueError:
            pass
    p.terminate()


def live_children_cpu_s():
    """CPU seconds of this process's live children (DataLoader's workers):
    RUSAGE_CHILDREN counts only children that have exited and been waited
    for, so running workers were missing from the CPU column (0.2-1.3 cores
    at 8-16 workers)."""
    me, tick, total = os.getpid(), os.sysconf("SC_CLK_TCK"), 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                head, rest = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        # After the command: state, ppid, ..., utime (12th), stime (13th);
        # the GPU sampler (nvidia-smi) is not the loader's.
        if int(fields[1]) == me and not head.endswith("(nvidia-smi"):
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


def cpu_s():
    """This process's CPU seconds, its live children's and its reaped ones'."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    c = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime + c.ru_utime + c.ru_stime + live_children_cpu_s()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", default="0,2,4,8")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--work", type=int, default=2)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda", a.gpu)
    torch.cuda.set_device(dev)
    torch.backends.cudnn.benchmark = False  # as gpuctl (worker use_cudnn_heuristics)
    net = torchvision.models.mobilenet_v2().to(dev, memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    util, stop = [], threading.Event()
    threading.Thread(target=sampler, args=(a.gpu, stop, util), daemon=True).start()
    rows = []
    for w in [int(x) for x in a.workers.split(",")]:
        ds = Synthetic(a.batch * (a.steps + 2), 224, a.work)
        dl = torch.utils.data.DataLoader(ds, batch_size=a.batch, num_workers=w,
                                         pin_memory=True, persistent_workers=False,
                                         prefetch_factor=2 if w else None)
        it = iter(dl)

        def step(x, y):
            x = x.to(dev, non_blocking=True).to(memory_format=torch.channels_last)
            y = y.to(dev, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = loss_fn(net(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()

        step(*next(it))  # warmup, and the workers' start
        c0, l0, t0, wait = cpu_s(), live_children_cpu_s(), time.time(), 0.0
        for _ in range(a.steps):
            w0 = time.time()
            x, y = next(it)
            wait += time.time() - w0
            step(x, y)
        t1 = time.time()
        workers_cpu = live_children_cpu_s() - l0
        u = [v for t, v in util if t0 <= t <= t1]
        row = {
            "workers": w, "samples_per_s": a.batch * a.steps / (t1 - t0),
            "data_wait_share": wait / (t1 - t0), "cpu_cores": (cpu_s() - c0) / (t1 - t0),
            # What a sample cost the workers: the figure gpuctl's
            # --loader-cpu-us takes (none with 0 workers: the main process
            # also runs the training step).
            "workers_cpu_cores": workers_cpu / (t1 - t0) if w else None,
            "sample_cpu_us": workers_cpu / (a.batch * a.steps) * 1e6 if w else None,
            "time_s": t1 - t0, "gpu_samples": len(u),
            "util_mean": statistics.fmean(u) if u else None,
            "util_std": statistics.pstdev(u) if len(u) > 1 else None,
            "idle_share": sum(v < 10 for v in u) / len(u) if u else None,
            "util": u,
        }
        rows.append(row)
        del it, dl
    stop.set()
    best = max(rows, key=lambda r: r["samples_per_s"])
    print(f"torch DataLoader sweep: mobilenet_v2 batch {a.batch} work {a.work}, GPU {a.gpu}")
    print(f"{'WORKERS':>7} {'SAMPLES/S':>10} {'DATA WAIT':>9} {'CPU CORES':>9} "
          f"{'GPU UTIL':>8} {'STD':>6} {'IDLE':>5} {'TIME S':>7} {'US/SAMPLE':>9}")
    f = lambda v, s: "-" if v is None else s.format(v)  # noqa: E731
    for r in rows:
        print(f"{r['workers']:>7} {r['samples_per_s']:>10.1f} {r['data_wait_share']*100:>8.0f}% "
              f"{r['cpu_cores']:>9.2f} {f(r['util_mean'], '{:.0f}%'):>8} "
              f"{f(r['util_std'], '{:.1f}'):>6} {f(r['idle_share'] and r['idle_share']*100, '{:.0f}%'):>5} "
              f"{r['time_s']:>7.1f} {f(r['sample_cpu_us'], '{:.0f}'):>9}{'  *' if r is best else ''}")
    if a.json:
        costs = sorted(r["sample_cpu_us"] for r in rows if r["sample_cpu_us"])
        with open(a.json, "w") as fh:
            json.dump({"rows": rows, "best_workers": best["workers"],
                       "sample_cpu_us": costs[len(costs) // 2] if costs else None,
                       "torch": torch.__version__, "cpus": os.cpu_count()}, fh)

if __name__ == "__main__":
    main()
