"""A stand-in for ``torch_npu``: each operator the ascend950 plugin calls, in plain torch on the CPU.

Every function follows the argument conventions of its torch_npu page (layouts, dtypes, shapes, return
tuples; pages listed in docs/platforms/ascend950.md) and **rejects** inputs outside the documented
envelope with ``StandinError``, so a plugin call that the real operator would refuse fails here too.
The arithmetic is the page's formula in float32. This checks the plugin's layouts, plumbing and math
against the documented semantics; it says nothing about the vendor kernels themselves.

Where a page leaves something open, the stand-in makes the assumption the plugin makes, marked
``ASSUMED`` (the docs list them): then the test checks consistency, not the vendor's behaviour.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import types

import torch
import torch.nn.functional as F

__version__ = "0.0-standin"
_deepinfer_device_type = "cpu"  # read by deepinfer_ascend950._npu.device_type()

HALF = (torch.float16, torch.bfloat16)
calls: collections.Counter[str] = collections.Counter()


class StandinError(ValueError):
    """The call is outside what the operator's page documents."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise StandinError(msg)


def _op(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        calls[fn.__name__] += 1
        return fn(*args, **kwargs)

    return wrapper


# ---------------------------------------------------------------- norms and rope


@_op
def npu_rms_norm(self, gamma, epsilon=1e-6):
    """-> ``(y, rstd)``; self and gamma share one of float16/bfloat16/float32; gamma is the trailing dims."""
    _check(self.dtype in (*HALF, torch.float32), f"npu_rms_norm: dtype {self.dtype}")
    _check(gamma.dtype == self.dtype, "npu_rms_norm: gamma dtype must equal self dtype")
    _check(tuple(gamma.shape) == tuple(self.shape[self.dim() - gamma.dim() :]), "npu_rms_norm: gamma shape")
    xf = self.float()
    dims = tuple(range(self.dim() - gamma.dim(), self.dim()))
    rstd = torch.rsqrt(xf.square().mean(dim=dims, keepdim=True) + epsilon)
    return (xf * rstd * gamma.float()).to(self.dtype), rstd


@_op
def npu_rotary_mul(input, r1, r2, rotary_mode="half", rotate=None):
    """``out = x * cos + rotate(x) * sin``; interleave mode: ``rotate(x)[2i] = -x[2i+1]``,
    ``rotate(x)[2i+1] = x[2i]``; cos/sin layout T1D for a TND input, 1S1D for BSND."""
    _check(input.dim() in (3, 4), "npu_rotary_mul: input must be 3-d or 4-d")
    _check(rotary_mode in ("half", "interleave"), f"npu_rotary_mul: rotary_mode {rotary_mode!r}")
    _check(rotate is None, "npu_rotary_mul: rotate is not implemented by the stand-in")
    for t in (input, r1, r2):
        _check(t.dtype in (*HALF, torch.float32), f"npu_rotary_mul: dtype {t.dtype}")
    d = input.shape[-1]
    _check(d % 2 == 0 and d < 896, f"npu_rotary_mul: D={d} must be even and < 896")
    if rotary_mode == "interleave":
        want = (input.shape[0], 1, d) if input.dim() == 3 else (1, input.shape[1], 1, d)
        _check(tuple(r1.shape) == want and tuple(r2.shape) == want, f"npu_rotary_mul: cos/sin must be {want}")
        _check(
            input.shape[-2] * (input.shape[0] if input.dim() == 4 else 1) < 1000,
            "npu_rotary_mul: B*N >= 1000",
        )
        x = input.float()
        rot = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    else:
        x = input.float()
        x1, x2 = x.chunk(2, dim=-1)
        rot = torch.cat([-x2, x1], dim=-1)
    return (x * r1.float() + rot * r2.float()).to(input.dtype)


# ---------------------------------------------------------------- mHC


@_op
def npu_mhc_pre(x, phi, alpha, bias, *, gamma=None, norm_eps=1e-6, hc_eps=1e-6, out_flag=0, inner_precise=0):
    """-> ``(h_in, h_post, h_res, inv_rms, h_mix, h_pre)``. RmsNorm over the whole ``n*D`` row (inv_rms
    is ``[T]``); ``H = alpha * (x' @ phi.T) + bias`` split pre/post/res; ``h_in = sum_n H_pre[n] x[n]``
    of the *unnormalised* x. ASSUMED: ``h_post`` is ``[T, n]`` (the page prints ``(T, D)``)."""
    _check(x.dtype in HALF, f"npu_mhc_pre: x dtype {x.dtype} (bfloat16/float16 only)")
    _check(x.dim() in (3, 4), "npu_mhc_pre: x must be (T, n, D) or (B, S, n, D)")
    n, d = x.shape[-2], x.shape[-1]
    _check(n in (4, 6, 8), f"npu_mhc_pre: n={n} (4, 6, 8 only)")
    _check(d % 16 == 0 and 1 <= d <= 16384, f"npu_mhc_pre: D={d}")
    for name, t in (("phi", phi), ("alpha", alpha), ("bias", bias)):
        _check(t.dtype == torch.float32, f"npu_mhc_pre: {name} must be float32")
    _check(tuple(phi.shape) == (n * n + 2 * n, n * d), f"npu_mhc_pre: phi shape {tuple(phi.shape)}")
    _check(tuple(alpha.shape) == (3,) and tuple(bias.shape) == (n * n + 2 * n,), "npu_mhc_pre: alpha/bias")
    _check(out_flag in (0, 1) and inner_precise in (0, 1), "npu_mhc_pre: out_flag/inner_precise")
    xf = x.flatten(-2).float()
    inv_rms = torch.rsqrt(xf.square().mean(-1) + norm_eps)
    xn = xf * inv_rms[..., None]
    if gamma is not None:
        xn = xn * gamma.float().flatten()
    h_mix = xn @ phi.t()
    pre = torch.sigmoid(alpha[0] * h_mix[..., :n] + bias[:n]) + hc_eps
    post = 2 * torch.sigmoid(alpha[1] * h_mix[..., n : 2 * n] + bias[n : 2 * n])
    res = (alpha[2] * h_mix[..., 2 * n :] + bias[2 * n :]).unflatten(-1, (n, n))
    h_in = (pre[..., None] * x.float()).sum(-2).to(x.dtype)
    empty = x.new_empty(0, dtype=torch.float32)
    return h_in, post, res, *((inv_rms, h_mix, pre) if out_flag else (empty, empty, empty))


@_op
def npu_mhc_sinkhorn(x, eps=1e-6, num_iters=20, out_flag=0):
    """-> ``(y, norm_out, sum_out)``: ``softmax(x, -1) + eps``, a column normalisation, then
    ``num_iters - 1`` (row, column) rounds, each dividing by ``sum + eps``."""
    _check(x.dtype == torch.float32, "npu_mhc_sinkhorn: x must be float32")
    _check(
        x.dim() in (3, 4) and x.shape[-1] == x.shape[-2] and x.shape[-1] in (4, 6, 8),
        "npu_mhc_sinkhorn: shape",
    )
    _check(1 <= num_iters <= 100, f"npu_mhc_sinkhorn: num_iters={num_iters}")
    y = torch.softmax(x, dim=-1) + eps
    y = y / (y.sum(-2, keepdim=True) + eps)
    for _ in range(num_iters - 1):
        y = y / (y.sum(-1, keepdim=True) + eps)
        y = y / (y.sum(-2, keepdim=True) + eps)
    empty = x.new_empty(0)
    return y, empty, empty


@_op
def npu_mhc_post(x, h_res, h_out, h_post):
    """``y = h_res @ x + h_out (x) h_post`` (``y[i] = sum_j h_res[i, j] x[j] + h_out * h_post[i]``), in x's dtype."""
    _check(x.dtype in HALF and h_out.dtype == x.dtype, "npu_mhc_post: x/h_out must share bfloat16/float16")
    n, d = x.shape[-2], x.shape[-1]
    lead = tuple(x.shape[:-2])
    _check(tuple(h_out.shape) == (*lead, d), "npu_mhc_post: h_out shape")
    _check(h_post.dtype == torch.float32 and tuple(h_post.shape) == (*lead, n), "npu_mhc_post: h_post")
    y = h_out.float()[..., None, :] * h_post[..., None]
    if h_res is not None:
        _check(h_res.dtype == torch.float32 and tuple(h_res.shape) == (*lead, n, n), "npu_mhc_post: h_res")
        y = y + h_res @ x.float()
    else:
        y = y + x.float()
    return y.to(x.dtype)


# ---------------------------------------------------------------- attention and indexer

_LI_COUNTS = frozenset(range(1, 2049)) | {3072, 4096, 5120, 6144, 7168, 8192}


def _valid_first(idx: torch.Tensor, what: str) -> None:
    """Each row: valid indices first, ``-1`` after (the pages require this packing)."""
    invalid = idx < 0
    _check(bool((invalid[..., :-1] <= invalid[..., 1:]).all()), f"{what}: valid indices must come first")


@_op
def npu_sparse_flash_attention(
    query,
    key,
    value,
    sparse_indices,
    scale_value,
    *,
    block_table=None,
    actual_seq_lengths_query=None,
    actual_seq_lengths_kv=None,
    query_rope=None,
    key_rope=None,
    sparse_block_size=1,
    layout_query="BSND",
    layout_kv="BSND",
    sparse_mode=3,
    pre_tokens=2**63 - 1,
    next_tokens=2**63 - 1,
    attention_mode=0,
    return_softmax_lse=False,
    sinks=None,
):
    """BSND/BSND, MLA-absorb (``attention_mode=2``): ``Q = [query, query_rope]``, ``K = [key, key_rope]``,
    ``V = value``; each query row attends to ``key[b, sparse_indices[b, s, 0, :]]`` (valid first, -1 after).
    Implemented: ``sparse_mode=0`` (no extra mask). ASSUMED for ``sinks [N1]`` (float32): one extra logit
    per head in the softmax denominator that carries no value (the page gives no formula)."""
    _check(attention_mode == 2, "npu_sparse_flash_attention: attention_mode must be 2")
    _check(layout_query == "BSND" and layout_kv == "BSND", "stand-in implements BSND/BSND only")
    _check(sparse_mode == 0, "stand-in implements sparse_mode=0 only")
    _check(sparse_block_size == 1, "npu_sparse_flash_attention: sparse_block_size must be 1 on Ascend 950")
    _check(
        query.dtype in HALF and key.dtype == query.dtype == value.dtype, "npu_sparse_flash_attention: dtypes"
    )
    b, s1, n1, d = query.shape
    _check(d == 512 and key.shape[-1] == 512, "npu_sparse_flash_attention: D must be 512")
    _check(1 <= n1 <= 128, f"npu_sparse_flash_attention: N1={n1} (1..128 on Ascend 950)")
    _check(
        key.dim() == 4 and key.shape[0] == b and key.shape[2] == 1,
        "npu_sparse_flash_attention: key [B,S2,1,D]",
    )
    _check(tuple(value.shape) == tuple(key.shape), "npu_sparse_flash_attention: value shape")
    _check(query_rope is not None and tuple(query_rope.shape) == (b, s1, n1, 64), "query_rope [B,S1,N1,64]")
    _check(key_rope is not None and tuple(key_rope.shape) == (*key.shape[:3], 64), "key_rope [B,S2,1,64]")
    _check(
        sparse_indices.dtype == torch.int32 and sparse_indices.dim() == 4, "sparse_indices int32 [B,S1,1,K]"
    )
    _check(
        tuple(sparse_indices.shape[:3]) == (b, s1, 1) and sparse_indices.shape[3] > 0, "sparse_indices shape"
    )
    _valid_first(sparse_indices, "npu_sparse_flash_attention")
    _check(
        sinks is None or (sinks.dtype == torch.float32 and tuple(sinks.shape) == (n1,)), "sinks float32 [N1]"
    )
    idx = sparse_indices[:, :, 0].long()  # [B, S1, K]
    valid = idx >= 0
    kfull = torch.cat([key, key_rope], dim=-1)[:, :, 0].float()  # [B, S2, 576]
    gather_k = torch.stack([kfull[i][idx[i].clamp(min=0)] for i in range(b)])  # [B, S1, K, 576]
    gather_v = torch.stack([value[i, :, 0].float()[idx[i].clamp(min=0)] for i in range(b)])
    q = torch.cat([query, query_rope], dim=-1).float()  # [B, S1, N1, 576]
    logits = torch.einsum("bsnd,bskd->bsnk", q, gather_k) * scale_value
    logits = logits.masked_fill(~valid[:, :, None, :], float("-inf"))
    if sinks is not None:
        logits = torch.cat([logits, sinks.float()[None, None, :, None].expand(b, s1, n1, 1)], dim=-1)
    probs = torch.softmax(logits, dim=-1)[..., : idx.shape[-1]]
    out = torch.einsum("bsnk,bskd->bsnd", probs, gather_v).to(query.dtype)
    empty = query.new_empty(0, dtype=torch.float32)
    return out, empty, empty


@_op
def npu_lightning_indexer(
    query,
    key,
    weights,
    *,
    actual_seq_lengths_query=None,
    actual_seq_lengths_key=None,
    block_table=None,
    layout_query="BSND",
    layout_key="BSND",
    sparse_count=2048,
    sparse_mode=3,
    pre_tokens=2**63 - 1,
    next_tokens=2**63 - 1,
    return_value=False,
):
    """``Indices = TopK_j( sum_g W[g] * ReLU(Q[g] . K[j]) )`` over the first ``actual_seq_lengths_key[b]``
    keys of batch ``b`` -> ``(sparse_indices int32 [B, S1, 1, sparse_count], values)``. Implemented:
    BSND/BSND, ``sparse_mode=0``. ASSUMED: positions past the valid count are -1, top scores first."""
    _check(layout_query == "BSND" and layout_key == "BSND", "stand-in implements BSND/BSND only")
    _check(sparse_mode == 0, "stand-in implements sparse_mode=0 only")
    _check(query.dtype in HALF and key.dtype == query.dtype, "npu_lightning_indexer: query/key dtypes")
    _check(weights.dtype == query.dtype, "npu_lightning_indexer: Ascend 950 takes no float32 weights")
    b, s1, n1, d = query.shape
    _check(d == 128 and key.shape[-1] == 128, "npu_lightning_indexer: D must be 128")
    _check(n1 in (8, 16, 24, 32, 64), f"npu_lightning_indexer: N1={n1} (8/16/24/32/64 on Ascend 950)")
    _check(
        key.dim() == 4 and key.shape[0] == b and key.shape[2] == 1, "npu_lightning_indexer: key [B,S2,1,D]"
    )
    _check(tuple(weights.shape) == (b, s1, n1), "npu_lightning_indexer: weights [B,S1,N1]")
    _check(sparse_count in _LI_COUNTS, f"npu_lightning_indexer: sparse_count={sparse_count}")
    s2 = key.shape[1]
    lens = torch.full((b,), s2) if actual_seq_lengths_key is None else actual_seq_lengths_key
    _check(
        lens.dtype in (torch.int32, torch.int64) and tuple(lens.shape) == (b,), "actual_seq_lengths_key [B]"
    )
    _check(bool(((lens >= 0) & (lens <= s2)).all()), "actual_seq_lengths_key out of range")
    score = torch.einsum("bsnd,bjd->bsnj", query.float(), key[:, :, 0].float()).relu()
    score = (score * weights.float()[..., None]).sum(2)  # [B, S1, S2]
    score = score.masked_fill(torch.arange(s2)[None, None, :] >= lens.long()[:, None, None], float("-inf"))
    if s2 < sparse_count:
        score = F.pad(score, (0, sparse_count - s2), value=float("-inf"))
    vals, idx = torch.topk(score, sparse_count, dim=-1)
    idx = torch.where(vals > float("-inf"), idx, -1).to(torch.int32)[:, :, None, :]
    return idx, vals.to(query.dtype)[:, :, None, :]


# ---------------------------------------------------------------- MoE


@_op
def npu_moe_gating_top_k(
    x,
    k,
    *,
    bias=None,
    input_ids=None,
    tid2eid=None,
    k_group=1,
    group_count=1,
    group_select_mode=0,
    renorm=0,
    norm_type=0,
    out_flag=False,
    routed_scaling_factor=1.0,
    eps=1e-20,
):
    """The page's equivalent code: ``norm = softmax (0) | sigmoid (1)``; select top-k groups, then top-k
    experts of ``norm + bias`` (stable); ``y = norm[chosen]``, divided by ``sum + eps`` for sigmoid only,
    times ``routed_scaling_factor`` -> ``(y [T, k] x.dtype, idx int32, norm_out f32)``."""
    _check(x.dim() == 2 and x.dtype in (*HALF, torch.float32), "npu_moe_gating_top_k: x 2-d")
    e = x.shape[1]
    _check(e <= 2048, "npu_moe_gating_top_k: at most 2048 experts")
    _check(
        bias is None or (bias.dtype == x.dtype and tuple(bias.shape) == (e,)), "npu_moe_gating_top_k: bias"
    )
    _check(renorm == 0 and norm_type in (0, 1), "npu_moe_gating_top_k: renorm must be 0, norm_type 0/1")
    _check(input_ids is None and tid2eid is None, "stand-in does not implement hash mode")
    _check(
        group_count > 0 and e % group_count == 0 and e // group_count > 2, "npu_moe_gating_top_k: group_count"
    )
    _check(1 <= k_group <= group_count and 1 <= k <= e // group_count * k_group, "npu_moe_gating_top_k: k")
    xf = x.float()
    norm = torch.softmax(xf, dim=-1) if norm_type == 0 else torch.sigmoid(xf)
    sel = norm if bias is None else norm + bias.float()
    if group_count > 1:
        g = sel.view(x.shape[0], group_count, -1)
        gscore = g.amax(-1) if group_select_mode == 0 else g.topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(gscore, dtype=torch.bool).scatter_(
            1, torch.sort(-gscore, dim=-1, stable=True).indices[:, :k_group], True
        )
        sel = g.masked_fill(~keep[..., None], float("-inf")).view(x.shape[0], e)
    idx = torch.sort(-sel, dim=-1, stable=True).indices[:, :k]
    y = norm.gather(1, idx)
    if norm_type == 1:
        y = y / (y.sum(-1, keepdim=True) + eps)
    y = y * routed_scaling_factor
    return y.to(x.dtype), idx.to(torch.int32), norm if out_flag else xf.new_empty(0)


@_op
def npu_moe_init_routing_v2(
    x,
    expert_idx,
    *,
    scale=None,
    offset=None,
    active_num=-1,
    expert_capacity=-1,
    expert_num=-1,
    drop_pad_mode=0,
    expert_tokens_num_type=0,
    expert_tokens_num_flag=False,
    quant_mode=-1,
    active_expert_range=(),
    row_idx_type=0,
):
    """Dropless, unquantised: stable sort of the flattened ``expert_idx`` (source row ``i = t*K + j``);
    ``expanded_x[p] = x[sorted_row[p] // K]``; gather index (type 0) ``expanded_row_idx[sorted_row[p]] = p``,
    -1 outside ``active_expert_range``; per-expert counts (type 1) or cumsum (type 0) as int64.
    Rows past the in-range count are unspecified; the stand-in fills them with NaN."""
    _check(x.dim() == 2 and x.dtype in (*HALF, torch.float32), "npu_moe_init_routing_v2: x (NUM_ROWS, H)")
    _check(expert_idx.dim() == 2 and expert_idx.dtype == torch.int32, "expert_idx int32 (NUM_ROWS, K)")
    _check(expert_idx.shape[0] == x.shape[0], "npu_moe_init_routing_v2: rows of x and expert_idx differ")
    _check(drop_pad_mode == 0 and quant_mode == -1, "stand-in implements dropless, unquantised only")
    _check(expert_num > 0 and bool(((expert_idx >= 0) & (expert_idx < expert_num)).all()), "expert ids range")
    _check(expert_tokens_num_type in (0, 1) and row_idx_type in (0, 1), "npu_moe_init_routing_v2: types")
    start, end = tuple(active_expert_range) or (0, expert_num)
    k = expert_idx.shape[1]
    flat = expert_idx.flatten().long()
    sorted_e, sorted_row = torch.sort(flat, stable=True)
    inside = (sorted_e >= start) & (sorted_e < end)
    pos = torch.cumsum(inside.long(), 0) - 1
    n = flat.numel()
    expanded_x = torch.full((n, x.shape[1]), float("nan"), dtype=x.dtype)
    expanded_x[pos[inside]] = x[sorted_row[inside] // k]
    row_idx = torch.full((n,), -1, dtype=torch.int32)
    if row_idx_type == 0:
        row_idx[sorted_row[inside]] = pos[inside].to(torch.int32)
    else:
        row_idx[: int(inside.sum())] = sorted_row[inside].to(torch.int32)
    counts = torch.bincount(flat[(flat >= start) & (flat < end)] - start, minlength=end - start)
    tokens = counts if expert_tokens_num_type == 1 else torch.cumsum(counts, 0)
    return expanded_x, row_idx, tokens.to(torch.int64), torch.zeros(x.shape[0], dtype=torch.float32)


@_op
def npu_grouped_matmul(
    x,
    weight,
    *,
    bias=None,
    scale=None,
    offset=None,
    antiquant_scale=None,
    antiquant_offset=None,
    per_token_scale=None,
    group_list=None,
    activation_input=None,
    activation_quant_scale=None,
    activation_quant_offset=None,
    split_item=0,
    group_type=None,
    group_list_type=0,
    act_type=0,
    output_dtype=None,
    tuning_config=None,
):
    """Non-quantised m-axis grouping (``group_type=0``) with one x and one output (``split_item`` 2/3):
    ``y[rows of group g] = x[rows of g] @ weight_g``, ``weight_g [K, N]`` from a list (at most 128 with
    ``group_list_type=1``) or one ``[G, K, N]`` tensor (at most 1024 groups). ``group_list`` int64:
    cumsum (type 0) or counts (type 1), one entry per group, covering all rows of x."""
    _check(isinstance(x, list) and len(x) == 1 and x[0].dim() == 2, "stand-in: one 2-d x")
    _check(group_type == 0 and split_item in (2, 3), "stand-in implements group_type=0, split_item 2/3")
    for name, v in (
        ("bias", bias),
        ("scale", scale),
        ("antiquant_scale", antiquant_scale),
        ("pts", per_token_scale),
    ):
        _check(v is None, f"stand-in implements the non-quantised case only ({name} given)")
    xs = x[0]
    _check(xs.dtype in HALF, "npu_grouped_matmul: x bfloat16/float16 (float32 only as single tensors)")
    if len(weight) == 1 and weight[0].dim() == 3:
        mats = list(weight[0].unbind(0))
        _check(len(mats) <= 1024, "npu_grouped_matmul: at most 1024 groups")
    else:
        mats = list(weight)
        _check(all(w.dim() == 2 for w in mats), "npu_grouped_matmul: weights [K, N]")
        _check(group_list_type != 1 or len(mats) <= 128, "npu_grouped_matmul: at most 128 weights (type 1)")
    _check(
        all(w.dtype == xs.dtype and w.shape[0] == xs.shape[1] for w in mats),
        "weights must be [K, N] in x dtype",
    )
    _check(len({w.shape[1] for w in mats}) == 1, "npu_grouped_matmul: N must be equal across weights")
    _check(output_dtype in (None, xs.dtype), "npu_grouped_matmul: output_dtype")
    _check(
        isinstance(group_list, torch.Tensor) and group_list.dtype == torch.int64, "group_list int64 tensor"
    )
    _check(group_list.dim() == 1 and group_list.numel() == len(mats), "group_list: one entry per group")
    _check(group_list_type in (0, 1), "stand-in implements group_list_type 0/1")
    counts = group_list if group_list_type == 1 else torch.diff(group_list, prepend=group_list.new_zeros(1))
    _check(bool((counts >= 0).all()) and int(counts.sum()) == xs.shape[0], "group sizes must cover x's rows")
    ys = [seg.float() @ w.float() for seg, w in zip(xs.split(counts.tolist()), mats)]
    return [torch.cat(ys).to(xs.dtype)]


@_op
def npu_moe_finalize_routing(
    expanded_permuted_rows,
    skip1,
    skip2,
    bias,
    scales,
    expanded_src_to_dst_row,
    expert_for_source_row,
    drop_pad_mode=0,
):
    """``out[i] = skip1 + skip2 + sum_k scales[i, k] * (rows[src_to_dst[idx(i, k)]] + bias[expert])`` with
    ``idx = k*NUM_ROWS + i`` (modes 0/1, column order) or ``i*K + k`` (modes 2/3, row order); dropless
    modes take indices in ``[0, NUM_ROWS*K - 1]``."""
    rows = expanded_permuted_rows
    _check(rows.dim() == 2 and rows.dtype in (*HALF, torch.float32), "expanded_permuted_rows (NUM_ROWS*K, H)")
    _check(drop_pad_mode in (0, 2), "stand-in implements the dropless modes 0/2")
    _check(
        expanded_src_to_dst_row.dtype == torch.int32 and expanded_src_to_dst_row.dim() == 1,
        "src_to_dst int32",
    )
    _check(scales is not None and scales.dtype == rows.dtype, "scales must share the rows' dtype")
    _check(skip2 is None or skip1 is not None, "skip2 requires skip1")
    nk = expanded_src_to_dst_row.numel()
    t, k = scales.shape
    _check(t * k == nk, "scales must be (NUM_ROWS, K)")
    _check(bool(((expanded_src_to_dst_row >= 0) & (expanded_src_to_dst_row < nk)).all()), "src_to_dst range")
    idx = (
        expanded_src_to_dst_row.long().view(k, t).t()
        if drop_pad_mode == 0
        else expanded_src_to_dst_row.long().view(t, k)
    )
    picked = rows.float()[idx]  # [T, K, H]
    if bias is not None:
        picked = picked + bias.float()[expert_for_source_row.long()]
    out = (scales.float()[..., None] * picked).sum(1)
    for s in (skip1, skip2):
        if s is not None:
            out = out + s.float()
    return out.to(rows.dtype)


# ---------------------------------------------------------------- sampling


@_op
def npu_top_k_top_p(logits, p, k):
    """Stable ascending sort; -inf below the k-th largest; softmax; -inf where the ascending cumulative
    probability is <= 1 - p (the largest always kept); back to the original order."""
    _check(logits.dim() == 2 and logits.dtype in (*HALF, torch.float32), "npu_top_k_top_p: logits 2-d")
    b, v = logits.shape
    _check(p.dtype == logits.dtype and tuple(p.shape) == (b,), "npu_top_k_top_p: p [B] in logits dtype")
    _check(k.dtype == torch.int32 and tuple(k.shape) == (b,), "npu_top_k_top_p: k int32 [B]")
    _check(bool(((k >= 1) & (k <= min(1024, v))).all()), "npu_top_k_top_p: k in [1, 1024] and <= V")
    vals, order = torch.sort(logits, dim=-1, stable=True)
    kth = vals.gather(1, (v - k.long())[:, None])
    vals = vals.masked_fill(vals < kth, float("-inf"))
    cum = torch.cumsum(torch.softmax(vals.float(), dim=-1), dim=-1)
    drop = cum <= (1 - p.float())[:, None]
    drop[:, -1] = False
    vals = vals.masked_fill(drop, float("-inf"))
    return torch.empty_like(vals).scatter_(1, order, vals)


# ---------------------------------------------------------------- torch.npu


class _Stream:
    def wait_stream(self, other) -> None:
        pass


class NPUGraph:
    """Records nothing: the stand-in cannot capture kernels. ``replay`` counts calls; tests check the
    capture protocol (warm-up, capture inside ``torch.npu.graph``), not graph execution."""

    def __init__(self) -> None:
        self.captured = False
        self.replays = 0

    def replay(self) -> None:
        _check(self.captured, "NPUGraph.replay before capture")
        self.replays += 1


@contextlib.contextmanager
def _graph(g: NPUGraph):
    _check(not g.captured, "NPUGraph captured twice")
    yield g
    g.captured = True
    npu.graphs.append(g)


@contextlib.contextmanager
def _stream(s):
    yield s


def make_npu_namespace(
    devices: int = 1, free: int = 48 << 30, total: int = 64 << 30
) -> types.SimpleNamespace:
    """A fake ``torch.npu``: device count, name, memory info, streams, synchronize and graphs."""
    return types.SimpleNamespace(
        device_count=lambda: devices,
        is_available=lambda: devices > 0,
        current_device=lambda: 0,
        get_device_name=lambda i=0: "Ascend950 (stand-in)",
        mem_get_info=lambda device=None: (free, total),
        synchronize=lambda device=None: None,
        Stream=_Stream,
        current_stream=lambda device=None: _Stream(),
        stream=_stream,
        NPUGraph=NPUGraph,
        graph=_graph,
        graphs=[],
    )


npu = make_npu_namespace()
