"""Flags shared by the subcommands: engine config and sampling parameters."""

from __future__ import annotations

import argparse
from typing import Any

ENGINE_FLAGS: list[tuple[str, dict[str, Any]]] = [
    (
        "--model",
        dict(
            help="checkpoint directory, or a shipped demo: 'demo' (the V4.1 demo, the default) or 'demo-v4' "
            "(the V4 demo)"
        ),
    ),
    ("--backend", dict(help='platform name or "auto" (env DEEPINFER_BACKEND)')),
    ("--dtype", dict(choices=["auto", "float32", "bfloat16", "float16"])),
    ("--kv-cache-dtype", dict(choices=["auto", "fp8", "fp8_e4m3", "unquantized"])),
    (
        "--activation-quant",
        dict(
            choices=["none", "fp8"], help="FP8 inputs to FP8 / FP4 GEMMs, as DeepSeek's V4.1 release computes"
        ),
    ),
    (
        "--quantization",
        dict(choices=["fp8", "fp4"], help="quantize the checkpoint's weights on load (cached)"),
    ),
    ("--quantization-cache-dir", dict(help="where on-demand quantized copies are kept")),
    ("--max-model-len", dict(type=int)),
    ("--max-num-seqs", dict(type=int)),
    ("--max-num-batched-tokens", dict(type=int)),
    ("--block-size", dict(type=int)),
    ("--kv-cache-memory-bytes", dict(type=int)),
    ("--gpu-memory-utilization", dict(type=float)),
    ("--data-parallel-size", dict(type=int)),
    ("--structured-outputs-backend", dict(help="grammar backend: xgrammar, llguidance, auto, or a plugin's")),
    (
        "--async-scheduling",
        dict(action=argparse.BooleanOptionalAction, help="overlap scheduling (default: the platform's)"),
    ),
]
BOOL_FLAGS = ["--expert-parallel", "--enforce-eager", "--strict-plugins", "--skip-tokenizer-init"]

SAMPLING_FLAGS: list[tuple[str, dict[str, Any]]] = [
    ("--temperature", dict(type=float)),
    ("--top-p", dict(type=float)),
    ("--top-k", dict(type=int)),
    ("--min-p", dict(type=float)),
    ("--max-tokens", dict(type=int)),
    ("--min-tokens", dict(type=int)),
    ("--presence-penalty", dict(type=float)),
    ("--frequency-penalty", dict(type=float)),
    ("--repetition-penalty", dict(type=float)),
    ("--n", dict(type=int)),
    ("--logprobs", dict(type=int)),
    ("--stop", dict(action="append", help="stop string (repeatable)")),
    ("--ignore-eos", dict(action="store_true", default=None)),
]


def add_engine_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--config", help="config file (.toml, .yaml, .json) with engine fields")
    g.add_argument("--engine-seed", dest="engine_seed", type=int, help="engine seed (config field 'seed')")
    for flag, kw in ENGINE_FLAGS:
        g.add_argument(flag, default=None, **kw)
    for flag in BOOL_FLAGS:
        g.add_argument(flag, action="store_true", default=None)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--seed", type=int, default=None, help="per-request sampling seed")
    for flag, kw in SAMPLING_FLAGS:
        g.add_argument(flag, **({"default": None} | kw))


def engine_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    """Only the flags the user gave: unset ones leave file / env / defaults in charge."""
    out = {}
    for flag, _ in ENGINE_FLAGS:
        key = flag[2:].replace("-", "_")
        if getattr(ns, key) is not None:
            out[key] = getattr(ns, key)
    for flag in BOOL_FLAGS:
        key = flag[2:].replace("-", "_")
        if getattr(ns, key):
            out[key] = True
    if ns.engine_seed is not None:
        out["seed"] = ns.engine_seed
    return out


def sampling_kwargs(ns: argparse.Namespace) -> dict[str, Any]:
    out = {}
    for flag, _ in [("--seed", {}), *SAMPLING_FLAGS]:
        key = flag[2:].replace("-", "_")
        if getattr(ns, key, None) is not None:
            out[key] = getattr(ns, key)
    return out
