"""Triton kernels of the ``cuda_sm100`` platform, one module per op family.

Each module holds ``@triton.jit`` kernels and a thin launcher that takes torch tensors. Launch
parameters (block sizes, warps, stages) come from :mod:`deepinfer_cuda_sm100.dispatch`, never from
the kernel modules themselves. Importing this package imports triton.
"""
