"""Where the activation quantiser on the GPU parts from the core's (check.py act_quant): the differing values,
their block's amax and both results' bits, against the core on the CPU and on the GPU."""

from __future__ import annotations

import torch

from deepinfer_core.ops.act_quant import fp8_act_roundtrip as core
from deepinfer_cuda_sm100.kernels.act_quant import fp8_act_roundtrip as kern

g = torch.Generator(device="cuda").manual_seed(0)
for T, k in ((16, 8192), (8192, 1280), (16, 5120)):
    x = (torch.randn(T, k, generator=g, device="cuda") * 3.0).to(torch.bfloat16)
    a = kern(x).cpu()
    b = core(x.cpu())
    c = core(x).cpu()
    d = a.view(torch.int16) != b.view(torch.int16)
    print(
        f"{T}x{k}: kernel != core(cpu) {int(d.sum())}, core(gpu) != core(cpu) "
        f"{int((c.view(torch.int16) != b.view(torch.int16)).sum())}; -0.0 in the core's result (a negative value "
        f"rounded to zero) {int((b.view(torch.int16) == -32768).sum())}, in the kernel's "
        f"{int((a.view(torch.int16) == -32768).sum())}"
    )
    xc = x.cpu()
    for r, col in d.nonzero()[:8].tolist():
        blk = xc[r, col // 32 * 32 : (col // 32 + 1) * 32].float()
        amax = blk.abs().max()
        print(
            f"  x={xc[r, col].item()!r} amax={amax.item()!r} amax/448={(amax * (1 / 448)).item()!r} "
            f"kernel={a[r, col].item()!r} core={b[r, col].item()!r} "
            f"bits {a[r, col].view(torch.int16).item() & 0xFFFF:04x} {b[r, col].view(torch.int16).item() & 0xFFFF:04x}"
        )
