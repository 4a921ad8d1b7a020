"""DeepSeek-V4.1's encoding against DeepSeek's own encoder (the release's ``encoding/encoding.py``), on the
generated conversations and completions in ``tests/data/chat/deepseek_v41.json.gz`` (see
``tools/chat_goldens.py``).

The V4.1 tokenizer is not available here, so the token-id check uses V4's tokenizer: V4.1 adds
``<｜System｜>`` to V4's markers, which V4's tokenizer reads as plain text on both sides of the check."""

from __future__ import annotations

import os

import pytest

from . import goldens

ENCODING = "deepseek_v41"


def test_every_committed_conversation_renders_exactly_as_deepseeks_encoder():
    assert len(goldens.load(ENCODING)["render"]) >= 2000
    mismatches = goldens.render_mismatches(ENCODING)
    assert not mismatches, f"{len(mismatches)} cases differ:\n" + "\n".join(mismatches[:10])


def test_every_committed_completion_parses_as_deepseeks_parser():
    records = goldens.load(ENCODING)["parse"]
    assert len(records) >= 2500 and sum(bool(r["expected"]["tool_calls"]) for r in records) >= 500
    mismatches = goldens.parse_mismatches(ENCODING)
    assert not mismatches, f"{len(mismatches)} completions differ:\n" + "\n".join(mismatches[:10])


def test_cases_cover_every_reasoning_effort_the_encoding_defines():
    records = goldens.load(ENCODING)["render"]
    thinking = [r for r in records if r["thinking_mode"] == "think"]
    assert {r.get("reasoning_effort") for r in thinking} == set(range(1, 101)) | {None, "low", "high", "max"}
    assert {r["thinking_mode"] for r in records} == {"non-think", "think", "think-high", "think-max"}
    assert any(r["thinking_mode"] == "non-think" and "reasoning_effort" in r for r in records)


def test_cases_cover_every_role_and_content_form():
    records = goldens.load(ENCODING)["render"]
    messages = [(i, m) for r in records for i, m in enumerate(r["messages"])]
    assert {m["role"] for _, m in messages} == {"system", "user", "assistant", "tool"}
    assert sum(m["role"] == "system" and i > 0 for i, m in messages) >= 200  # later system messages
    assert sum(isinstance(m.get("content"), list) for _, m in messages) >= 1000  # lists of text parts
    assert any(m.get("content") == [] for _, m in messages)
    calls = [c["function"]["arguments"] for _, m in messages for c in m.get("tool_calls") or []]
    assert sum(isinstance(a, dict) for a in calls) >= 100  # decoded arguments
    assert sum(isinstance(a, str) and a.startswith('"') for a in calls) >= 50  # JSON encoded twice
    assert sum(bool(r.get("tools")) for r in records) >= 500
    assert sum(bool(r.get("markers")) for r in records) >= 50


def test_provenance_names_the_reference_and_the_command():
    prov = goldens.load(ENCODING)["provenance"]
    assert prov["reference"]["sha256"] == "b4bd8a06f94a06a61564156c7a543d649ed86ecdd72a4dfb94b064e16d9c572f"
    assert prov["command"].startswith("python tools/chat_goldens.py --reference")


def test_token_ids_equal_tokenizing_deepseeks_prompt(v4_tokenizer):
    plain = [r for r in goldens.load(ENCODING)["render"] if not r.get("markers")]
    for record in plain[::15]:
        want = v4_tokenizer.encode(record["prompt"], add_special_tokens=False)
        assert goldens.token_ids(record, ENCODING, v4_tokenizer) == want, record["id"]


@pytest.mark.skipif(not os.environ.get(goldens.REFERENCE_VARIABLE), reason="DEEPINFER_CHAT_REFERENCE not set")
def test_regenerating_with_deepseeks_code_gives_the_committed_records():
    renders, parses = goldens.regenerate(ENCODING, 150)
    committed = goldens.load(ENCODING)
    assert renders == committed["render"][:150]
    assert parses == committed["parse"][: len(parses)]
