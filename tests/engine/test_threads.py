"""Several threads calling ``generate`` on one ``LLM`` share one step loop: every call returns exactly its
own requests, with the outputs each has alone, and nothing hangs."""

from __future__ import annotations

import threading

from deepinfer_core import SamplingParams

from .conftest import make_toy_llm

THREADS = 6
TIMEOUT_S = 120


def _calls() -> list[tuple[list[dict], list[SamplingParams]]]:
    calls = []
    for t in range(THREADS):
        prompts = [
            {"prompt_token_ids": [2 + (t * 7 + i * 3) % 90 for i in range(3 + t * 5 + j)]}
            for j in range(t + 1)
        ]
        params = [
            SamplingParams(
                temperature=0.0 if j % 2 else 0.9, seed=100 * t + j, max_tokens=4 + 3 * j, ignore_eos=True
            )
            for j in range(t + 1)
        ]
        calls.append((prompts, params))
    return calls


def test_concurrent_generate_calls_each_get_their_own_outputs():
    llm = make_toy_llm()
    calls = _calls()
    expected = [[o.outputs[0].token_ids for o in llm.generate(p, sp, use_tqdm=False)] for p, sp in calls]
    results: dict[int, list] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def run(t: int) -> None:
        try:
            start.wait()
            for _ in range(3):  # repeated calls interleave differently each time
                outs = llm.generate(*calls[t], use_tqdm=False)
                results.setdefault(t, []).append(outs)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT_S)
    assert not any(th.is_alive() for th in threads), "a generate call hung"
    assert not errors, errors
    for t in range(THREADS):
        for outs in results[t]:
            assert len(outs) == len(calls[t][0])
            assert [o.outputs[0].token_ids for o in outs] == expected[t]
    eng = llm.engine
    assert not eng.requests and not eng.scheduler.running and not eng.scheduler.waiting


def test_a_thread_aborting_its_request_does_not_disturb_another_threads_call():
    llm = make_toy_llm()
    prompt = {"prompt_token_ids": [5, 6, 7]}
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    expected = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
    other: list = []
    th = threading.Thread(
        target=lambda: other.append(llm.generate([prompt], params, use_tqdm=False)), daemon=True
    )
    th.start()
    long = SamplingParams(temperature=0.0, max_tokens=400, ignore_eos=True)
    aborted = threading.Event()
    real_step = llm.engine.step

    def step():  # abort the long request from inside the loop, once it has run a step
        outs = real_step()
        for rid, req in list(llm.engine.requests.items()):
            if req.params.max_tokens == 400 and req.seqs[0].num_computed and not aborted.is_set():
                aborted.set()
                llm.abort(rid)
        return outs

    llm.engine.step = step
    out = llm.generate([prompt], long, use_tqdm=False)[0]
    th.join(TIMEOUT_S)
    assert not th.is_alive()
    assert out.outputs[0].finish_reason == "abort"
    assert other[0][0].outputs[0].token_ids == expected
