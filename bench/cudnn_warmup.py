"""What cuDNN's autotuning costs a short CNN job, and what it buys.

Issue 47: warm-up is 82-94 % of a 30-step CNN job's wall time. This trains
the catalogue's CNNs in PyTorch as gpuctl's ddp does on one GPU (batch 256,
channels_last, bf16 autocast or fp32) with torch.backends.cudnn.benchmark on
and off, each in a fresh process (the autotuner's cache lives in the
process), and prints the first steps' seconds and the steady rate.

    python bench/cudnn_warmup.py [--models resnet50,mobilenet_v2,resnet18] [--steps 30]
"""
import argparse, json, subprocess, sys, time

CHILD = r'''
import json, sys, time, torch, torchvision
model, prec, bench, steps, bs = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5])
t0 = time.perf_counter()
torch.backends.cudnn.benchmark = bench
net = getattr(torchvision.models, model)().cuda().to(memory_format=torch.channels_last)
opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
x = torch.randn(bs, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
y = torch.randint(0, 1000, (bs,), device="cuda")
torch.cuda.synchronize()
ready = time.perf_counter() - t0
def step():
    opt.zero_grad(set_to_none=True)
    if prec == "bf16":
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(net(x), y)
    else:
        loss = torch.nn.functional.cross_entropy(net(x), y)
    loss.backward()
    opt.step()
times = []
for i in range(steps):
    s = time.perf_counter(); step(); torch.cuda.synchronize(); times.append(time.perf_counter() - s)
print(json.dumps({"ready_s": ready, "times": times}))
'''

ap = argparse.ArgumentParser()
ap.add_argument("--models", default="resnet50,mobilenet_v2,resnet18,resnet152")
ap.add_argument("--precisions", default="bf16,fp32")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--batch-size", type=int, default=256)
a = ap.parse_args()
print(f"# cudnn.benchmark on vs off, batch {a.batch_size}, {a.steps} steps, one fresh process each")
print("| model | precision | benchmark | set-up s | step 1 s | steps 2-5 s | steady step ms (median of last 20) | 30-step job s | samples/s |")
print("|---|---|---|---|---|---|---|---|---|")
for m in a.models.split(","):
    for p in a.precisions.split(","):
        for b in ("1", "0"):
            out = subprocess.run([sys.executable, "-c", CHILD, m, p, b, str(a.steps), str(a.batch_size)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                print(f"| {m} | {p} | {b} | failed: {out.stderr.strip().splitlines()[-1] if out.stderr else out.returncode} |")
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            t = r["times"]
            steady = sorted(t[-20:])[len(t[-20:]) // 2]
            print(f"| {m} | {p} | {'on' if b == '1' else 'off'} | {r['ready_s']:.1f} | {t[0]:.2f} | {sum(t[1:5]):.2f} | "
                  f"{steady*1e3:.1f} | {r['ready_s'] + sum(t):.1f} | {a.batch_size/steady:,.0f} |", flush=True)
