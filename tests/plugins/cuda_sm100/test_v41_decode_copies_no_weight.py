"""A V4.1 decode step on the plugin's ops makes no copy of a model weight (CI, under the Triton interpreter).

V4.1 loads its norm weights in the model dtype; a kernel wrapper that widened one with ``weight.float()`` ran a
copy kernel at every call: 44 ``direct_copy_kernel_cuda`` launches in each batch-1 decode step of the 8-layer
H200 slice (RESULTS v30), about 6 a layer, found in session v31 and removed (the kernels widen weights as they
load them). This holds the step to none: every operator of a bf16 decode step's forward pass whose input is a
weight's memory and whose result is new memory (``to``, ``_to_copy``, ``clone``, ``contiguous``, ``copy_`` from
it) fails the test, with its shape and dtype."""

from __future__ import annotations

from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from deepinfer_core import LLM, SamplingParams
from tests.models.deepseek_v41.goldens import checkpoint

from .cuda_sm100_helpers import needs_triton

pytestmark = needs_triton

COPIES = {"to", "_to_copy", "clone", "contiguous", "copy_", "type_as"}


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _weight_storages(model) -> set[int]:
    out = set()
    for _, slot in model.named_slots():
        v = slot.value
        for t in (v, getattr(v, "data", None), getattr(v, "scale", None)):
            if isinstance(t, torch.Tensor) and t.numel():
                out.add(_storage(t))
    return out


class WeightCopies(TorchDispatchMode):
    def __init__(self, weights: set[int]):
        super().__init__()
        self.weights, self.found, self.ops, self.paused = weights, [], 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        self.ops += 1
        name = func.overloadpacket.__name__
        src = args[1] if name == "copy_" else (args[0] if args else None)
        if (
            name in COPIES
            and isinstance(src, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and _storage(src) in self.weights
            and _storage(out) != _storage(src)
        ):
            self.found.append((name, tuple(src.shape), str(src.dtype)))
        return out


def test_a_bf16_v41_decode_step_copies_no_weight(monkeypatch):
    from triton.runtime import interpreter

    from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps

    llm = LLM(
        model=str(checkpoint("reindex_r2")),
        dtype="bfloat16",
        kv_cache_dtype="auto",
        max_num_batched_tokens=256,
    )
    model = llm.engine.model
    model.backends = replace(model.backends, dense=CudaDenseOps(), attention=CudaAttentionOps())
    weights = _weight_storages(model)
    bf16_norms = [
        k for k, s in model.named_slots() if "norm" in k and getattr(s.value, "dtype", None) == torch.bfloat16
    ]
    assert bf16_norms, "the checkpoint has bf16 norm weights (else the test could not fail)"
    mode = WeightCopies(weights)
    real_run = interpreter.InterpretedFunction.run

    def run(self, *a, **k):  # the interpreter's own tensor work inside a launch is not the step's
        mode.paused = True
        try:
            return real_run(self, *a, **k)
        finally:
            mode.paused = False

    monkeypatch.setattr(interpreter.InterpretedFunction, "run", run)
    real_forward = model.forward

    def forward(batch, kv):
        if batch.num_tokens != 1:
            return real_forward(batch, kv)
        with mode:
            return real_forward(batch, kv)

    monkeypatch.setattr(model, "forward", forward)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    llm.generate([{"prompt_token_ids": list(range(3, 13))}], params, use_tqdm=False)
    assert mode.ops > 0, "a decode step was watched"
    assert mode.found == [], mode.found
