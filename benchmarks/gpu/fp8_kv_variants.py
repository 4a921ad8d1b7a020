"""Where V4's FP8 KV decode attention loses to the bf16 pool (issue #26: "FP8 KV pays for itself"): one query token
of 64 heads x 512 a program pair, 640 gathered slots, the online softmax of ``_sparse_attn_kernel``, with only the
way a key tile is built changed (``MODE``):

0. the bf16 pool of the unpacked rows (the floor to reach);
1. ``sparse_attention._load_kv`` as the plugin runs it (``FP8 = 1``: 2-D code tile, scales through two reshapes);
2. the e4m3 bytes of all 512 channels converted, nothing else (wrong values: what the load and convert cost);
3. codes times scales through the reshapes, no RoPE merge (wrong values);
4. codes and the RoPE merge, no scales (wrong values);
5. a 3-D tile ``[BLOCK_N, 8, 64]``: eight channel groups, the seventh-and-before scaled, the eighth the RoPE
   channels, one reshape to 2-D (the same products as ``_load_kv``);
6. no merge: the scaled codes as a 512-channel tile whose RoPE channels are zero, and the RoPE channels as their
   own ``[BLOCK_N, 64]`` tile with dots of their own (scores: two dots; values: a second ``[BLOCK_H, 64]``
   accumulator stored over the last 64 channels). The same products, summed in two parts.

Modes 1, 5 and 6 are checked against mode 0 (largest difference); each is timed by ``triton.testing.do_bench`` at the
tile shapes given. Run on a GPU:

    python3 benchmarks/gpu/fp8_kv_variants.py [--tokens 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl
from bench_common import time_variant

from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
from deepinfer_cuda_sm100.kernels.sparse_attention import _load_kv

GROUP = 64


@triton.jit
def _variant_kernel(
    q_ptr, pool_ptr, e4_ptr, rope_ptr, sc_ptr, slots_ptr, out_ptr, n, H, stride_pool, stride_row, NOPE, NG, ROPE_ROW,
    ROPE_OFF, SCALE_ROW, SCALE_OFF, qk_scale,
    MODE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
    ROPE: tl.constexpr = 64,
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
    code = d < NOPE
    rd = tl.arange(0, ROPE)
    q_rope = tl.load(q_ptr + (t * H + heads)[:, None] * BLOCK_D + NOPE + rd[None, :]).to(tl.bfloat16)
    acc_rope = tl.zeros([BLOCK_H, ROPE], dtype=tl.float32)
    for n0 in range(0, n, BLOCK_N):
        slot = tl.load(slots_ptr + t * n + n0 + cols, mask=n0 + cols < n, other=-1)
        valid = slot >= 0
        m = valid[:, None] & dm[None, :]
        if MODE == 0:
            k = tl.load(pool_ptr + slot[:, None] * stride_pool + d[None, :], mask=m, other=0.0).to(
                tl.bfloat16
            )
        elif MODE == 1:
            k = _load_kv(e4_ptr, rope_ptr, sc_ptr, slot, valid, d, dm, stride_row, NOPE, NG, ROPE_ROW, ROPE_OFF,
                         SCALE_ROW, SCALE_OFF, 1, GROUP, BLOCK_N, BLOCK_D, tl.bfloat16)  # fmt: skip
        elif MODE == 2:
            k = tl.load(e4_ptr + slot[:, None] * stride_row + d[None, :], mask=m, other=0.0).to(tl.bfloat16)
        elif MODE == 3:
            c = tl.load(e4_ptr + slot[:, None] * stride_row + d[None, :], mask=m & code[None, :], other=0.0)
            g = tl.arange(0, BLOCK_D // GROUP)
            sc = tl.load(sc_ptr + slot[:, None] * SCALE_ROW + SCALE_OFF + g[None, :],
                         mask=valid[:, None] & (g < NG)[None, :], other=0.0)  # fmt: skip
            c = tl.reshape(tl.reshape(c.to(tl.float32), [BLOCK_N, BLOCK_D // GROUP, GROUP]) * sc[:, :, None],
                           [BLOCK_N, BLOCK_D])  # fmt: skip
            k = c.to(tl.bfloat16)
        elif MODE == 4:
            c = tl.load(e4_ptr + slot[:, None] * stride_row + d[None, :], mask=m & code[None, :], other=0.0)
            r = tl.load(rope_ptr + slot[:, None] * ROPE_ROW + ROPE_OFF + (d - NOPE)[None, :],
                        mask=m & (~code)[None, :], other=0.0)  # fmt: skip
            k = tl.where(code[None, :], c.to(tl.bfloat16), r.to(tl.bfloat16))
        elif MODE == 6:
            c = tl.load(e4_ptr + slot[:, None] * stride_row + d[None, :], mask=m & code[None, :], other=0.0)
            g = tl.arange(0, BLOCK_D // GROUP)
            sc = tl.load(sc_ptr + slot[:, None] * SCALE_ROW + SCALE_OFF + g[None, :],
                         mask=valid[:, None] & (g < NG)[None, :], other=0.0)  # fmt: skip
            k = tl.reshape(tl.reshape(c.to(tl.float32), [BLOCK_N, BLOCK_D // GROUP, GROUP]) * sc[:, :, None],
                           [BLOCK_N, BLOCK_D]).to(tl.bfloat16)  # fmt: skip
            kr = tl.load(
                rope_ptr + slot[:, None] * ROPE_ROW + ROPE_OFF + rd[None, :], mask=valid[:, None], other=0.0
            )
        else:
            g3 = tl.arange(0, BLOCK_D // GROUP)[None, :, None]
            ch = g3 * GROUP + tl.arange(0, GROUP)[None, None, :]
            s3 = slot[:, None, None]
            v3 = valid[:, None, None]
            code3 = ch < NOPE
            c = tl.load(e4_ptr + s3 * stride_row + ch, mask=v3 & code3, other=0.0).to(tl.float32)
            sc = tl.load(sc_ptr + s3 * SCALE_ROW + SCALE_OFF + g3, mask=v3 & (g3 < NG), other=0.0)
            r = tl.load(rope_ptr + s3 * ROPE_ROW + ROPE_OFF + (ch - NOPE), mask=v3 & (ch >= NOPE), other=0.0)
            k = tl.reshape(tl.where(code3, (c * sc).to(tl.bfloat16), r.to(tl.bfloat16)), [BLOCK_N, BLOCK_D])
        if MODE == 6:
            s = tl.dot(q_rope, tl.trans(kr), tl.dot(q, tl.trans(k))) * qk_scale
        else:
            s = tl.dot(q, tl.trans(k)) * qk_scale
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), k)
        if MODE == 6:
            acc_rope = acc_rope * alpha[:, None] + tl.dot(p.to(tl.bfloat16), kr)
        m_i = m_new
    out_rows = out_ptr + (t * H + heads)[:, None] * BLOCK_D
    if MODE == 6:
        tl.store(out_rows + d[None, :], acc / l_i[:, None], mask=code[None, :])
        tl.store(out_rows + NOPE + rd[None, :], acc_rope / l_i[:, None])
    else:
        tl.store(out_rows + d[None, :], acc / l_i[:, None])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, nargs="+", default=[64])
    ap.add_argument("--slots", type=int, default=640)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    g = torch.Generator("cuda").manual_seed(0)
    H, D, S = 64, 512, 8192
    fmt = Fp8KVFormat(D, 64, torch.bfloat16)
    rows = torch.randn(S, D, device="cuda", generator=g).bfloat16()
    packed = fmt.pack(rows)
    plain = fmt.unpack(packed).contiguous()
    e4, rope, sc = packed.view(torch.float8_e4m3fn), packed.view(torch.bfloat16), packed.view(torch.float32)
    layout = (fmt.nope, fmt.num_scales, fmt.row_bytes // 2, fmt.rope_offset // 2, fmt.row_bytes // 4,
              fmt.scale_offset // 4)  # fmt: skip
    results = []
    for T in args.tokens:
        q = torch.randn(T, H, D, device="cuda", generator=g).bfloat16()
        slots = torch.randint(0, S, (T, args.slots), device="cuda", generator=g, dtype=torch.int32)
        slots[:, -37:] = -1
        outs = {}
        for mode in range(7):
            for bh, bn, warps, stages in ((32, 32, 8, 2), (32, 64, 8, 2), (16, 32, 4, 2), (16, 16, 4, 2),
                                          (32, 64, 8, 1), (64, 32, 8, 1)):  # fmt: skip
                out = torch.full((T, H, D), float("nan"), device="cuda")

                def launch(
                    out=out, bh=bh, bn=bn, warps=warps, stages=stages, mode=mode, T=T, q=q, slots=slots
                ):
                    _variant_kernel[(T, H // bh)](
                        q, plain, e4, rope, sc, slots, out, args.slots, H, plain.stride(0), packed.stride(0), *layout,
                        D**-0.5 * 1.4426950408889634, MODE=mode, BLOCK_H=bh, BLOCK_N=bn, BLOCK_D=D, GROUP=GROUP,
                        num_warps=warps, num_stages=stages,
                    )  # fmt: skip

                row = {"T": T, "mode": mode, "tile": [bh, bn, warps, stages]}
                results.append(time_variant(row, launch, out, outs, checked=mode in (1, 5, 6)))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fp8_kv_variants.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
