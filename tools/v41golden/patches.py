"""Run-time patches of the imported reference (its files stay as published).

- :func:`kv_quant_off`: the reference simulates the KV cache's storage formats in place (quantise, then
  dequantise back into the same tensor). Every such round trip is a call of ``act_quant`` or ``fp4_act_quant``
  with ``inplace=True``; off, those calls return their input unchanged. Five sites: the window KV (FP8, 32 per
  scale, ue8m0), the compressed KV (FP4, 16 per E4M3 scale), the index keys and the index queries (FP4, 32 per
  ue8m0 scale), and each DSpark stage's window KV (FP8). The activation quantisation inside every FP8/FP4
  GEMM (``act_quant`` without ``inplace``) is part of the weights' arithmetic and stays on.
- :func:`decode_fix`: in the release, an index-key owner publishes ``shared_attn.index_k`` only when its
  compressor completes a group. On the other decode steps a ratio-2 owner's indexer scores its queries against
  whatever the last publisher left (a ratio-1 source's keys, of this forward or the previous one). The fix points
  ``shared_attn.index_k`` at the owner's own key cache before its indexer runs, which is what prefill does;
  prefill is unchanged by it.
- :func:`engram_rows_default_dtype`: Engram rows are dequantised to BF16 on lookup; this widens them back
  (lossless: an E4M3 value times a power of two fits in BF16).
- :func:`capture_logits`: the head normally returns the last position only; this also keeps every position's.
- :func:`gemm_exact`: FP8/FP4 linears as float32 products with the exactly dequantised weights, without the
  FP8 quantisation of their input.
- :func:`numerics`: one of the four modes of :data:`MODES` (the decode fix is on in all of them).

The two patches that change numerics touch disjoint calls: :func:`gemm_exact` replaces ``linear`` (the only
caller of ``act_quant`` without ``inplace``), and :func:`kv_quant_off` skips only the ``inplace=True`` calls.
So ``kvq_only`` (:func:`gemm_exact` alone) keeps exactly the five KV / index round trips and nothing else of
the release's quantisation of activations.

Why these modes: with the release's numerics, a 1e-6 relative change of the float weights moves prompt
logprobs by up to about a nat (medians up to 1e-1) on the tiny configs once a value crosses an FP8/FP4
rounding boundary. That holds with the KV round trips off too (the FP8 quantisation of every GEMM input is
just as sensitive); ``exact`` moves by at most ~5e-5. docs/v41_reference.md has the measurements.
"""

from __future__ import annotations

import contextlib
import inspect

import torch


@contextlib.contextmanager
def _patched(owner, name: str, value):
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield old
    finally:
        setattr(owner, name, old)


def _skip_inplace(fn):
    sig = inspect.signature(fn)

    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        if bound.arguments.get("inplace", False):
            return bound.arguments["x"]
        return fn(*args, **kwargs)

    return wrapper


@contextlib.contextmanager
def kv_quant_off(ref):
    """Within the block, the in-place KV / index round trips of ``ref.model`` do nothing."""
    m = ref.model
    with (
        _patched(m, "act_quant", _skip_inplace(m.act_quant)),
        _patched(m, "fp4_act_quant", _skip_inplace(m.fp4_act_quant)),
    ):
        yield


@contextlib.contextmanager
def decode_fix(ref):
    """Within the block, every index-key owner republishes its own key cache before its indexer runs."""
    m = ref.model
    original = m.Indexer.forward

    def forward(self, *args, **kwargs):
        if self.owns_k:
            m.shared_attn.index_k = self.k_cache
        return original(self, *args, **kwargs)

    with _patched(m.Indexer, "forward", forward):
        yield


@contextlib.contextmanager
def engram_rows_default_dtype(ref):
    m = ref.model
    original = m.ParallelEngramEmbedding.forward

    def forward(self, indices):
        return original(self, indices).to(torch.get_default_dtype())

    with _patched(m.ParallelEngramEmbedding, "forward", forward):
        yield


class LogitsCapture:
    """Wraps a model's head: the model still gets what the head returns; ``last`` holds ``[b, s, V]``."""

    def __init__(self, model):
        self.model, self.last = model, None

    def __enter__(self):
        head = self.model.head
        original = type(head).forward

        def forward(x, full_logits=False):
            if not full_logits:
                self.last = original(head, x, True)
            return original(head, x, full_logits)

        head.forward = forward
        return self

    def __exit__(self, *exc):
        del self.model.head.forward


def capture_logits(model) -> LogitsCapture:
    return LogitsCapture(model)


@contextlib.contextmanager
def gemm_exact(ref):
    """Within the block, FP8/FP4 linears multiply by the exactly dequantised weight in float32, with no FP8
    quantisation of the activation (the reference's GEMMs quantise it per 32 values, ue8m0 scales)."""
    m, k = ref.model, ref.kernel
    original = m.linear

    def linear(x, weight, bias=None):
        if weight.dtype == torch.float4_e2m1fn_x2:
            w = k.dequant_fp4_weight(weight, weight.scale, m.fp4_block_size)
        elif weight.dtype == torch.float8_e4m3fn:
            w = k.dequant_fp8_weight(weight, weight.scale, m.fp8_block_size)
        else:
            return original(x, weight, bias)
        return torch.nn.functional.linear(x.float(), w).to(torch.get_default_dtype())

    with _patched(m, "linear", linear):
        yield


MODES = {
    "exact": "no FP8 activation quantisation in the GEMMs (weights dequantised exactly, float32 products) and "
    "no KV / index quantisation round trips: float32 arithmetic on the stored weights",
    "kvq_off": "the release's GEMM numerics (FP8 activations, 32 per ue8m0 scale) without the KV / index round "
    "trips",
    "kvq_on": "the release's numerics: FP8 activations in the GEMMs and the KV / index round trips",
    "kvq_only": "float32 GEMMs as in exact, with the release's KV / index round trips (FP8 window KV, FP4 "
    "compressed KV, index keys and queries): the storage formats alone, what an engine with float32 GEMMs "
    "and quantised KV computes",
}


@contextlib.contextmanager
def numerics(ref, mode: str, fix: bool = True):
    """The decode fix (unless ``fix`` is false) and the Engram row widening; then what ``mode`` (a
    :data:`MODES` key) turns off."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; one of {list(MODES)}")
    with contextlib.ExitStack() as stack:
        if fix:
            stack.enter_context(decode_fix(ref))
        stack.enter_context(engram_rows_default_dtype(ref))
        if mode in ("exact", "kvq_off"):
            stack.enter_context(kv_quant_off(ref))
        if mode in ("exact", "kvq_only"):
            stack.enter_context(gemm_exact(ref))
        yield
