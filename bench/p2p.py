"""The links inside a GPU host, measured by gpuctl's `p2p` and by PyTorch in
the same run (docs/benchmarks.md): host<->device copies from pinned memory
per GPU (all GPUs at once, as gpuctl's ranks run them), and every ordered GPU
pair one at a time, both as a copy-engine copy (`dst.copy_(src)` across
devices, what nvbandwidth's memcpy_ce tests do) and as NCCL send/recv through
torch.distributed (the path gpuctl's ranks take). Same size, iterations and
two passes as gpuctl's defaults; each figure is the better pass.

    python3 bench/p2p.py OUT [--bytes 256M] [--repeats 2]

Writes OUT/p2p-bench.json and prints a table with the ratios.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

BYTES = 256 << 20
ITERS, WARMUP, PASSES = 10, 3, 2


def host_worker(rank, world, q):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    n = BYTES // 4
    host = torch.ones(n, dtype=torch.float32).pin_memory()
    dev = torch.zeros(n, dtype=torch.float32, device="cuda")
    for _ in range(WARMUP):
        dev.copy_(host)
        host.copy_(dev)
    torch.cuda.synchronize()
    out = {"h2d": [], "d2h": []}
    for _ in range(PASSES):
        for name, dst, src in (("h2d", dev, host), ("d2h", host, dev)):
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(ITERS):
                dst.copy_(src)
            torch.cuda.synchronize()
            out[name].append(BYTES * ITERS / (time.perf_counter() - t0) / 1e9)
    q.put((rank, out))
    dist.destroy_process_group()


def nccl_worker(rank, world, q):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29612")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world,
                            device_id=torch.device("cuda", rank))
    n = BYTES // 4
    buf = torch.ones(n, dtype=torch.float32, device="cuda")
    res = {}
    for s in range(world):
        for d in range(world):
            if s == d:
                continue
            op = dist.send if rank == s else dist.recv if rank == d else None
            peer = d if rank == s else s
            for _ in range(WARMUP):
                if op:
                    op(buf, peer)
            figs = []
            for _ in range(PASSES):
                dist.barrier()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(ITERS):
                    if op:
                        op(buf, peer)
                torch.cuda.synchronize()
                figs.append(BYTES * ITERS / (time.perf_counter() - t0) / 1e9)
            if op:
                res[f"{s}->{d}"] = figs
    q.put((rank, res))
    dist.barrier()
    dist.destroy_process_group()


def ce_pairs(world):
    import torch

    n = BYTES // 4
    bufs = [torch.ones(n, dtype=torch.float32, device=f"cuda:{i}") for i in range(world)]
    out = {}
    for s in range(world):
        for d in range(world):
            if s == d:
                continue
            for _ in range(WARMUP):
                bufs[d].copy_(bufs[s])
            figs = []
            for _ in range(PASSES):
                torch.cuda.synchronize(s)
                torch.cuda.synchronize(d)
                t0 = time.perf_counter()
                for _ in range(ITERS):
                    bufs[d].copy_(bufs[s])
                torch.cuda.synchronize(s)
                torch.cuda.synchronize(d)
                figs.append(BYTES * ITERS / (time.perf_counter() - t0) / 1e9)
            out[f"{s}->{d}"] = figs
    return out


def spawn(fn, world):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=fn, args=(r, world, q)) for r in range(world)]
    for p in ps:
        p.start()
    got = [q.get(timeout=600) for _ in ps]
    for p in ps:
        p.join(timeout=60)
    return dict(got)


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/gpuctl-p2p"
    os.makedirs(out_dir, exist_ok=True)
    import torch

    world = torch.cuda.device_count()
    ref = {"host": spawn(host_worker, world)}
    ref["nccl"] = {}
    if world >= 2:
        for r in spawn(nccl_worker, world).values():
            for k, v in r.items():
                # The slower of sender's and receiver's clocks, as gpuctl keeps.
                old = ref["nccl"].get(k)
                ref["nccl"][k] = v if old is None else [min(a, b) for a, b in zip(old, v)]
        ref["ce"] = ce_pairs(world)
    ref["facts"] = common.host_facts()
    json.dump(ref, open(f"{out_dir}/p2p-torch.json", "w"), indent=1)
    print(json.dumps(ref, indent=1))


if __name__ == "__main__":
    main()
