"""Kernel tests run compiled on a CUDA GPU, else under Triton's CPU interpreter (``TRITON_INTERPRET=1``).

The interpreter flag is read when a ``@triton.jit`` function is defined, so it is set here, before
any kernel module is imported.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(20261202)
