"""Entry point of the ``deepinfer`` command."""

from __future__ import annotations

import argparse
import sys

from deepinfer_core.cli import batch_cmd, bench_cmd, chat_cmd, generate_cmd, plugins_cmd, serve_cmd
from deepinfer_core.cli.args import add_engine_args, add_sampling_args
from deepinfer_core.version import __version__


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deepinfer", description="DeepSeek-V4 inference with pluggable backends")
    p.add_argument("--version", action="version", version=f"deepinfer {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    sp = sub.add_parser("plugins", help="list installed plugins, their hooks and platforms")
    sp.add_argument(
        "--config",
        nargs="?",
        const="",
        metavar="FILE",
        help="also print the effective settings (engine and each platform's section) and where each comes "
        "from; FILE: a config file to read first",
    )
    sp.add_argument("--json", action="store_true")
    sp.set_defaults(func=plugins_cmd.run)

    g = sub.add_parser("generate", help="complete prompts")
    g.add_argument("prompts", nargs="*", help="prompt texts")
    g.add_argument("--input-file", help="one prompt per line (.txt) or JSONL (.jsonl)")
    g.add_argument("--json", action="store_true", help="print results as JSON")
    g.add_argument("--echo", action="store_true", help="print the prompt before its completion")
    g.add_argument("--no-progress", action="store_true")
    g.add_argument(
        "--progress", action="store_true", help="show the progress bar even when not on a terminal"
    )
    add_engine_args(g)
    add_sampling_args(g)
    g.set_defaults(func=generate_cmd.run)

    c = sub.add_parser("chat", help="chat with the model")
    c.add_argument("--message", action="append", help="send these user turns and exit (repeatable)")
    c.add_argument("--system", help="system prompt")
    c.add_argument(
        "--thinking-mode",
        default="non-think",
        choices=["non-think", "think", "think-high", "think-max"],
        help="'think' is DeepSeek-V4.1's, with --reasoning-effort",
    )
    c.add_argument(
        "--reasoning-effort",
        type=_effort,
        help="DeepSeek-V4.1's reasoning effort: an integer from 1 to 100, or low, high, max",
    )
    c.add_argument("--json", action="store_true")
    add_engine_args(c)
    add_sampling_args(c)
    c.set_defaults(func=chat_cmd.run)

    b = sub.add_parser("bench", help="throughput and latency of a synthetic workload")
    b.add_argument("--num-prompts", type=int, default=32)
    b.add_argument("--input-len", type=int, default=64)
    b.add_argument("--output-len", type=int, default=32)
    b.add_argument("--bench-seed", type=int, default=0)
    b.add_argument("--temperature", type=float, default=0.0)
    b.add_argument("--json", action="store_true")
    add_engine_args(b)
    b.set_defaults(func=bench_cmd.run)

    s = sub.add_parser("serve", help="OpenAI-compatible HTTP server (needs the serve extra)")
    add_engine_args(s)
    serve_cmd.add_serve_args(s)
    s.set_defaults(func=serve_cmd.run)

    r = sub.add_parser("run-batch", help="answer an OpenAI batch file (JSONL) (needs the serve extra)")
    r.add_argument("-i", "--input", required=True, help="requests, one per line (OpenAI batch format)")
    r.add_argument("-o", "--output", required=True, help="results, one per input line, in order")
    r.add_argument("--max-concurrency", type=int, default=256, help="requests in flight at once")
    r.add_argument("--no-progress", action="store_true")
    r.add_argument(
        "--progress", action="store_true", help="show the progress bar even when not on a terminal"
    )
    add_engine_args(r)
    r.set_defaults(func=batch_cmd.run)
    return p


def _effort(text: str) -> int | str:
    return int(text) if text.lstrip("-").isdigit() else text


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        return ns.func(ns)
    except (ValueError, OSError) as e:  # configuration, input and file errors: one clear line, no traceback
        print(f"deepinfer: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("deepinfer: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
