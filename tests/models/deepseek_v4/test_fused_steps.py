"""The V4 model runs its fused steps through the backends' resolved table: a backend's declared fused ops
are the ones called, and logits equal those of a backend that declares none (the core's compositions)."""

from __future__ import annotations

from collections import Counter

import torch

from deepinfer_core.models.deepseek_v4.model import DeepseekV4ForCausalLM
from deepinfer_core.ops.backends import CONCERNS, Backends
from deepinfer_core.ops.fusions import ALSO_NEEDS, COMPOSED, Fusion
from deepinfer_core.ops.reference import ReferenceAttentionOps, ReferenceDenseOps, reference_op

from .test_addressing_static import _static_batch
from .tiny import full_logits, tokens

CALLS: Counter = Counter()


def _counted(fusion: Fusion):
    def step(self, *args, **kwargs):
        CALLS[fusion] += 1
        also = {kw: reference_op(concern) for kw, concern in ALSO_NEEDS.get(fusion, {}).items()}
        return COMPOSED[fusion](self, *args, **kwargs, **also)

    return step


_DENSE = [f for f in Fusion if f.concern == "dense"]
_ATTENTION = [f for f in Fusion if f.concern == "attention"]
DeclaringDense = type(
    "DeclaringDense",
    (ReferenceDenseOps,),
    {"fusions": frozenset(_DENSE), **{f.value: _counted(f) for f in _DENSE}},
)
DeclaringAttention = type(
    "DeclaringAttention",
    (ReferenceAttentionOps,),
    {"fusions": frozenset(_ATTENTION), **{f.value: _counted(f) for f in _ATTENTION}},
)


def test_declared_fused_ops_are_called_and_match_the_compositions(checkpoints, backends):
    path = checkpoints.path("swa_csa_hca_hc2", "deepseek")
    ops = {c: reference_op(c) for c in CONCERNS} | {
        "dense": DeclaringDense(),
        "attention": DeclaringAttention(),
    }
    declaring = Backends("reference", **ops)
    assert declaring.fused.declared == set(Fusion)
    plain = DeepseekV4ForCausalLM.from_checkpoint(path, backends, torch.float32)
    fused = DeepseekV4ForCausalLM.from_checkpoint(path, declaring, torch.float32)
    ids = tokens(12, seed=5)
    CALLS.clear()
    assert torch.equal(full_logits(fused, ids), full_logits(plain, ids))
    # the attention step is rope_sparse_attention_unrope and the KV row's is rms_norm_rope_store_kv: a backend that
    # declares them runs them whole, so the sparse_attention_unrope and rms_norm_rope inside are not steps of
    # their own (tests/ops/test_fusions.py: composed over them where only those are declared)
    inner = {Fusion.SPARSE_ATTENTION_UNROPE, Fusion.RMS_NORM_ROPE}
    assert set(CALLS) == set(Fusion) - V41_ONLY - inner - {Fusion.STATIC_PLAN}, CALLS
    # a static step's plan built on the device (device_plan): the declared step, the same tables
    batch = _static_batch(torch.Generator().manual_seed(3), [5, 40, 127], 1, bucket=4, context=256)
    assert all(r <= batch.block_size for r, _ in plain._kinds()), plain._kinds()
    CALLS.clear()
    got, want = fused.plan_on_device(batch, 256), plain.plan_on_device(batch, 256)
    assert CALLS == {Fusion.STATIC_PLAN: 1}
    assert torch.equal(got.req, want.req)
    for a, b in zip(got.tensors(), want.tensors(), strict=True):
        assert torch.equal(a, b)


#: DeepSeek-V4.1's single-pass mHC site entries and its index query (its test:
#: ``tests/models/deepseek_v41/test_fused_steps.py``)
V41_ONLY = {Fusion.HC_SITE_NORM, Fusion.HC_POST_SITE_NORM, Fusion.INDEX_QUERY}
