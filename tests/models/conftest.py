"""Model tests run single-threaded: their tensors are tiny, and OpenMP threads only contend (the restored
thread count keeps other test packages unaffected)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
