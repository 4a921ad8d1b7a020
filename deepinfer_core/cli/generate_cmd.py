"""``deepinfer generate``: complete prompts given as arguments or in a file (text lines or JSONL)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from deepinfer_core.cli.args import engine_kwargs, sampling_kwargs
from deepinfer_core.config import load_config


def read_prompts(ns: argparse.Namespace) -> list[Any]:
    prompts: list[Any] = list(ns.prompts or [])
    if ns.input_file:
        path = Path(ns.input_file)
        if not path.is_file():
            raise SystemExit(f"deepinfer: --input-file {str(path)!r} does not exist")
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            if path.suffix == ".jsonl":
                prompts.append(_jsonl_prompt(line, path, i))
            else:
                prompts.append(line)
    if not prompts:
        raise SystemExit("deepinfer generate: give prompts as arguments or with --input-file")
    return prompts


def _jsonl_prompt(line: str, path: Path, lineno: int) -> Any:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise SystemExit(f"deepinfer: {path}:{lineno}: not JSON ({e})") from None
    if isinstance(obj, str):
        return obj
    if isinstance(obj, dict) and "prompt_token_ids" in obj:
        return {"prompt_token_ids": obj["prompt_token_ids"]}
    if isinstance(obj, dict) and "prompt" in obj:
        return obj["prompt"]
    raise SystemExit(
        f'deepinfer: {path}:{lineno}: expected a string, {{"prompt": ...}} or {{"prompt_token_ids": [...]}}'
    )


def make_llm(ns: argparse.Namespace):
    from deepinfer_core import LLM

    cfg = load_config(ns.config, **engine_kwargs(ns))
    llm = LLM(**cfg.model_dump())
    print(f"deepinfer: backend {llm.backend_name}", file=sys.stderr)
    return llm


def output_record(out) -> dict:
    return {
        "request_id": out.request_id,
        "prompt": out.prompt,
        "prompt_token_ids": out.prompt_token_ids,
        "num_cached_tokens": out.num_cached_tokens,
        "outputs": [
            {
                "index": c.index,
                "text": c.text,
                "token_ids": list(c.token_ids),
                "finish_reason": c.finish_reason,
                "cumulative_logprob": c.cumulative_logprob,
            }
            for c in out.outputs
        ],
    }


def run(ns: argparse.Namespace) -> int:
    from deepinfer_core import SamplingParams

    prompts = read_prompts(ns)
    llm = make_llm(ns)
    params = SamplingParams(**sampling_kwargs(ns))
    outs = llm.generate(prompts, params, use_tqdm=not ns.no_progress and sys.stderr.isatty() or ns.progress)
    if ns.json:
        print(json.dumps([output_record(o) for o in outs], indent=2))
        return 0
    for o in outs:
        for c in o.outputs:
            head = o.prompt if isinstance(o.prompt, str) and o.prompt else ""
            print(head + c.text if ns.echo else c.text)
            print("-" * 40)
    return 0
