"""A co-tenant for the fault runs: bf16 GEMMs on the visible GPU without pause (run it with
CUDA_VISIBLE_DEVICES set). Prints "busy" once the first product is under way; stop it with a signal."""
import torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
print("busy", flush=True)
while True:
    for _ in range(50): a @ b
    torch.cuda.synchronize()
