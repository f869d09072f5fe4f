"""gpuctl `fsdp` on a GPT (1.3B by default) against PyTorch FSDP2
(`fully_shard` on every block, then the root) under torchrun, and gpuctl `ddp`
on the same model, batch and sequence, on 2 GPUs of this host, in one run.

The PyTorch model is gpuctl's exactly (worker/src/workloads/models/gpt.rs):
token + learned position embeddings, pre-LN blocks (ln1, qkv Linear(d,3d),
causal scaled_dot_product_attention, proj Linear(d,d), residual; ln2, fc
Linear(d,4d), GELU tanh, out Linear(4d,d), residual), final LayerNorm, output
tied to the token embedding without bias; vocabulary 50304; init normal std
0.02, proj/out 0.02/sqrt(2L), biases 0, LayerNorms 1/0. bf16 compute, fp32
master weights, SGD lr 0.05 momentum 0.9, mean cross-entropy in fp32.
Peak memory is the allocator's (`torch.cuda.max_memory_allocated`, gpuctl's
`peak_memory_bytes`), counted from the first training step, the largest rank.

The reference runs twice: eager (fully_shard per block and root, bf16
parameters and reductions) and tuned as TorchTitan trains (each block
compiled, the last block and the root kept after forward); MFU of each run
by core/src/mfu.rs's formula against the GPU's bf16 dense peak.

Targets (issues 15 and 49): gpuctl fsdp peak / gpuctl ddp peak <= 0.6;
gpuctl fsdp and ddp tok/s / the faster FSDP2 run's >= 1.0; gpuctl's MFU >= 0.45;
gpuctl fsdp peak / FSDP2 peak <= 1.05; as PASS/FAIL lines. Usage: python3 bench/fsdp.py [--batch-size 8] [--seq-len 1024]
[--gpt-size 1.3b] [--no-ddp] [--json OUT]"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
from common import Fleet, PY, gpu_count, gpu_env, host_facts, ratio  # noqa: E402

# (vocab, dim, layers, heads), as GptConfig's sizes.
GPT_SIZES = {
    "124m": (50304, 768, 12, 12),
    "350m": (50304, 1024, 24, 16),
    "1.3b": (50304, 2048, 24, 16),
    "2.7b": (50304, 2560, 32, 32),
}

TORCH_FSDP2 = r"""
import math, sys, time, torch, torch.nn as nn, torch.nn.functional as F, torch.distributed as dist
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
dist.init_process_group("nccl"); r = dist.get_rank(); w = dist.get_world_size(); torch.cuda.set_device(r)
bs, seq, steps, warmup, V, D, L, H, tuned = map(int, sys.argv[1:10])

class Block(nn.Module):
    def __init__(s):
        super().__init__()
        s.ln1, s.qkv, s.proj = nn.LayerNorm(D), nn.Linear(D, 3 * D), nn.Linear(D, D)
        s.ln2, s.fc, s.out = nn.LayerNorm(D), nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, D)
        x = x + s.proj(y)
        return x + s.out(F.gelu(s.fc(s.ln2(x)), approximate="tanh"))

class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.wte, s.wpe = nn.Embedding(V, D), nn.Embedding(seq, D)
        s.h = nn.ModuleList(Block() for _ in range(L))
        s.lnf = nn.LayerNorm(D)
        for n, p in s.named_parameters():
            if n.endswith(".bias"): nn.init.zeros_(p)
            elif n.startswith("lnf.") or ".ln1." in n or ".ln2." in n: nn.init.ones_(p)
            elif n.endswith((".proj.weight", ".out.weight")): nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * L))
            else: nn.init.normal_(p, 0.0, 0.02)
    def forward(s, tok):
        x = s.wte(tok) + s.wpe(torch.arange(tok.shape[1], device=tok.device))
        for blk in s.h: x = blk(x)
        # Output tied to the token embedding, no bias.
        return F.linear(s.lnf(x), s.wte.weight)

torch.manual_seed(0)
with torch.device("cuda"): m = GPT()
params = sum(p.numel() for p in m.parameters())
mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
if tuned:
    # TorchTitan's settings (torchtitan/models/llama3/infra/parallelize.py):
    # each block compiled on its own (`--compile.enable`), then sharded; the
    # last block and the root not resharded after forward (backward needs
    # them at once); bf16 parameters and reductions as above; SDPA's flash
    # attention (bf16, causal). SGD stays, as gpuctl trains, in its default
    # foreach form: PyTorch 2.11 has no DTensor rule for the fused SGD kernel
    # gpuctl uses ("aten._fused_sgd_.default does not have a sharding
    # strategy registered", 1 x H200, 2026-11-29).
    for i, blk in enumerate(m.h):
        m.h[i] = torch.compile(blk)
    for i, blk in enumerate(m.h):
        fully_shard(blk, mp_policy=mp, reshard_after_forward=i < L - 1)
    fully_shard(m, mp_policy=mp, reshard_after_forward=False)
else:
    for blk in m.h: fully_shard(blk, mp_policy=mp)
    fully_shard(m, mp_policy=mp)
opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
g = torch.Generator(device="cuda"); g.manual_seed(1 + r)
tok = torch.randint(0, V, (bs, seq + 1), device="cuda", generator=g)
x, y = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()
def step():
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(m(x).float().view(-1, V), y.view(-1))
    loss.backward(); opt.step()
    return loss
# The full fp32 model built above is gone: training's peak is its own.
torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
for _ in range(warmup): step()
torch.cuda.synchronize(); dist.barrier(); t = time.perf_counter()
for _ in range(steps): loss = step()
torch.cuda.synchronize(); s = time.perf_counter() - t
rate = torch.tensor([bs * seq * steps / s], device="cuda", dtype=torch.float64)
peak = torch.tensor([torch.cuda.max_memory_allocated()], device="cuda", dtype=torch.float64)
dist.all_reduce(rate); dist.all_reduce(peak, op=dist.ReduceOp.MAX)
if r == 0:
    print(f"PER_GPU {rate.item() / w:.1f} PEAK {int(peak.item())} PARAMS {params} LOSS {loss.item():.4f}", flush=True)
dist.destroy_process_group()
"""


def mfu(tokens_per_s, parameters, size, seq_len, peak):
    """As core/src/mfu.rs: 6N + 12 L d T FLOPs a token against the dense peak (TFLOP/s)."""
    if not parameters or not peak or tokens_per_s != tokens_per_s:
        return None
    _, d, layers, _ = GPT_SIZES[size]
    return tokens_per_s * (6 * parameters + 12 * layers * d * seq_len) / (peak * 1e12)


def peak_tflops(gpu):
    """bf16 dense peak of NVIDIA's datasheets, as core/src/mfu.rs's table."""
    for name, peak in (("H200 NVL", 835.5), ("H100 NVL", 835.5), ("H100 PCIe", 756.5), ("H100", 989.4),
                       ("H200", 989.4), ("A100", 312.0)):
        if name in gpu:
            return peak
    return None


def torch_fsdp2(n, a, tuned):
    script = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    script.write(TORCH_FSDP2)
    script.close()
    torchrun = os.path.join(os.path.dirname(PY), "torchrun")
    v, d, layers, heads = GPT_SIZES[a.gpt_size]
    args = [a.batch_size, a.seq_len, a.steps, a.warmup_steps, v, d, layers, heads, int(tuned)]
    out = subprocess.run([torchrun, "--standalone", f"--nproc_per_node={n}", script.name, *map(str, args)],
                         env=gpu_env(), capture_output=True, text=True)
    os.unlink(script.name)
    m = re.search(r"PER_GPU ([0-9.]+) PEAK ([0-9]+) PARAMS ([0-9]+) LOSS (\S+)", out.stdout)
    if not m:
        print(out.stdout[-2000:], out.stderr[-3000:], file=sys.stderr)
        return {"per_gpu": float("nan"), "peak": None, "parameters": None, "loss": None}
    return {"per_gpu": float(m.group(1)), "peak": int(m.group(2)), "parameters": int(m.group(3)),
            "loss": float(m.group(4))}


def gpuctl_train(workload, n, a):
    fleet = Fleet(agent_args=["--gpus=" + ",".join(str(i) for i in range(n))])
    try:
        # A 1.3B model takes a while to build and warm up: room beyond the defaults.
        return fleet.submit(workload, "--model", "gpt", "--gpt-size", a.gpt_size, "--precision", "bf16",
                            "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len),
                            "--steps", str(a.steps), "--warmup-steps", str(a.warmup_steps),
                            "--timeout", "40m", "--hang-timeout", "300s")
    finally:
        fleet.close()


def summary(rep):
    """Per-GPU tokens/s (mean over ranks), peak (largest rank), overlap, as the report gives them."""
    trains = [r.get("train") or {} for nd in rep.get("nodes", []) for r in nd.get("ranks", [])]
    rates = [t.get("samples_per_s", 0.0) for t in trains]
    ran = bool(trains) and all(x > 0 for x in rates)
    shares = [t.get("overlap_share") for t in trains]
    return {"ran": ran, "per_gpu": sum(rates) / len(rates) if ran else float("nan"),
            "peak": max(t.get("peak_memory_bytes", 0) for t in trains) if ran else None,
            "parameters": trains[0].get("parameters") if trains else None,
            "overlap_share_per_rank": shares,
            "comm_ms_per_step": [t.get("comm_ms_per_step") for t in trains],
            "comm_exposed_ms_per_step": [t.get("comm_exposed_ms_per_step") for t in trains],
            "final_loss": [t.get("final_loss") for t in trains],
            "verdict": rep.get("verdict"), "state": rep.get("state"), "reason": rep.get("reason", "")}


def gib(b):
    return "n/a" if b is None else f"{b / 2**30:.2f} GiB"


def fmt_list(xs, spec):
    return ", ".join("n/a" if x is None else format(x, spec) for x in xs) or "n/a"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt-size", default="1.3b", choices=sorted(GPT_SIZES))
    ap.add_argument("--batch-size", type=int, default=8, help="per GPU")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup-steps", type=int, default=5)
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--no-ddp", action="store_true", help="skip gpuctl ddp (where the model does not fit)")
    ap.add_argument("--json")
    a = ap.parse_args()
    facts = host_facts()
    if gpu_count() < a.gpus:
        sys.exit(f"this host has {gpu_count()} GPU(s); the comparison needs {a.gpus}")
    n = a.gpus
    print(f"# fsdp gpt {a.gpt_size}, batch {a.batch_size}/GPU x seq {a.seq_len}, bf16, {n} GPUs: gpuctl fsdp and "
          f"ddp vs torch FSDP2 (fully_shard per block + root), {facts['gpus']} x {facts['gpu']}, "
          f"driver {facts['driver']}, {facts['date']}")
    eager = torch_fsdp2(n, a, False)
    ref = torch_fsdp2(n, a, True)
    fsdp = summary(gpuctl_train("fsdp", n, a))
    ddp = summary(gpuctl_train("ddp", n, a)) if not a.no_ddp else None
    peak = peak_tflops(facts["gpu"])
    u = lambda s: mfu(s["per_gpu"], s["parameters"], a.gpt_size, a.seq_len, peak)  # noqa: E731
    pct = lambda x: "n/a" if x is None else f"{x:.1%}"  # noqa: E731
    print(f"MFU against {peak} TFLOP/s bf16 dense (6N + 12LdT FLOPs a token, core/src/mfu.rs)")
    print(f"torch FSDP2 eager:  {eager['per_gpu']:.0f} tok/s/GPU, MFU {pct(u(eager))}, peak {gib(eager['peak'])}")
    print(f"torch FSDP2 tuned (TorchTitan: compiled blocks, last block and root kept after forward):  "
          f"{ref['per_gpu']:.0f} tok/s/GPU, MFU {pct(u(ref))}, peak {gib(ref['peak'])}, "
          f"{ref['parameters']} parameters, loss {ref['loss']}")
    for name, s in (("gpuctl fsdp", fsdp), ("gpuctl ddp", ddp)):
        if s is None:
            print(f"{name}: not run (--no-ddp)")
            continue
        print(f"{name}: {s['per_gpu']:.0f} tok/s/GPU, MFU {pct(u(s) if s['ran'] else None)}, "
              f"peak {gib(s['peak'])}, {s['parameters']} parameters, "
              f"verdict {s['verdict']} {s['reason']}")
        print(f"  overlap share per rank {fmt_list(s['overlap_share_per_rank'], '.3f')}; comm "
              f"{fmt_list(s['comm_ms_per_step'], '.2f')} ms/step, exposed "
              f"{fmt_list(s['comm_exposed_ms_per_step'], '.2f')} ms/step")
    if ref["parameters"] and fsdp["parameters"] and ref["parameters"] != fsdp["parameters"]:
        print(f"WARNING: parameter counts differ (torch {ref['parameters']}, gpuctl {fsdp['parameters']}): "
              "the models are not the same")
    checks, skipped = [], []
    # The faster of the two references is the one to beat (on one H200 the
    # compiled blocks were slower than eager: 32,586 against 45,099 tok/s).
    best_name, best = max((("eager", eager), ("tuned", ref)), key=lambda r: r[1]["per_gpu"]
                          if r[1]["per_gpu"] == r[1]["per_gpu"] else -1)
    if n == 1:
        skipped.append("fsdp peak / ddp peak (one GPU: fsdp shards nothing)")
    elif ddp and ddp["ran"] and fsdp["ran"]:
        q = ratio(fsdp["peak"], ddp["peak"])
        checks.append((f"gpuctl fsdp peak / ddp peak {q:.3f} <= 0.6", q <= 0.6, q))
    else:
        why = "--no-ddp" if ddp is None else ("ddp did not run: " + (ddp["reason"] or str(ddp["state"]))
                                             if not ddp["ran"] else "fsdp did not run")
        skipped.append(f"fsdp peak / ddp peak ({why})")
    q = ratio(fsdp["per_gpu"], best["per_gpu"])
    checks.append((f"gpuctl fsdp tok/s / FSDP2 ({best_name}, the faster) tok/s {q:.3f} >= 1.0", q >= 1.0, q))
    if ddp and ddp["ran"]:
        q = ratio(ddp["per_gpu"], best["per_gpu"])
        checks.append((f"gpuctl ddp tok/s / FSDP2 ({best_name}, the faster) tok/s {q:.3f} >= 1.0", q >= 1.0, q))
    for name, s in (("fsdp", fsdp), ("ddp", ddp)):
        x = u(s) if s and s["ran"] else None
        if x is not None:
            checks.append((f"gpuctl {name} MFU {x:.3f} >= 0.45", x >= 0.45, x))
    if fsdp["peak"] and ref["peak"]:
        q = ratio(fsdp["peak"], ref["peak"])
        checks.append((f"gpuctl fsdp peak / FSDP2 peak {q:.3f} <= 1.05", q <= 1.05, q))
    else:
        skipped.append("fsdp peak / FSDP2 peak (a run gave no peak)")
    for what, ok, _ in checks:
        print(f"{'PASS' if ok else 'FAIL'} {what}")
    for what in skipped:
        print(f"not checked: {what}")
    if a.json:
        json.dump({"facts": facts, "config": vars(a), "torch_fsdp2": ref, "torch_fsdp2_eager": eager,
                   "gpuctl_fsdp": fsdp, "gpuctl_ddp": ddp, "peak_tflops": peak,
                   "checks": [{"check": w, "pass": ok, "value": v} for w, ok, v in checks],
                   "not_checked": skipped}, open(a.json, "w"), indent=1)
    # Exit status: 0 when every check that ran passed (the lines say what was not checked).
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
