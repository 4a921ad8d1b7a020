"""DeepInfer's NVIDIA platform ``cuda_sm100``: SM100 (Blackwell) first, SM90 (Hopper) supported.

Importing this package must stay cheap and must not need a GPU: triton and tilelang are imported
only when a kernel is first used on a machine where the platform is available.
"""
