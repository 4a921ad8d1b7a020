"""FP8 KV store check on a GPU: the Triton store and the torch pack on the GPU against the CPU pack, byte for byte.

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python3 benchmarks/gpu/fp8_store_diag.py

Prints the mismatching bytes of each, with the first five positions (v8: found the H200 converting a
negative value that rounds to zero into e4m3 +0 where torch writes -0)."""

import torch

from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
from deepinfer_cuda_sm100.kernels.kv_store import store_fp8

fmt = Fp8KVFormat(512, 64, torch.bfloat16)
g = torch.Generator().manual_seed(0)
x = torch.randn(4096, 512, generator=g).to(torch.bfloat16)
cpu = fmt.pack(x)
gpu_torch = fmt.pack(x.cuda()).cpu()
pool = torch.zeros(4096, fmt.row_bytes, dtype=torch.uint8, device="cuda")
store_fp8(pool, torch.arange(4096, device="cuda"), x.cuda(), fmt)
tri = pool.cpu()
for name, t in (("gpu_torch", gpu_torch), ("triton", tri)):
    d = (t != cpu).nonzero()
    print(name, "mismatching bytes vs cpu pack:", len(d))
    for r, c in d[:5].tolist():
        v = x[r, c].item() if c < 448 else None
        print("  row", r, "byte", c, "got", int(t[r, c]), "cpu", int(cpu[r, c]), "x", v)
