"""Suite-wide setup. Runs before any test module is imported."""

import os

import torch

# Triton decides interpreter vs compiled mode when a kernel module is first imported, so the choice
# must be made before *any* test (or a library such as transformers) imports triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest_plugins = ["pytester"]
