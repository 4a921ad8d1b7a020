"""What a step of the V4.1 slice (``slice_model41``) must read and compute: the bytes of a decode step (the
roofline's numerator) and the FLOPs of a prefill chunk (against the matmul rate), stated models used by
``v41_slice.py``."""

from __future__ import annotations

import torch
from slice_model import step_bytes, weight_bytes


def weight_bytes41(model) -> dict[str, float]:
    """Bytes a decode step reads (``slice_model.weight_bytes``): routed experts (per expert per layer), the rest of
    the target (DSpark's ``mtp.*`` stages and the host-resident Engram tables left out), one embedding row; and
    ``head``: the head's and final norm's part of ``other``."""
    wb = weight_bytes(model, skip=lambda name: name.startswith("mtp.") or ".engram.embed." in name)
    wb["head"] = sum(t.numel() * t.element_size() for t in (model.head.value, model.norm.value))
    return wb


def kv_bytes_per_row(model, ctx: int) -> float:
    """A model of the KV bytes one decode row reads at context ``ctx``: every layer's window (FP8 entries), the
    top-k compressed entries (FP4) of compressed layers, and the index keys (FP4) an index source scores (all
    compressed positions before the candidate source, the candidate pool after it)."""
    c = model.cfg
    window = c.head_dim + 2 * c.qk_rope_head_dim + c.head_dim // 32 * 4  # e4m3 + bf16 rope + scales (about)
    entry = c.head_dim // 2 + c.head_dim // 16  # e2m1 + e4m3 scale per 16
    key = c.index_head_dim // 2 + c.index_head_dim // 16
    pool = c.candidate_topk_blocks * c.candidate_block_size
    total = 0.0
    for i, role in enumerate(model.cfg.roles):
        total += min(ctx, c.sliding_window) * window
        if role.ratio:
            n = ctx // role.ratio
            total += min(c.index_topk, n) * entry
            if i in c.index_source_layers:
                total += (n if i <= c.candidate_source_layer else min(n, pool)) * key
    return total


def decode_bytes(model, wb, batch: int, ctx: int) -> float:
    return step_bytes(model.cfg, wb, batch, kv_bytes_per_row(model, ctx))


def prefill_flops41(model, tokens: int, decoder_rows: int | None = None) -> dict[str, float]:
    """2 x multiply-adds of one ``tokens``-row prefill (one chunk from position 0), a stated model: each layer's
    matrices from the model's own slots (logical shapes; routed experts x top-k per row, the Engram table and the
    embedding gathered, not multiplied), attention over each row's window and its selected compressed entries
    (``4 h d`` an entry: scores and values), each indexer query scoring the compressed keys before it (inside the
    candidate pool after the candidate source), and the head on the last row. ``decoder_rows``: the decoder
    layers (after the last Full layer) run on that many rows (bounded replay: the chunk's last window)."""
    from deepinfer_core.ops.weights import QuantizedWeight

    c = model.cfg
    h, d, idx = c.num_attention_heads, c.head_dim, c.index_n_heads * c.index_head_dim
    pool = c.candidate_topk_blocks * c.candidate_block_size
    macs: dict[int, float] = {}
    for name, s in model.named_slots():
        parts = name.split(".")
        if parts[0] != "layers" or ".engram.embed." in name:
            continue
        v = s.value
        if isinstance(v, QuantizedWeight):
            m = v.shape[0] * v.shape[1]
        elif isinstance(v, torch.Tensor) and v.dim() == 2:
            m = v.numel()
        else:
            continue
        if ".ffn.experts." in name:
            m = m * c.num_experts_per_tok / c.n_routed_experts
        macs[int(parts[1])] = macs.get(int(parts[1]), 0.0) + m
    t = torch.arange(tokens, dtype=torch.float64)
    total = matmul = 0.0
    for i, role in enumerate(c.roles):
        rows = tokens if decoder_rows is None or i < (model.decoder_start or 0) else min(decoder_rows, tokens)
        tt = t[tokens - rows :]
        matmul += 2 * rows * macs.get(i, 0.0)
        entries = torch.clamp(tt + 1, max=c.sliding_window)
        if role.ratio:
            n = torch.floor((tt + 1) / role.ratio)
            entries = entries + torch.clamp(n, max=c.index_topk)
            if role.owns_query:
                scored = torch.clamp(n, max=pool) if role.uses_candidates else n
                total += 2 * idx * float(scored.sum())
        total += 4 * h * d * float(entries.sum())
    matmul += 2 * c.hidden_size * c.vocab_size
    return {"flops": total + matmul, "weight_flops": matmul, "attention_flops": total}
