"""``deepinfer run-batch -i requests.jsonl -o results.jsonl``: an OpenAI batch file, answered offline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from deepinfer_core.cli.args import engine_kwargs
from deepinfer_core.cli.serve_cmd import require_serve_extra
from deepinfer_core.serve.settings import load_serve_config


def run(ns: argparse.Namespace) -> int:
    require_serve_extra("run-batch")
    from deepinfer_core.engine.async_llm import AsyncLLM
    from deepinfer_core.serve.batch import run_batch

    if not Path(ns.input).is_file():
        raise SystemExit(f"deepinfer run-batch: input file {ns.input!r} does not exist")
    engine_cfg, settings = load_serve_config(ns.config, engine_kwargs(ns), {})
    llm = AsyncLLM.from_config(engine_cfg)
    try:
        progress = not ns.no_progress and (sys.stderr.isatty() or ns.progress)
        summary = run_batch(
            llm, settings, settings.model_name(engine_cfg), ns.input, ns.output, ns.max_concurrency, progress
        )
    finally:
        llm.shutdown()
    print(
        f"deepinfer: {summary.total} requests: {summary.succeeded} answered, {summary.failed} failed -> {ns.output}",
        file=sys.stderr,
    )
    return 0
