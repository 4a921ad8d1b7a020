"""DeepSeek-V4's encoding against DeepSeek's own encoder (``encoding_dsv4.py``), on the generated
conversations and completions in ``tests/data/chat/deepseek_v4.json.gz`` (see ``tools/chat_goldens.py``)
and DeepSeek's published golden files 1 and 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from . import goldens

ENCODING = "deepseek_v4"


def test_every_committed_conversation_renders_exactly_as_deepseeks_encoder():
    assert len(goldens.load(ENCODING)["render"]) >= 1500
    mismatches = goldens.render_mismatches(ENCODING)
    assert not mismatches, f"{len(mismatches)} cases differ:\n" + "\n".join(mismatches[:10])


def test_deepseeks_published_goldens_are_among_the_cases():
    published = [r for r in goldens.load(ENCODING)["render"] if str(r["id"]).startswith("published-")]
    assert [r["id"] for r in published] == ["published-1", "published-2"]
    assert '<｜DSML｜invoke name="get_weather">' in published[0]["prompt"]


def test_every_committed_completion_parses_as_deepseeks_parser():
    records = goldens.load(ENCODING)["parse"]
    assert len(records) >= 2000 and sum(bool(r["expected"]["tool_calls"]) for r in records) >= 500
    mismatches = goldens.parse_mismatches(ENCODING)
    assert not mismatches, f"{len(mismatches)} completions differ:\n" + "\n".join(mismatches[:10])


def test_cases_cover_every_mode_and_role():
    records = goldens.load(ENCODING)["render"]
    assert {r["thinking_mode"] for r in records} == {"non-think", "think-high", "think-max"}
    roles = {m["role"] for r in records for m in r["messages"]}
    assert roles == {"system", "user", "assistant", "tool", "developer"}
    assert sum(bool(r.get("tools")) for r in records) >= 400
    assert sum(bool(r.get("markers")) for r in records) >= 50  # control-token text inside content


def test_provenance_names_the_reference_and_the_command():
    prov = goldens.load(ENCODING)["provenance"]
    assert prov["reference"]["sha256"] == "8c472456a5ee0baed3e16eb934b1ae0d7d5073aa81767c7898e0bec1d6e69f73"
    assert prov["command"].startswith("python tools/chat_goldens.py --reference")


def test_token_ids_equal_tokenizing_deepseeks_prompt(v4_tokenizer):
    plain = [r for r in goldens.load(ENCODING)["render"] if not r.get("markers")]
    for record in plain[::12]:
        want = v4_tokenizer.encode(record["prompt"], add_special_tokens=False)
        assert goldens.token_ids(record, ENCODING, v4_tokenizer) == want, record["id"]


@pytest.mark.skipif(not os.environ.get(goldens.REFERENCE_VARIABLE), reason="DEEPINFER_CHAT_REFERENCE not set")
def test_regenerating_with_deepseeks_code_gives_the_committed_records():
    renders, parses = goldens.regenerate(ENCODING, 150)
    committed = goldens.load(ENCODING)
    assert renders == committed["render"][:150]
    assert parses == committed["parse"][: len(parses)]
    assert Path(os.environ[goldens.REFERENCE_VARIABLE], "v4", "tests", "test_output_1.txt").is_file()
