"""Where attention over V4.1's packed entries loses to plain rows (issue #27, batch 16-256; RESULTS v35: the 64-head
tile at T = 64 takes 190.9 us against the bf16 pool's 50.2): one query token of 64 heads x 512 a program, 640
gathered entries of one pool, the online softmax of ``_sparse_attn_kernel``, with only the way a key tile is built
changed (``MODE``):

0. plain bf16 rows of the unpacked entries (the floor);
1. ``sparse_attention._load_packed`` as the plugin runs it: each value gathers its code byte (FP4: the byte of its
   nibble, every byte twice) and its scale byte;
2. the codes alone, no scales (wrong values: what the code decode costs);
3. the scales as a ``[BLOCK_N, 512 / SB]`` tile broadcast through reshapes, the codes as in 1 (same values);
4. FP4 (``PACK`` 2, 3): each code byte loaded once as ``[BLOCK_N, 256]``, its two nibbles decoded and interleaved
   (``tl.join`` then a reshape), the scales as in 3 (same values); e4m3 (``PACK`` 1): as 3.

Modes 1, 3 and 4 are checked against mode 0 (largest difference); each is timed by ``triton.testing.do_bench``, for
V4.1's window format (e4m3 codes, ue8m0 scales per 32) and its compressed format (e2m1 codes, e4m3 scales per 16).

    python3 benchmarks/gpu/v41_kv_variants.py [--tokens 64] [--out DIR]

On the CPU, ``TRITON_INTERPRET=1 ... v41_kv_variants.py --cpu-check`` runs every mode at tiny shapes (16 heads, 16
slots a tile) and prints each one's largest difference from mode 0 (0 for modes 1, 3 and 4: the same bytes).
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
from bench_common import time_variant

from deepinfer_cuda_sm100.kernels._common import e2m1_value
from deepinfer_cuda_sm100.kernels.sparse_attention import _load_packed, _packed_scales, packed_layout


@triton.jit
def _variant_kernel(
    q_ptr, plain_ptr, u8_ptr, e4_ptr, slots_ptr, out_ptr, n, H, stride_plain, stride_row, qk_scale,
    MODE: tl.constexpr, PACK: tl.constexpr, CODE_BYTES: tl.constexpr, SB: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    dm = d < BLOCK_D
    q = tl.load(q_ptr + (t * H + heads)[:, None] * BLOCK_D + d[None, :]).to(tl.bfloat16)
    m_i = tl.full([BLOCK_H], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for n0 in range(0, n, BLOCK_N):
        slot = tl.load(slots_ptr + t * n + n0 + cols, mask=n0 + cols < n, other=-1)
        valid = slot >= 0
        m = valid[:, None] & dm[None, :]
        row = slot[:, None].to(tl.int64) * stride_row
        if MODE == 0:
            k = tl.load(plain_ptr + slot[:, None] * stride_plain + d[None, :], mask=m, other=0.0).to(
                tl.bfloat16
            )
        elif MODE == 1:
            k = _load_packed(u8_ptr, e4_ptr, slot, valid, d, dm, stride_row, PACK, CODE_BYTES, SB).to(
                tl.bfloat16
            )
        else:
            if MODE == 4 and PACK != 1:
                b = tl.load(u8_ptr + row + tl.arange(0, BLOCK_D // 2)[None, :], mask=valid[:, None], other=0)
                b = b.to(tl.int32)
                code = tl.reshape(tl.join(e2m1_value(b & 15), e2m1_value(b >> 4)), [BLOCK_N, BLOCK_D])
            elif PACK == 1:
                code = tl.load(e4_ptr + row + d[None, :], mask=m, other=0.0).to(tl.float32)
            else:
                b = tl.load(u8_ptr + row + (d // 2)[None, :], mask=m, other=0).to(tl.int32)
                code = e2m1_value((b >> ((d % 2) * 4)[None, :]) & 15)
            if MODE == 2:
                k = code.to(tl.bfloat16)
            else:
                sc = _packed_scales(u8_ptr, e4_ptr, row, valid, PACK, CODE_BYTES, SB, BLOCK_D)
                k = tl.reshape(
                    tl.reshape(code, [BLOCK_N, BLOCK_D // SB, SB]) * sc[:, :, None], [BLOCK_N, BLOCK_D]
                )
                k = k.to(tl.bfloat16)
        s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), k)
        m_i = m_new
    tl.store(out_ptr + (t * H + heads)[:, None] * BLOCK_D + d[None, :], acc / l_i[:, None])


def pools(device: str, S: int, gen: torch.Generator):
    """``{name: (packed [S, row bytes] uint8, plain bf16 [S, 512], (PACK, code bytes, SB))}`` for V4.1's window
    and compressed formats at 512 channels."""
    from deepinfer_core.models.deepseek_v41.kv_formats import kv_formats

    f = kv_formats("auto", 512, 128, torch.bfloat16)
    out = {}
    for name, fmt in (("window_e4m3", f.window), ("compressed_e2m1", f.compressed)):
        packed = fmt.pack(torch.randn(S, 512, device=device, generator=gen).bfloat16())
        out[name] = (packed, fmt.unpack(packed).bfloat16().contiguous(), packed_layout(fmt, 512))
    return out


def cpu_check() -> None:
    g = torch.Generator().manual_seed(0)
    H, D, S, T, n = 16, 512, 64, 2, 40
    for name, (packed, plain, (pack, code_bytes, sb)) in pools("cpu", S, g).items():
        q = torch.randn(T, H, D, generator=g).bfloat16()
        slots = torch.randint(0, S, (T, n), generator=g, dtype=torch.int32)
        slots[:, -5:] = -1
        outs = {}
        for mode in range(5):
            out = outs[mode] = torch.full((T, H, D), float("nan"))
            _variant_kernel[(T, 1)](
                q, plain, packed, packed.view(torch.float8_e4m3fn), slots, out, n, H, plain.stride(0),
                packed.stride(0), D**-0.5 * 1.4426950408889634, MODE=mode, PACK=pack, CODE_BYTES=code_bytes, SB=sb,
                BLOCK_H=H, BLOCK_N=16, BLOCK_D=D,
            )  # fmt: skip
            print(name, "mode", mode, "largest difference from mode 0:", float((out - outs[0]).abs().max()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[64])
    ap.add_argument("--slots", type=int, default=640)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument(
        "--cpu-check", action="store_true", help="tiny shapes under TRITON_INTERPRET=1 (see above)"
    )
    args = ap.parse_args()
    if args.cpu_check:
        return cpu_check()
    g = torch.Generator("cuda").manual_seed(0)
    H, D, S = 64, 512, 8192
    results = []
    for name, (packed, plain, (pack, code_bytes, sb)) in pools("cuda", S, g).items():
        for T in args.tokens:
            q = torch.randn(T, H, D, device="cuda", generator=g).bfloat16()
            slots = torch.randint(0, S, (T, args.slots), device="cuda", generator=g, dtype=torch.int32)
            slots[:, -37:] = -1
            outs = {}
            for mode in range(5):
                for bh, bn, warps, stages in ((64, 32, 8, 1), (64, 32, 8, 2), (32, 32, 8, 2), (64, 16, 8, 1)):
                    out = torch.full((T, H, D), float("nan"), device="cuda")

                    launch = functools.partial(
                        _variant_kernel[(T, H // bh)], q, plain, packed, packed.view(torch.float8_e4m3fn), slots, out,
                        args.slots, H, plain.stride(0), packed.stride(0), D**-0.5 * 1.4426950408889634, MODE=mode,
                        PACK=pack, CODE_BYTES=code_bytes, SB=sb, BLOCK_H=bh, BLOCK_N=bn, BLOCK_D=D, num_warps=warps,
                        num_stages=stages,
                    )  # fmt: skip

                    row = {"pool": name, "T": T, "mode": mode, "tile": [bh, bn, warps, stages]}
                    results.append(time_variant(row, launch, out, outs, checked=mode in (1, 3, 4)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "v41_kv_variants.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
