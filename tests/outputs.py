"""Comparing two runs' outputs: the check every "X changes nothing" engine test makes."""

from __future__ import annotations


def assert_same_outputs(a, b, atol: float = 1e-5) -> None:
    """First samples of ``a`` and ``b`` request by request: identical tokens, the same logprob keys, and
    logprobs (sampled and, where requested, prompt) within ``atol``."""
    for x, y in zip(a, b, strict=True):
        cx, cy = x.outputs[0], y.outputs[0]
        assert cx.token_ids == cy.token_ids
        for px, py in zip(cx.logprobs, cy.logprobs, strict=True):
            assert px.keys() == py.keys()
            assert max(abs(px[t].logprob - py[t].logprob) for t in px) <= atol
        if x.prompt_logprobs is not None:
            for px, py in zip(x.prompt_logprobs[1:], y.prompt_logprobs[1:], strict=True):
                assert max(abs(px[t].logprob - py[t].logprob) for t in px) <= atol
