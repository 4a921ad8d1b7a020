"""MoE routing: score function, biased top-k selection and weight normalisation in one launch.

One program routes ``BLOCK_T`` tokens over all ``E`` experts in registers. Top-k is ``k`` rounds of
argmax-and-mask (k is 6 to 8, so this beats a sort); ties go to the lowest expert id. With
``HASH`` the experts are given (``tid2eid``) and only the weights are computed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from deepinfer_cuda_sm100 import dispatch
from deepinfer_cuda_sm100.kernels._common import pdl_enter, pow2

SCORE_FUNCS = {"sqrtsoftplus": 0, "softmax": 1, "sigmoid": 2}


@triton.jit
def _route_kernel(
    logits_ptr, bias_ptr, ids_ptr, w_ptr, T, E, K, stride_lt, scaling,
    SCORE: tl.constexpr, HAS_BIAS: tl.constexpr, HASH: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    pdl_enter(PDL)
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    rm = rows < T
    e = tl.arange(0, BLOCK_E)
    em = e < E
    x = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_lt + e[None, :], mask=rm[:, None] & em[None, :],
                other=0.0).to(tl.float32)  # fmt: skip
    x = tl.where(em[None, :], x, float("-inf"))
    if SCORE == 0:
        # sqrt(softplus(x)), softplus in its overflow-safe form
        sp = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
        s = tl.sqrt(tl.where(em[None, :], sp, 0.0))
    elif SCORE == 1:
        p = tl.exp(x - tl.max(x, axis=1)[:, None])
        s = p / tl.sum(p, axis=1)[:, None]
    else:
        s = tl.where(em[None, :], tl.sigmoid(x), 0.0)
    sel = tl.where(em[None, :], s, float("-inf"))
    if HAS_BIAS:
        sel = sel + tl.load(bias_ptr + e, mask=em, other=0.0)[None, :]
    ks = tl.arange(0, BLOCK_K)
    km = ks < K
    out_w = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.float32)
    out_i = tl.zeros([BLOCK_T, BLOCK_K], dtype=tl.int64)
    if HASH:
        out_i = tl.load(ids_ptr + rows[:, None] * K + ks[None, :], mask=rm[:, None] & km[None, :], other=0)
    for j in range(K):
        if HASH:
            idx = tl.sum(tl.where(ks[None, :] == j, out_i, 0), axis=1)
        else:
            idx = tl.argmax(sel, axis=1, tie_break_left=True).to(tl.int64)
            sel = tl.where(e[None, :] == idx[:, None], float("-inf"), sel)
            out_i = tl.where(ks[None, :] == j, idx[:, None], out_i)
        wj = tl.sum(tl.where(e[None, :] == idx[:, None], s, 0.0), axis=1)
        out_w = tl.where(ks[None, :] == j, wj[:, None], out_w)
    out_w = out_w / (tl.sum(out_w, axis=1)[:, None] + 1e-20) * scaling
    om = rm[:, None] & km[None, :]
    tl.store(w_ptr + rows[:, None] * K + ks[None, :], out_w, mask=om)
    if not HASH:
        tl.store(ids_ptr + rows[:, None] * K + ks[None, :], out_i, mask=om)


def _launch(logits, bias, ids, top_k, score_func, scaling, hash_mode):
    T, E = logits.shape
    w = torch.empty((T, top_k), dtype=torch.float32, device=logits.device)
    if T == 0:
        return w
    logits = logits if logits.stride(-1) == 1 else logits.contiguous()
    cfg = dispatch.route_config(T, E)
    _route_kernel[(triton.cdiv(T, cfg.block_t),)](
        logits, bias.float().contiguous() if bias is not None else logits, ids, w, T, E, top_k, logits.stride(0), scaling,
        SCORE=SCORE_FUNCS[score_func], HAS_BIAS=bias is not None, HASH=hash_mode,
        BLOCK_T=cfg.block_t, BLOCK_E=pow2(E), BLOCK_K=pow2(top_k), num_warps=cfg.num_warps,
        **dispatch.pdl_args(T),
    )  # fmt: skip
    return w


def route_topk(logits, correction_bias, top_k: int, score_func: str, routed_scaling_factor: float):
    """See :meth:`deepinfer_core.ops.moe.MoEOps.route_topk`."""
    ids = torch.empty((logits.shape[0], top_k), dtype=torch.int64, device=logits.device)
    w = _launch(logits, correction_bias, ids, top_k, score_func, routed_scaling_factor, hash_mode=False)
    return w, ids


def route_hash(logits, ids, score_func: str, routed_scaling_factor: float):
    """See :meth:`deepinfer_core.ops.moe.MoEOps.route_hash`."""
    ids = ids.to(torch.int64).contiguous()
    return _launch(logits, None, ids, ids.shape[1], score_func, routed_scaling_factor, hash_mode=True)
