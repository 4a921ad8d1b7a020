"""Grammar compilation is bounded: an oversized constraint is refused at once, a compile that runs past
``structured_outputs_compile_timeout_s`` is refused with an error naming the setting, and a compile in
progress never holds up other callers' generation."""

from __future__ import annotations

import threading
import time

import pytest

from deepinfer_core import SamplingParams, StructuredOutputsParams
from deepinfer_core.sampling_params import InvalidParameterError
from deepinfer_core.structured import StructuredOutputManager
from deepinfer_core.structured.backend import CompiledGrammar, GrammarBackend, GrammarCache

from .conftest import make_toy_llm, v4_tokenizer_and_grammars

PROMPT = {"prompt_token_ids": [5, 6, 7]}
PLAIN = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


def test_an_enum_of_100k_values_is_refused_by_size_at_once():
    tok, backends = v4_tokenizer_and_grammars()
    manager = StructuredOutputManager(backends, "xgrammar", tok, 129280, [1], max_spec_bytes=65536)
    huge = StructuredOutputsParams(json={"enum": [f"value{i}" for i in range(100_000)]})
    t0 = time.monotonic()
    with pytest.raises(ValueError, match=r"structured_outputs_max_spec_bytes=65536") as e:
        manager.compile(huge)
    assert "json constraint is 1" in str(e.value)  # its size in bytes, > 1 MB
    assert time.monotonic() - t0 < 30  # compiling it would take minutes; the refusal does not compile
    small = StructuredOutputsParams(json={"enum": ["a", "b"]})
    assert manager.compile(small).constraint.kind == "json"


class _GatedBackend(GrammarBackend):
    """A grammar backend whose compiles wait for ``gate`` (a slow library, deterministically)."""

    name = "gated"
    gate = threading.Event()
    started = threading.Event()

    def __init__(self, *args, **kwargs):  # a grammar vocabulary is not needed for these tests
        self.cache = GrammarCache()
        self.vocab = None

    def compile(self, constraint):
        type(self).started.set()
        type(self).gate.wait(60)
        return CompiledGrammar(constraint, self.name, None)

    def _compile(self, constraint):  # pragma: no cover - compile is overridden
        raise AssertionError

    def matcher(self, grammar):  # pragma: no cover - the gated requests never get this far
        raise AssertionError


def _gated_llm(timeout_s: float):
    _GatedBackend.gate.clear()
    _GatedBackend.started.clear()
    llm = make_toy_llm(structured_outputs_compile_timeout_s=timeout_s)
    st = llm.engine.structured
    st._factories, st.backend_name = {"gated": _GatedBackend}, "gated"
    return llm


def test_a_compile_past_the_timeout_is_refused_naming_the_setting():
    llm = _gated_llm(0.2)
    slow = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    try:
        with pytest.raises(InvalidParameterError, match=r"structured_outputs_compile_timeout_s=0.2"):
            llm.generate([PROMPT, PROMPT], [PLAIN, slow], use_tqdm=False)
    finally:
        _GatedBackend.gate.set()
    assert not llm.engine.requests  # nothing of the refused call was queued
    assert llm.generate([PROMPT], PLAIN, use_tqdm=False)[0].finished


def test_a_slow_compile_does_not_hold_up_another_callers_generation():
    llm = _gated_llm(60.0)
    expected = llm.generate([PROMPT], PLAIN, use_tqdm=False)[0].outputs[0].token_ids
    slow = SamplingParams(structured_outputs=StructuredOutputsParams(regex="[0-9]+"))
    result: list = []

    def submit_slow() -> None:
        try:
            llm.generate([PROMPT], slow, use_tqdm=False)
        except BaseException as e:  # noqa: BLE001 - the gated backend has no matcher: any outcome is fine
            result.append(e)

    th = threading.Thread(target=submit_slow, daemon=True)
    th.start()
    assert _GatedBackend.started.wait(30)
    try:  # the compile is in progress and blocked: another call runs to completion meanwhile
        assert llm.generate([PROMPT], PLAIN, use_tqdm=False)[0].outputs[0].token_ids == expected
        assert th.is_alive()
    finally:
        _GatedBackend.gate.set()
    th.join(30)
    assert not th.is_alive()
