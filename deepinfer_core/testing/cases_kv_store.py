"""Conformance cases for the attention ops that write the KV pools: ``store_kv`` (plain and FP8-packed
pools) and the fused ``rms_norm_rope_store_kv``, ``write_compressor_state`` and ``compress_into`` (overlapping CSA windows, HCA, FP8-packed entries).

Every pool starts full of random rows, so a write to the wrong slot shows. Slot ``-1`` is the pool's last
row, the scratch slot padding rows write to: it may hold anything afterwards and is not compared; every
other row must equal the reference's. Copies and the FP8 packing compare exactly (the packing is defined
byte for byte, ``deepinfer_core.ops.kv_fp8``); ``compress_into`` computes, so it has ``compress``'s
tolerance, and an FP8 entry it packs may round to a neighbouring e4m3 code.
"""

from __future__ import annotations

import torch

from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
from deepinfer_core.testing.cases_dense import inv_freq, randn
from deepinfer_core.testing.opcase import OpCase

S = 48  # rows of every pool; the last is the scratch slot
D, ROPE = 112, 16  # FP8 entries: 96 quantised channels = one scale group of 64 and a short one of 32
RATIO = 4


def _scratch_slots(g: torch.Generator, n: int, pool: int, scratch: int) -> torch.Tensor:
    """``[n]`` distinct slots below the scratch slot, ``scratch`` of them replaced by ``-1``."""
    slots = torch.randperm(pool - 1, generator=g)[:n]
    slots[torch.randperm(n, generator=g)[:scratch]] = -1
    return slots


def _spread(g: torch.Generator, width: int) -> torch.Tensor:
    """Per-channel magnitudes over 2**12, so the FP8 scale groups get different scales."""
    return 2.0 ** torch.randint(-6, 6, (1, width), generator=g).float()


def _store_plain(g: torch.Generator) -> tuple[tuple, dict]:
    """bf16 rows into a bf16 pool (the model stores rows of the pool's dtype)."""
    pool = randn(g, S, D).to(torch.bfloat16)
    return (pool, _scratch_slots(g, 10, S, 2), randn(g, 10, D).to(torch.bfloat16), None), {}


def _store_fp8(g: torch.Generator) -> tuple[tuple, dict]:
    fmt = Fp8KVFormat(D, ROPE, torch.bfloat16)
    spread = _spread(g, D)
    pool = fmt.pack(randn(g, S, D) * spread)
    values = (randn(g, 10, D) * spread).to(torch.bfloat16)
    return (pool, _scratch_slots(g, 10, S, 2), values, fmt), {}


def _compressor_state(g: torch.Generator) -> tuple[tuple, dict]:
    c, t = 2 * 24, 9
    state = randn(g, S, 2, c)
    kv, gate = randn(g, t, c).to(torch.bfloat16), randn(g, t, c).to(torch.bfloat16)
    positions = torch.randint(0, 5000, (t,), generator=g)
    return (state, _scratch_slots(g, t, S, 2), kv, gate, randn(g, RATIO, c), positions), {}


def _windows(g: torch.Generator, e: int, length: int, overlap: bool) -> torch.Tensor:
    """``[e, length]`` state slots: window 0 without its first half (CSA's first window), window 2 empty."""
    src = torch.randperm(S - 1, generator=g)[: e * length].view(e, length)
    src[0, : length // 2 if overlap else 1] = -1
    src[2] = -1
    return src


def _compress_into(overlap: bool, fp8: bool):
    def make(g: torch.Generator) -> tuple[tuple, dict]:
        e, d = 4, D if fp8 else 32
        length, c = (2 * RATIO, 2 * d) if overlap else (RATIO, d)
        state = torch.stack([randn(g, S, c), randn(g, S, c, scale=2.0)], dim=1)  # [S, 2, C]: kv, score
        positions = torch.tensor([0, 8, 40, 4096]) if overlap else torch.tensor([0, 128, 256, 8192])
        entry_slots = _scratch_slots(g, e, S, 1)
        fmt = Fp8KVFormat(d, ROPE, torch.float32) if fp8 else None
        entries = fmt.pack(randn(g, S, d)) if fp8 else randn(g, S, d)
        args = (state, _windows(g, e, length, overlap), overlap, randn(g, d).abs() + 0.5, 1e-6, positions)
        return (*args, inv_freq(ROPE if fp8 else 8, 160000.0), entries, entry_slots), {"kv_format": fmt}

    return make


def _rows_but_scratch(case_id: str, actual, expected) -> tuple[torch.Tensor, torch.Tensor]:
    (ret, pool), (_, ref_pool) = actual, expected
    assert ret is None, f"{case_id}: returned {type(ret).__name__}; the op writes in place and returns None"
    assert pool.shape == ref_pool.shape and pool.dtype == ref_pool.dtype, f"{case_id}: the pool changed shape"
    return pool[:-1], ref_pool[:-1]


def _same_rows(case_id: str, atol: float = 0.0, rtol: float = 0.0):
    def compare(actual, expected, inputs) -> None:
        pool, ref = _rows_but_scratch(case_id, actual, expected)
        torch.testing.assert_close(pool, ref, atol=atol, rtol=rtol, msg=lambda m: f"{case_id}: {m}")

    return compare


def _close_packed(case_id: str):
    """FP8 entries: RoPE channels (stored in the model dtype) to ``compress``'s tolerance; quantised channels
    within one e4m3 step (a value on a rounding boundary may go either way) or the subnormal step."""

    def compare(actual, expected, inputs) -> None:
        pool, ref = _rows_but_scratch(case_id, actual, expected)
        fmt = inputs[1]["kv_format"]
        a, e = fmt.unpack(pool), fmt.unpack(ref)
        msg = lambda m: f"{case_id}: {m}"  # noqa: E731
        torch.testing.assert_close(a[:, fmt.nope :], e[:, fmt.nope :], atol=1e-5, rtol=1e-4, msg=msg)
        s0 = fmt.scale_offset
        scales = ref[:, s0 : s0 + 4 * fmt.num_scales].contiguous().view(torch.float32)
        atol = 2.0**-9 * float(scales.max())
        torch.testing.assert_close(a[:, : fmt.nope], e[:, : fmt.nope], atol=atol, rtol=0.125, msg=msg)

    return compare


def _norm_rope_store(fp8: bool):
    """Token KV rows normed (a weight), rotated (the last 16 channels, random positions) and stored: float32
    rows into a plain pool or an FP8-packed one (``rms_norm_rope_store_kv``)."""

    def make(g: torch.Generator) -> tuple[tuple, dict]:
        t = 10
        if (
            fp8
        ):  # float32 rows (RoPE channels stored in float32) so the rotation compares to a tight tolerance
            fmt = Fp8KVFormat(D, ROPE, torch.float32)
            spread = _spread(g, D)
            pool, x = fmt.pack(randn(g, S, D) * spread), randn(g, t, D) * spread
        else:
            fmt, pool, x = None, randn(g, S, D), randn(g, t, D)
        weight, positions = randn(g, D).abs() + 0.5, torch.randint(0, 5000, (t,), generator=g)
        return (x, weight, 1e-6, positions, inv_freq(ROPE), pool, _scratch_slots(g, t, S, 2)), {
            "kv_format": fmt
        }

    return make


def _case(
    op: str, name: str, make, compare_for, writes: int, fp8: bool = False, fusion: bool = False
) -> OpCase:
    case_id = f"attention.{op}[{name}]"
    return OpCase(
        "attention",
        op,
        name,
        make,
        compare=compare_for(case_id),
        writes=(writes,),
        kv_cache_dtype="fp8" if fp8 else "auto",
        fusion=fusion,
    )


CASES = [
    _case("store_kv", "plain_scratch_slots", _store_plain, _same_rows, 0),
    _case("store_kv", "fp8_packed_scratch_slots", _store_fp8, _same_rows, 0, fp8=True),
    _case(
        "rms_norm_rope_store_kv",
        "plain_scratch_slots",
        _norm_rope_store(False),
        lambda case_id: _same_rows(case_id, atol=1e-5, rtol=1e-4),
        5,
        fusion=True,
    ),
    _case(
        "rms_norm_rope_store_kv",
        "fp8_packed_scratch_slots",
        _norm_rope_store(True),
        _close_packed,
        5,
        fp8=True,
        fusion=True,
    ),
    _case("write_compressor_state", "scratch_slots", _compressor_state, _same_rows, 0),
    _case(
        "compress_into",
        "csa_overlap",
        _compress_into(True, False),
        lambda i: _same_rows(i, atol=1e-5, rtol=1e-4),
        7,
    ),
    _case(
        "compress_into", "hca", _compress_into(False, False), lambda i: _same_rows(i, atol=1e-5, rtol=1e-4), 7
    ),
    _case("compress_into", "fp8_packed_csa", _compress_into(True, True), _close_packed, 7, fp8=True),
]
