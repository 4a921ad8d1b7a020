"""run-batch: every line of an OpenAI batch file answered, or given its error, in order."""

from __future__ import annotations

import io
import json
import re

from deepinfer_core import SamplingParams
from deepinfer_core.cli.main import main
from deepinfer_core.serve.batch import BatchRunner
from deepinfer_core.serve.settings import ServeSettings

from .conftest import MODEL


def _line(custom_id, url, body, method="POST"):
    return json.dumps({"custom_id": custom_id, "method": method, "url": url, "body": body})


def test_good_and_bad_lines_are_all_answered_in_order(toy):
    good = {"model": "any-name", "prompt": "abc", "max_tokens": 6, "temperature": 0}
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    lines = [
        _line("c1", "/v1/completions", good),
        "{this is not json",
        _line("bad-param", "/v1/completions", {**good, "temperature": -2}),
        "",
        json.dumps({"custom_id": "no-body", "method": "POST", "url": "/v1/completions"}),
        _line("chat", "/v1/chat/completions", chat),
        _line("bad-url", "/v1/embeddings", good),
        _line("stream", "/v1/completions", {**good, "stream": True}),
        _line("get", "/v1/completions", good, method="GET"),
        _line("c2", "/v1/completions", {**good, "prompt": "xyz"}),
    ]
    out = io.StringIO()
    import asyncio

    summary = asyncio.run(
        BatchRunner(toy.llm, ServeSettings(), MODEL).run(io.StringIO("\n".join(lines)), out, 4, False)
    )
    records = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [r["custom_id"] for r in records] == [
        "c1",
        None,
        "bad-param",
        "no-body",
        "chat",
        "bad-url",
        "stream",
        "get",
        "c2",
    ]
    assert (summary.total, summary.succeeded, summary.failed) == (9, 3, 6)
    ok = {r["custom_id"]: r for r in records if r["error"] is None}
    assert set(ok) == {"c1", "chat", "c2"}
    want = toy.offline.generate(["abc", "xyz"], SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    for cid, ref in zip(("c1", "c2"), want):
        assert ok[cid]["response"]["status_code"] == 200
        assert ok[cid]["response"]["body"]["choices"][0]["text"] == ref.outputs[0].text
    assert ok["chat"]["response"]["body"]["object"] == "chat.completion"
    bad = {r["custom_id"]: r for r in records if r["error"] is not None}
    assert bad["bad-param"]["response"]["status_code"] == 400
    assert bad["bad-param"]["response"]["body"]["error"]["param"] == "temperature"
    assert bad["stream"]["response"]["status_code"] == 400
    assert bad[None]["response"] is None and "not JSON" in bad[None]["error"]["message"]
    assert "missing body" in bad["no-body"]["error"]["message"]
    assert "embeddings" in bad["bad-url"]["error"]["message"] and "GET" in bad["get"]["error"]["message"]


def test_the_run_batch_command_answers_a_file_with_a_progress_bar(tmp_path, capsys):
    inp, out = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    body = {"model": MODEL, "prompt": "def f(x):", "max_tokens": 4, "temperature": 0}
    inp.write_text(_line("a", "/v1/completions", body) + "\nnot json\n\n")
    assert main(["run-batch", "-i", str(inp), "-o", str(out), "--max-model-len", "512", "--progress"]) == 0
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["custom_id"] for r in records] == ["a", None]
    assert records[0]["response"]["body"]["usage"]["completion_tokens"] == 4
    err = capsys.readouterr().err
    assert "1 answered, 1 failed" in err
    assert re.search(r"Batch requests: 100%.*2/2", err), err  # the bar knows the file's two requests
