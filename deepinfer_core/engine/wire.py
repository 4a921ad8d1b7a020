"""Requests and outputs as plain JSON data, for the control messages between data-parallel ranks.

Only plain types cross the wire (str, int, float, bool, None, lists, string-keyed dicts); the receiver
rebuilds the objects through their validating constructors, so a malformed message fails as a bad
parameter would, never as code.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.engine.outputs import CompletionOutput, Logprob, RequestMetrics, RequestOutput
from deepinfer_core.sampling_params import SamplingParams, StructuredOutputsParams


def _params_to_wire(p: SamplingParams) -> dict[str, Any]:
    out = {f.name: getattr(p, f.name) for f in fields(p)}
    so = p.structured_outputs
    out["structured_outputs"] = None if so is None else {f.name: getattr(so, f.name) for f in fields(so)}
    if p.logit_bias is not None:
        out["logit_bias"] = {str(k): v for k, v in p.logit_bias.items()}
    return out


def _params_from_wire(d: dict[str, Any]) -> SamplingParams:
    d = dict(d)
    if d.get("structured_outputs") is not None:
        d["structured_outputs"] = StructuredOutputsParams(**d["structured_outputs"])
    return SamplingParams(**d)


def prompt_to_wire(item: ProcessedPrompt) -> dict[str, Any]:
    return {"prompt": item.prompt, "token_ids": list(item.token_ids), "params": _params_to_wire(item.params)}


def prompt_from_wire(d: dict[str, Any]) -> ProcessedPrompt:
    ids = d["token_ids"]
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError("token_ids must be a list of ints")
    prompt = d["prompt"]
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError("prompt must be a string or null")
    return ProcessedPrompt(prompt, ids, _params_from_wire(d["params"]))


def _logprobs_to_wire(pos: dict[int, Logprob] | None) -> list | None:
    return None if pos is None else [[t, lp.logprob, lp.rank, lp.decoded_token] for t, lp in pos.items()]


def _logprobs_from_wire(rows: list | None) -> dict[int, Logprob] | None:
    return None if rows is None else {int(t): Logprob(float(lp), int(r), d) for t, lp, r, d in rows}


def _completion_to_wire(c: CompletionOutput) -> dict[str, Any]:
    d = {f.name: getattr(c, f.name) for f in fields(c)}
    d["logprobs"] = None if c.logprobs is None else [_logprobs_to_wire(p) for p in c.logprobs]
    return d


def _completion_from_wire(d: dict[str, Any]) -> CompletionOutput:
    d = dict(d)
    if d["logprobs"] is not None:
        d["logprobs"] = [_logprobs_from_wire(p) for p in d["logprobs"]]
    return CompletionOutput(**d)


def output_to_wire(o: RequestOutput) -> dict[str, Any]:
    return {
        "request_id": o.request_id,
        "prompt": o.prompt,
        "prompt_token_ids": list(o.prompt_token_ids),
        "prompt_logprobs": None
        if o.prompt_logprobs is None
        else [_logprobs_to_wire(p) for p in o.prompt_logprobs],
        "outputs": [_completion_to_wire(c) for c in o.outputs],
        "finished": o.finished,
        "num_cached_tokens": o.num_cached_tokens,
        "error": o.error,
        "metrics": None
        if o.metrics is None
        else {f.name: getattr(o.metrics, f.name) for f in fields(o.metrics)},
    }


def output_from_wire(d: dict[str, Any]) -> RequestOutput:
    return RequestOutput(
        request_id=str(d["request_id"]),
        prompt=d["prompt"],
        prompt_token_ids=[int(t) for t in d["prompt_token_ids"]],
        prompt_logprobs=None
        if d["prompt_logprobs"] is None
        else [_logprobs_from_wire(p) for p in d["prompt_logprobs"]],
        outputs=[_completion_from_wire(c) for c in d["outputs"]],
        finished=bool(d["finished"]),
        num_cached_tokens=int(d["num_cached_tokens"]),
        metrics=None if d["metrics"] is None else RequestMetrics(**d["metrics"]),
        error=d["error"],
    )
