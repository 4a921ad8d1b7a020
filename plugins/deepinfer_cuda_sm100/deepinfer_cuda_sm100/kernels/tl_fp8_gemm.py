"""TileLang: the FP8 block-scaled dense GEMM of prefill, ``C = A @ dequant(W).T``, on Hopper's WGMMA.

``W`` is ``float8_e4m3fn [N, K]`` with one float32 scale per 128x128 block, ``A`` is bf16 ``[M, K]``.
A program owns a ``block_m x 128`` tile of ``C`` (two consumer warpgroups, one producer). Per
``block_k``-wide K step (at most 128) the producer copies the FP8 weight tile and the activation tile
into shared memory (TMA, pipelined); the consumers dequantise the weight tile into a bf16 shared
tile with its one block scale (exact for ue8m0 scales, as in the Triton kernels) and issue a WGMMA
with ``B`` transposed. ``M`` is dynamic: one compiled kernel per ``(N, K)``.

Only imported when ``tilelang`` is installed (the plugin's ``tilelang`` extra) and
:func:`deepinfer_cuda_sm100.dispatch.fp8_gemm_backend` chose it; the Triton grouped GEMM is the
fallback and the reference for the tests.
"""

from __future__ import annotations

import functools

import tilelang
import tilelang.language as T
import torch

BLOCK_N = 128


def _program(n: int, k: int, block_m: int, block_k: int, stages: int, threads: int):
    m = T.dynamic("m")

    @T.prim_func
    def fp8_block_gemm(
        A: T.Tensor((m, k), "bfloat16"),
        W: T.Tensor((n, k), "float8_e4m3"),
        S: T.Tensor((T.ceildiv(n, 128), T.ceildiv(k, 128)), "float32"),
        C: T.Tensor((m, n), "bfloat16"),
    ):
        with T.Kernel(T.ceildiv(n, BLOCK_N), T.ceildiv(m, block_m), threads=threads) as (bx, by):
            a_s = T.alloc_shared((block_m, block_k), "bfloat16")
            w8_s = T.alloc_shared((BLOCK_N, block_k), "float8_e4m3")
            w_s = T.alloc_shared((BLOCK_N, block_k), "bfloat16")
            c_f = T.alloc_fragment((block_m, BLOCK_N), "float32")
            c_s = T.alloc_shared((block_m, BLOCK_N), "bfloat16")
            T.clear(c_f)
            for ko in T.Pipelined(T.ceildiv(k, block_k), num_stages=stages):
                T.copy(A[by * block_m, ko * block_k], a_s)
                T.copy(W[bx * BLOCK_N, ko * block_k], w8_s)
                for i, j in T.Parallel(BLOCK_N, block_k):
                    w_s[i, j] = T.cast(
                        T.cast(w8_s[i, j], "float32") * S[bx, (ko * block_k) // 128], "bfloat16"
                    )
                T.gemm(a_s, w_s, c_f, transpose_B=True)
            T.copy(c_f, c_s)
            T.copy(c_s, C[by * block_m, bx * BLOCK_N])

    return fp8_block_gemm


@functools.lru_cache(maxsize=64)
def compiled(
    n: int,
    k: int,
    block_m: int = 256,
    stages: int = 3,
    threads: int = 256,
    block_k: int = 64,
    arch: str = "sm_90a",
):
    """The kernel for weights of shape ``(n, k)`` (both multiples of 128), compiled once per shape.

    H200 at 8192 rows (benchmarks/gpu/NOTES.md v6): 256 x 128 tiles, 64-wide K steps and 3 stages
    (168 KB of shared memory) reach 440-494 TFLOP/s, 3.0-3.4x the Triton kernel (139-165) and 1.25x
    this kernel's first shape (128 x 128, 128-wide K, 2 stages). TileLang multi-buffers the bf16 tile
    too: 128-wide K steps at 3 stages would need 240 KB, over the 227 KB an H200 block may use."""
    return tilelang.compile(
        _program(n, k, block_m, block_k, stages, threads), out_idx=None, target={"kind": "cuda", "arch": arch}
    )


def fp8_block_gemm(
    a: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, out: torch.Tensor, variant: tuple = ()
) -> torch.Tensor:
    """``out = a @ (w * scale blocks).T`` with ``a`` bf16 ``[M, K]`` contiguous, ``w`` FP8 ``[N, K]``.
    ``variant``: ``(block_m, stages, threads, block_k)`` overrides (benchmarks).

    ``M`` is padded with zero rows to a whole number of row tiles: the H200 runs checked whole tiles
    only (8192 rows), so partial tiles at the TMA bounds never reach the GPU unchecked."""
    n, k = w.shape
    block_m = variant[0] if variant else 256
    m = a.shape[0]
    pad = -m % block_m
    if pad:
        a = torch.cat([a, a.new_zeros(pad, k)])
        full = out.new_empty(m + pad, n)
        compiled(n, k, *variant)(a, w, scale, full)
        out.copy_(full[:m])
        return out
    compiled(n, k, *variant)(a, w, scale, out)
    return out


def source(n: int, k: int, *variant, arch: str = "sm_90a") -> str:
    """The CUDA source TileLang generates (lowering needs no GPU; tests use it where tilelang exists)."""
    return compiled(n, k, *variant, arch=arch).get_kernel_source()
