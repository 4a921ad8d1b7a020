"""Masking only removes tokens: the constrained distribution is the unconstrained one renormalised over
the allowed set, and the allowed set is exactly the set of valid continuations."""

from __future__ import annotations

import math
import re

import pytest
import torch

from deepinfer_core.structured import unpack_bitmask

from .structured_sim import REFERENCE_OPS, V

BACKENDS = ["xgrammar", "llguidance"]


def mask_after(manager, params, text: str):
    manager.validate_and_compile("r", params)
    manager.accept("r", manager.vocab.tokenizer.encode(text, add_special_tokens=False))
    return manager.fill_bitmask(["r"])


def token_strings(tokenizer) -> list[str]:
    """Byte-level token strings: printable ASCII bytes map to themselves, every other byte to a
    character above U+00FF, so a string of ASCII letters or digits decodes to exactly itself."""
    strings = [""] * V
    for s, i in tokenizer.get_vocab().items():
        strings[i] = s
    for i in tokenizer.get_added_vocab().values():
        strings[i] = ""  # added tokens never appear in constrained text
    return strings


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "regex, prefix, valid",
    [
        ("[a-z]+", "ab", lambda s: re.fullmatch("[a-z]+", s)),
        ("[0-9]{1,6}", "12", lambda s: re.fullmatch("[0-9]{1,4}", s)),
    ],
)
def test_mask_is_exactly_the_valid_continuations(make_manager, v4_tokenizer, backend, regex, prefix, valid):
    allowed = unpack_bitmask(mask_after(make_manager(backend), {"regex": regex}, prefix), V)[0]
    expected = torch.tensor([bool(valid(s)) if s else False for s in token_strings(v4_tokenizer)])
    expected[1] = True  # the prefix is already a full match: EOS may end it
    assert int(expected.sum()) > 100
    assert torch.equal(allowed, expected), (allowed ^ expected).nonzero().flatten()[:10].tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("params, prefix", [({"json": {"type": "string"}}, '"'), ({"json_object": True}, "")])
def test_loose_schema_keeps_the_unconstrained_distribution_renormalised(
    make_manager, backend, params, prefix
):
    bitmask = mask_after(make_manager(backend), params, prefix)
    allowed = unpack_bitmask(bitmask, V)[0]
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(3)) * 3
    p_masked = torch.softmax(REFERENCE_OPS.apply_bitmask(logits, bitmask).double(), -1)[0]
    p = torch.softmax(logits.double(), -1)[0]
    expected = torch.where(allowed, p, torch.zeros_like(p)) / p[allowed].sum()
    assert int(allowed.sum()) > (120_000 if prefix else 1)
    torch.testing.assert_close(p_masked, expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", [*BACKENDS, "example_choice"])
def test_sampled_frequencies_match_the_renormalised_distribution(make_manager, backend):
    """Chi-square over the allowed first tokens of a choice grammar, 40,000 draws at temperature 1."""
    bitmask = mask_after(
        make_manager(backend), {"choice": ["apple", "banana", "cherry", "date", "elder"]}, ""
    )
    allowed = unpack_bitmask(bitmask, V)[0]
    ids = allowed.nonzero().flatten()
    assert 5 <= len(ids) <= 200
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(11)) * 1.5
    p = torch.softmax(logits[0, ids].double(), -1)
    cdf = torch.softmax(REFERENCE_OPS.apply_bitmask(logits, bitmask)[0].double(), -1).cumsum(-1)
    u = torch.rand(40_000, dtype=torch.float64, generator=torch.Generator().manual_seed(5)) * cdf[-1]
    draws = torch.searchsorted(cdf, u, right=True)  # the inverse-CDF draw of structured_sim.sample_rows
    assert bool(allowed[draws].all())
    counts = torch.stack([(draws == t).sum() for t in ids]).double()
    expected = p * len(draws)
    keep = expected >= 5  # pool the rare tokens into one cell
    obs = torch.cat([counts[keep], counts[~keep].sum(0, keepdim=True)])
    exp = torch.cat([expected[keep], expected[~keep].sum(0, keepdim=True)])
    obs, exp = obs[exp > 0], exp[exp > 0]
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < _chi2_quantile(len(obs) - 1, z=3.719), (chi2, len(obs))  # upper 1e-4 tail


def _chi2_quantile(dof: int, z: float) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile at standard-normal quantile ``z``."""
    a = 2.0 / (9.0 * dof)
    return dof * (1 - a + z * math.sqrt(a)) ** 3


@pytest.mark.parametrize("backend", BACKENDS)
def test_added_tokens_never_appear_inside_constrained_text(backends, make_manager, v4_tokenizer, backend):
    """xgrammar's own rows already exclude them (it skips the manager's filter); llguidance's raw rows
    let four DSML markers into a JSON string, and the manager removes them."""
    from deepinfer_core.structured import allocate_bitmask

    added = torch.tensor(sorted(set(v4_tokenizer.get_added_vocab().values()) - {1}))
    manager = make_manager(backend)
    row = unpack_bitmask(mask_after(manager, {"json": {"type": "string"}}, '"'), V)[0]
    assert not bool(row[added].any())
    raw = allocate_bitmask(1, V)
    manager._requests["r"].matcher.fill_bitmask(raw, 0)
    raw_added = added[unpack_bitmask(raw, V)[0][added]].tolist()
    if backend == "xgrammar":
        assert raw_added == [] and manager._requests["r"].matcher.excludes_added_tokens
    else:
        assert raw_added == [128825, 128840, 128841, 129265]
