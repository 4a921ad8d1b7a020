"""Suite-wide setup. Runs before any test module is imported."""

import os

import torch

# Triton decides interpreter vs compiled mode when a kernel module is first imported, so the choice
# must be made before *any* test (or a library such as transformers) imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
if os.environ.get("TRITON_INTERPRET") == "1":
    from tests import interpreter_speed

    interpreter_speed.install()  # the same arithmetic, without the interpreter's repeated patching

pytest_plugins = ["pytester"]

#: test files that take a minute or more of one worker in CI, slowest first. With ``--dist loadfile
#: --no-loadscope-reorder`` (the nox ``tests`` session) each worker takes the next file in collection order, so
#: these start first and the short files fill in around them; at the end of the list a slow file would finish
#: alone while the other worker idles. Times: CI's ``--durations`` log.
SLOW_FILES_FIRST = (
    "tests/plugins/cuda_sm100/test_v41_forward_interpreted.py",
    "tests/plugins/cuda_sm100/test_kernels_moe.py",
    "tests/plugins/cuda_sm100/test_kernels_dense.py",
    "tests/engine/test_spec_decode_dspark.py",
    "tests/models/deepseek_v41/test_demo_v41.py",
    "tests/plugins/cuda_sm100/test_kernels_probs.py",
    "tests/models/deepseek_v41/test_static_decode.py",
    "tests/plugins/cuda_sm100/test_sm100_compile.py",
    "tests/engine/test_spec_decode_dspark_distribution.py",
    "tests/models/deepseek_v41/test_engine_vs_reference.py",
)


def pytest_collection_modifyitems(config, items):
    """The files of :data:`SLOW_FILES_FIRST` first, in its order; every other test keeps its place."""
    rank = {f: i for i, f in enumerate(SLOW_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
