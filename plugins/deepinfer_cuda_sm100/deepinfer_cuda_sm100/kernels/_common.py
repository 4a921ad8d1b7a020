"""Helpers shared by the kernel modules."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

try:  # Triton 3.3+: griddepcontrol (programmatic dependent launch, SM90+)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # older Triton: dispatch.pdl_args is empty, the PDL branch never compiles
    gdc_launch_dependents = gdc_wait = None


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (CPU interpreter, used by CI)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


#: torch dtype -> Triton dtype of the tensors the kernels read and write
TL_DTYPE = {
    torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32,
    torch.float8_e4m3fn: tl.float8e4nv, torch.uint8: tl.uint8,
}  # fmt: skip


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand dtype for ``tl.dot`` on tiles loaded as ``dtype``.

    Triton's interpreter stores bfloat16 as raw ``uint16`` and multiplies the bit patterns in
    ``tl.dot`` (triton-lang/triton#11584, still so in 3.6 and 3.9), so under the interpreter the
    operands are upcast to float32. On a GPU the tile keeps its own dtype and uses the tensor cores.
    """
    if interpreting():
        return tl.float32
    return TL_DTYPE[dtype]


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of every kernel. With ``PDL`` (launched with ``launch_pdl``, :func:`dispatch.pdl_args`): wait
    until the kernel before this one on the stream has finished and its writes are visible, then let the next
    kernel start launching. Its programs then sit resident in ``griddepcontrol.wait`` while this one runs, so
    the launch latency between two decode kernels overlaps the first one instead of following it. Waiting
    before any load or store keeps every read-after-write and write-after-read order of the plain launch."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def pool_slot(slots_ptr, i, S):
    """Slot ``slots_ptr[i]`` of a pool of ``S`` rows as torch indexing reads it: ``-1`` is the last row, the
    scratch slot that padding rows of a static batch write to."""
    slot = tl.load(slots_ptr + i).to(tl.int64)
    return tl.where(slot < 0, slot + S, slot)


@triton.jit
def mma(a, b, acc, DOT_T: tl.constexpr):
    """``tl.dot(a, b, acc)``; float32 operands multiply in full float32 (``ieee``), not Triton's default
    TF32, so the float32 engine path follows the float32 reference."""
    if DOT_T == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def swiglu(gate, up, limit):
    """``silu(min(gate, limit)) * clamp(up, -limit, limit)`` (no clamping when ``limit <= 0``)."""
    if limit > 0:
        gate = tl.minimum(gate, limit)
        up = tl.minimum(tl.maximum(up, -limit), limit)
    return gate * tl.sigmoid(gate) * up


@triton.jit
def store_tile(acc, acc2, rows, rm, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, ws_ptr, cnt_ptr, R, N, stride_cm,
               limit, GATED: tl.constexpr, HAS_C_IDX: tl.constexpr, HAS_ROW_W: tl.constexpr, SPLIT_K: tl.constexpr,
               FINISH: tl.constexpr = False, HAS_ADD: tl.constexpr = False):  # fmt: skip
    """The end of a grouped-GEMM tile (``acc``, and ``acc2`` = up when ``GATED``; rows by sorted row).

    With ``SPLIT_K > 1`` the float32 partials go to this K slice's workspace; ``_splitk_epilogue_kernel``
    finishes, or with ``FINISH`` the tile's last slice to arrive (:func:`finish_split`). Otherwise:
    :func:`epilogue`."""
    if SPLIT_K > 1:
        part = ws_ptr + (tl.program_id(2) * (2 if GATED else 1)) * R * N
        off = rows[:, None].to(tl.int64) * N + n[None, :]
        wm = rm[:, None] & nm[None, :]
        tl.store(part + off, acc, mask=wm)
        if GATED:
            tl.store(part + R * N + off, acc2, mask=wm)
        if FINISH:
            finish_split(rows, rm, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, ws_ptr, cnt_ptr, R, N, stride_cm,
                         limit, GATED, HAS_C_IDX, HAS_ROW_W, SPLIT_K, HAS_ADD)  # fmt: skip
    else:
        epilogue(acc, acc2, rows, rm, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, stride_cm, limit, GATED,
                 HAS_C_IDX, HAS_ROW_W, HAS_ADD)  # fmt: skip


@triton.jit
def epilogue(acc, acc2, rows, rm, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, stride_cm, limit, GATED: tl.constexpr,
             HAS_C_IDX: tl.constexpr, HAS_ROW_W: tl.constexpr, HAS_ADD: tl.constexpr = False):  # fmt: skip
    """SwiGLU (``GATED``), per-row weight, scatter to ``c_idx`` rows, cast, store. ``HAS_ADD``: the cast result
    plus ``add_ptr``'s element at the same place (laid out as ``c``), rounded again: the two roundings of a
    GEMM's output and then a torch add of the two (``compose_swiglu_mlp_add``)."""
    if GATED:
        acc = swiglu(acc, acc2, limit)
    if HAS_ROW_W:
        acc = acc * tl.load(row_w_ptr + rows, mask=rm, other=0.0)[:, None]
    if HAS_C_IDX:
        c_rows = tl.load(c_idx_ptr + rows, mask=rm, other=0)
    else:
        c_rows = rows
    off = c_rows[:, None].to(tl.int64) * stride_cm + n[None, :]
    out = acc.to(c_ptr.dtype.element_ty)
    if HAS_ADD:
        other = tl.load(add_ptr + off, mask=rm[:, None] & nm[None, :], other=0.0)
        out = round_nearest_even(out.to(tl.float32) + other.to(tl.float32), c_ptr.dtype.element_ty)
    tl.store(c_ptr + off, out, mask=rm[:, None] & nm[None, :])


@triton.jit
def bf16_grid(x):
    """float32 ``x`` rounded to the nearest bfloat16 value, ties to even, still in float32 (finite values), by bits:
    the Triton interpreter's own float32 -> bfloat16 cast truncates, and casting a value on the grid is exact."""
    b = x.to(tl.int32, bitcast=True)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)  # -65536: 0xFFFF0000


@triton.jit
def round_nearest_even(x, DT: tl.constexpr):
    """float32 ``x`` to ``DT`` rounded to nearest, ties to even, as torch rounds (finite values): bfloat16 through
    :func:`bf16_grid`, other dtypes by a cast."""
    if DT == tl.bfloat16:
        return bf16_grid(x).to(tl.bfloat16)
    else:
        return x.to(DT)


@triton.jit
def finish_split(rows, rm, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, ws_ptr, cnt_ptr, R, N, stride_cm, limit,
                 GATED: tl.constexpr, HAS_C_IDX: tl.constexpr, HAS_ROW_W: tl.constexpr, SPLIT_K: tl.constexpr,
                 HAS_ADD: tl.constexpr = False):  # fmt: skip
    """Split-K without a second launch: each K slice of an output tile, its partial stored, counts itself in
    the tile's counter (``cnt_ptr``, zero between launches); the last one sums the ``SPLIT_K`` partials in
    slice order, as ``_splitk_epilogue_kernel`` does (the same floats), runs :func:`epilogue` and zeroes the
    counter again. The barrier before the count orders every thread's partial before it (release), the one
    after orders the count before the last slice's loads (acquire), which bypass L1 (``.cg``): CUTLASS's
    semaphore pattern. Rows no tile covers are not written (callers use it when every row is tiled)."""
    tl.debug_barrier()
    slot = cnt_ptr + tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    arrived = tl.atomic_add(slot, 1, sem="acq_rel", scope="gpu")
    tl.debug_barrier()
    if arrived == SPLIT_K - 1:
        stride = (2 if GATED else 1) * R * N
        off = rows[:, None].to(tl.int64) * N + n[None, :]
        wm = rm[:, None] & nm[None, :]
        acc = tl.zeros_like(off).to(tl.float32)
        acc2 = tl.zeros_like(acc)
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(ws_ptr + s * stride + off, mask=wm, other=0.0, cache_modifier=".cg")
            if GATED:
                acc2 += tl.load(ws_ptr + s * stride + R * N + off, mask=wm, other=0.0, cache_modifier=".cg")
        epilogue(acc, acc2, rows, rm, n, nm, c_ptr, c_idx_ptr, row_w_ptr, add_ptr, stride_cm, limit, GATED,
                 HAS_C_IDX, HAS_ROW_W, HAS_ADD)  # fmt: skip
        tl.atomic_xchg(slot, 0)


@triton.jit
def weight_base(tab, ex, W_T: tl.constexpr, ALIGNED: tl.constexpr):
    """Expert ``ex``'s weight address from a table of ``data_ptr()`` values (16-byte aligned if ``ALIGNED``)."""
    p = tl.load(tab + ex)
    if ALIGNED:
        p = tl.multiple_of(p, 16)
    return p.to(tl.pointer_type(W_T))


@triton.jit
def weight_tile(base, rows, stride, cols, row_ok, K_COLS, ALIGNED: tl.constexpr):
    """Load ``base[rows, cols]`` (``[BLOCK_N, C]``) of a 1-byte weight (FP8 values or FP4 bytes) with
    ``K_COLS`` columns per row. ``ALIGNED`` (``WeightTable.aligned`` and K a whole number of steps): rows
    start 16-byte aligned and no step runs past a row, so hints let each thread load 16 bytes at once
    (without them Triton loads one byte per instruction: 2.7x the instructions per FP4 step, NOTES.md v7)."""
    ptr = base + rows[:, None] * stride + cols[None, :]
    zero = tl.zeros(
        [1, 1], dtype=base.dtype.element_ty
    )  # masked lanes read 0 (an FP8 NaN would poison the sum)
    if ALIGNED:
        ptr = tl.max_contiguous(tl.multiple_of(ptr, [16, 16]), [1, 16])
        return tl.load(ptr, mask=row_ok[:, None], other=zero)
    else:
        return tl.load(ptr, mask=row_ok[:, None] & (cols < K_COLS)[None, :], other=zero)


def pow2(n: int, lo: int = 1) -> int:
    return max(lo, triton.next_power_of_2(int(n)))


@triton.jit
def scale_f32(s):
    """Per-32 FP4 scales as float32, stored as float32 or as ue8m0 bytes (a float32's exponent field;
    byte 0, ``2**-127``, reads as 0)."""
    if s.dtype == tl.uint8:
        return (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    else:
        return s.to(tl.float32)


#: arrival counters one launch may use (one int32 each, kept zero between launches)
COUNTERS = 1 << 16
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def arrival_counters(device: torch.device) -> torch.Tensor:
    """The per-device arrival counters of kernels whose last program to arrive finishes the work (split-K
    tiles in :func:`finish_split`): zeros, allocated once, on first use (decode
    warms up before graphs are captured); every launch leaves the counters it used zero again. One stream per
    device uses them, and a launch starts only after the previous one has finished (with PDL too: the programs
    wait in ``griddepcontrol.wait`` before any access)."""
    c = _COUNTERS.get(device)
    if c is None:
        c = _COUNTERS[device] = torch.zeros(COUNTERS, dtype=torch.int32, device=device)
    return c


# ---------------------------------------------------------------- DeepSeek-V4.1 quantisers (ops/kv_quant.py)


@triton.jit
def e4m3_grid(y):
    """``y`` (``|y| <= 448``) rounded to the nearest e4m3 value, ties to even, still in float32, so the cast
    after it is exact. Triton's interpreter rounds float32 -> e4m3 without carrying a mantissa overflow
    into the exponent (1.97 becomes 1.0), and an exact cast is the same on every implementation.
    Normal range: keep 3 mantissa bits of the float32 pattern; below 2**-6: multiples of 2**-9."""
    b = y.to(tl.int32, bitcast=True)
    normal = ((b + 0x7FFFF + ((b >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)  # -1048576: 0xFFF00000
    t = tl.abs(y) * 512.0
    small = ((t + 8388608.0) - 8388608.0) * 0.001953125  # 2**23: float32 addition rounds t to an integer
    # y's sign bit set on the magnitude by bits: -small is 0 - small before Triton 3.7 (the H200's Triton 3.6
    # made +0.0 of a negative value that rounds to zero; 3.9 and its interpreter negate)
    small = (small.to(tl.int32, bitcast=True) | ((b >> 31) << 31)).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(y) >= 0.015625, normal, small)


@triton.jit
def e2m1_value(code):
    """4-bit e2m1 codes (int32, bit 3 the sign) -> float32 values (``kv_quant.e2m1_values``; code 8 is -0.0), the
    sign placed by bits (a unary minus is ``0 - x`` on Triton 3.6, which loses -0.0)."""
    m = code & 7
    mag = tl.where(
        m < 4,
        m.to(tl.float32) * 0.5,
        tl.where(m == 4, 2.0, tl.where(m == 5, 3.0, tl.where(m == 6, 4.0, 6.0))),
    )
    return (mag.to(tl.int32, bitcast=True) | ((code >> 3) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def pow2_ceil(a):
    """``2**ceil(log2(a))`` for positive normal float32 ``a``, from its bits (``kv_quant.pow2_ceil_bits``), and its
    biased exponent (the ue8m0 byte)."""
    bits = a.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(tl.int32)
    return (e << 23).to(tl.float32, bitcast=True), e
