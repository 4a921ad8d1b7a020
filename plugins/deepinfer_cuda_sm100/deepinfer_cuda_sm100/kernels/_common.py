"""Helpers shared by the kernel modules."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1`` (CPU interpreter, used by CI)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand dtype for ``tl.dot`` on tiles loaded as ``dtype``.

    Triton's interpreter stores bfloat16 as raw ``uint16`` and multiplies the bit patterns in
    ``tl.dot`` (triton-lang/triton#11584, still so in 3.6 and 3.9), so under the interpreter the
    operands are upcast to float32. On a GPU the tile keeps its own dtype and uses the tensor cores.
    """
    if interpreting():
        return tl.float32
    return {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}[dtype]


@triton.jit
def mma(a, b, acc, DOT_T: tl.constexpr):
    """``tl.dot(a, b, acc)``; float32 operands multiply in full float32 (``ieee``), not Triton's default
    TF32, so the float32 engine path follows the float32 reference."""
    if DOT_T == tl.float32:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


def pow2(n: int, lo: int = 1) -> int:
    return max(lo, triton.next_power_of_2(int(n)))
