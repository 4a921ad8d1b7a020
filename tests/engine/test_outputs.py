"""What a request gets back: stop rules, logprobs, seeds, abort, chat, stats (toy model and tokenizer)."""

from __future__ import annotations

from pathlib import Path

import pytest

from deepinfer_core import SamplingParams

from .conftest import make_toy_llm

PROMPT = {"prompt_token_ids": [0] + list(range(30, 70))}
GREEDY = dict(temperature=0.0, ignore_eos=True, max_tokens=12)


@pytest.fixture(scope="module")
def llm():
    return make_toy_llm()


def _run(llm, **kw):
    return llm.generate([PROMPT], SamplingParams(**kw), use_tqdm=False)[0].outputs[0]


def test_stop_string_spanning_tokens_is_cut_from_the_text(llm):
    free = _run(llm, **GREEDY)
    toks = free.token_ids
    tok = llm.get_tokenizer()
    # a stop string made of the end of token 3's text and the start of token 4's
    a, b = tok.decode([toks[3]]), tok.decode([toks[4]])
    stop = a[-1] + b[0]
    head = tok.decode(toks[:3]) + a[:-1]
    if stop in head:
        pytest.skip("the stop string occurs earlier by chance")
    out = _run(llm, stop=[stop], **GREEDY)
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == head and out.token_ids == toks[:5]
    kept = _run(llm, stop=[stop], include_stop_str_in_output=True, **GREEDY)
    assert kept.text == head + stop


def test_stop_token_ids_and_eos_end_with_stop_and_keep_the_token(llm):
    free = _run(llm, **GREEDY)
    out = _run(llm, stop_token_ids=[free.token_ids[2]], **GREEDY)
    assert out.token_ids == free.token_ids[: free.token_ids.index(free.token_ids[2]) + 1]
    assert out.finish_reason == "stop" and out.stop_reason == free.token_ids[2]
    eos = _run(llm, temperature=0.0, max_tokens=12, logit_bias={1: 100.0})
    assert eos.token_ids == [1] and eos.finish_reason == "stop" and eos.stop_reason is None and eos.text == ""
    late = _run(llm, temperature=0.0, max_tokens=12, logit_bias={1: 100.0}, min_tokens=3)
    assert len(late.token_ids) == 4 and late.token_ids[-1] == 1 and 1 not in late.token_ids[:3]
    assert _run(llm, **GREEDY).finish_reason == "length"


def test_logprobs_are_the_raw_distribution_and_include_the_sampled_token(llm):
    out = _run(
        llm, temperature=0.5, top_k=3, logit_bias={50: 5.0}, logprobs=4, seed=3, max_tokens=6, ignore_eos=True
    )
    # teacher-force prompt + output: prompt_logprobs of the raw model must equal the reported logprobs
    ids = PROMPT["prompt_token_ids"] + out.token_ids
    ref = llm.generate(
        [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=4), use_tqdm=False
    )[0]
    assert len(ref.prompt_logprobs) == len(ids) and ref.prompt_logprobs[0] is None
    cum = 0.0
    for j, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs)):
        assert tok in lp and 4 <= len(lp) <= 5
        assert sorted(v.rank for t, v in lp.items() if t != tok or len(lp) == 4) == [1, 2, 3, 4]
        teacher = ref.prompt_logprobs[len(PROMPT["prompt_token_ids"]) + j]
        assert teacher[tok].logprob == pytest.approx(lp[tok].logprob, abs=1e-5)
        assert teacher[tok].rank == lp[tok].rank
        assert lp[tok].decoded_token == llm.get_tokenizer().decode([tok], skip_special_tokens=False)
        cum += lp[tok].logprob
    assert out.cumulative_logprob == pytest.approx(cum)


def test_seeded_sampling_is_reproducible_across_batch_composition_and_chunking():
    sp = SamplingParams(temperature=1.0, seed=1234, max_tokens=10, ignore_eos=True)
    alone = make_toy_llm().generate([PROMPT], sp, use_tqdm=False)[0].outputs[0].token_ids
    others = [{"prompt_token_ids": list(range(2, 2 + n))} for n in (3, 50, 90)]
    mixed = make_toy_llm(max_num_batched_tokens=16).generate(
        [*others, PROMPT], [SamplingParams(temperature=1.0, max_tokens=7)] * 3 + [sp], use_tqdm=False
    )
    assert mixed[3].outputs[0].token_ids == alone
    other_seed = SamplingParams(temperature=1.0, seed=99, max_tokens=10, ignore_eos=True)
    assert make_toy_llm().generate([PROMPT], other_seed, use_tqdm=False)[0].outputs[0].token_ids != alone


def test_unseeded_requests_follow_the_engine_seed():
    sp = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    a = [o.outputs[0].token_ids for o in make_toy_llm(seed=5).generate([PROMPT] * 3, sp, use_tqdm=False)]
    b = [o.outputs[0].token_ids for o in make_toy_llm(seed=5).generate([PROMPT] * 3, sp, use_tqdm=False)]
    c = [o.outputs[0].token_ids for o in make_toy_llm(seed=6).generate([PROMPT] * 3, sp, use_tqdm=False)]
    assert a == b and a != c and len({tuple(x) for x in a}) > 1


def test_abort_during_generate_returns_the_request_with_abort():
    llm = make_toy_llm()
    engine = llm.engine
    real_step, steps = engine.step, {"n": 0}

    def step():
        steps["n"] += 1
        if steps["n"] == 3:
            llm.abort("1")
        return real_step()

    engine.step = step
    outs = llm.generate(
        [PROMPT, PROMPT, PROMPT], SamplingParams(max_tokens=30, ignore_eos=True), use_tqdm=False
    )
    assert [o.outputs[0].finish_reason for o in outs] == ["length", "abort", "length"]
    assert 0 < len(outs[1].outputs[0].token_ids) < 30
    assert all(p.num_in_use == 0 for p in engine.kv.pools.values())


def test_request_output_fields_metrics_and_stats(llm, capsys):
    before = llm.get_stats()
    outs = llm.generate(["abc", PROMPT], SamplingParams(max_tokens=5, ignore_eos=True), use_tqdm=True)
    assert [o.request_id for o in outs] == sorted((o.request_id for o in outs), key=int)
    assert outs[0].prompt == "abc" and outs[0].prompt_token_ids == [0, 2, 3, 4]
    assert outs[1].prompt is None and outs[0].finished
    m = outs[0].metrics
    assert m.first_token_time > 0 and m.time_per_output_token > 0
    after = llm.get_stats()
    assert after["num_requests"] - before["num_requests"] == 2
    assert after["num_generation_tokens"] - before["num_generation_tokens"] == 10
    assert after["num_prompt_tokens"] - before["num_prompt_tokens"] == 4 + 41
    assert set(after) >= {
        "num_preemptions",
        "prefix_cache_queries",
        "prefix_cache_hits",
        "spec_num_draft_tokens",
        "spec_num_accepted_tokens",
    }
    err = capsys.readouterr().err
    assert "2/2" in err and "toks/s" in err


def test_chat_renders_the_conversation_then_generates(llm, monkeypatch):
    import deepinfer_core.chat as chat

    seen = {}

    def render(messages, thinking_mode="non-think", tools=None, encoding=None):
        seen.update(messages=messages, mode=thinking_mode, tools=tools, encoding=encoding)
        return chat.Prompt().own("abc")

    monkeypatch.setattr(chat, "render_prompt", render)
    msgs = [{"role": "user", "content": "hi"}]
    out = llm.chat(msgs, SamplingParams(max_tokens=2), use_tqdm=False, thinking_mode="thinking")
    # the toy engine has no checkpoint of its own: the encoding is the default checkpoint's (the V4.1 demo)
    assert seen == {"messages": msgs, "mode": "thinking", "tools": None, "encoding": chat.DEEPSEEK_V41}
    assert out[0].prompt_token_ids == [2, 3, 4]  # rendered text carries its own BOS: no special tokens added


def test_chat_uses_the_encoding_the_checkpoint_config_names(monkeypatch):
    import deepinfer_core.chat as chat

    seen = {}

    def render(messages, thinking_mode="non-think", tools=None, encoding=None, reasoning_effort=None):
        seen.update(encoding=encoding, effort=reasoning_effort)
        return chat.Prompt().own("abc")

    monkeypatch.setattr(chat, "render_prompt", render)
    checkpoint = Path(__file__).resolve().parents[1] / "data/v41/flash_mini/checkpoint"
    llm = make_toy_llm(model=str(checkpoint))
    llm.chat(
        [{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1), use_tqdm=False, reasoning_effort=30
    )
    assert seen == {"encoding": chat.DEEPSEEK_V41, "effort": 30}


def test_text_decoded_once_at_the_end_equals_the_incremental_text(llm):
    params = dict(temperature=1.0, seed=4, max_tokens=30, ignore_eos=True, skip_special_tokens=False)
    deferred = _run(llm, **params)
    incremental = _run(llm, stop=["never-matches"], **params)
    assert deferred.token_ids == incremental.token_ids
    assert deferred.text == incremental.text == llm.get_tokenizer().decode(deferred.token_ids)
