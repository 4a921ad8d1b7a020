"""Everything written for one tiny config: its checkpoint and the reference's outputs on it.

Files under ``<out>/<config name>/`` (tensor names and shapes in docs/v41_reference.md):

- ``checkpoint/``: the published layout (:mod:`v41golden.checkpoint_files`);
- ``prompts.safetensors``: ``prompt.<i>.ids`` and, per numerics mode ``<m>`` (:data:`v41golden.patches.MODES`),
  ``<m>.<i>.<field>`` with the fields of :func:`v41golden.runs.prompt_and_greedy`;
- ``dspark.safetensors``: ``context.<c>.ids`` and ``<m>.<c>.<field>`` (:func:`v41golden.dspark.drafts`);
- ``engram.safetensors``: ``token_map`` ``[V]`` int64 (compressed id of every token) and ``hash.<i>.ids`` int32
  ``[L, n_engram_layers, (max_ngram_size - 1) * n_heads]`` (table rows looked up at each position of prompt ``i``;
  the reference computes them in int64);
- ``goldens.json``: the config, the prompts' lengths, the modes and the provenance.

A fresh reference model is built for every (mode, prompt), so no request sees another's caches.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from . import configs, dspark, engram_rows, layout, patches, prompts, runs, stored
from .checkpoint_files import write_checkpoint
from .configs import NOISE_TOKEN, TinySpec
from .files import provenance, write_json, write_tensors
from .reference import Reference, build, model_args
from .tokenizer import as_transformers
from .tokenizer import build as build_tokenizer

MODES = tuple(patches.MODES)


@dataclass
class Prepared:
    spec: TinySpec
    tok: object  # tokenizers.Tokenizer
    hf_tok: object  # PreTrainedTokenizerFast over tok
    args: dict  # inference/config.json
    state: dict[str, torch.Tensor]  # stored tensors
    prompts: list[list[int]]


def prepare(ref: Reference, spec: TinySpec) -> Prepared:
    configs.check(spec)
    tok = build_tokenizer()
    hf_tok = as_transformers(tok)
    _, compressed = ref.engram.build_compressed_token_map(hf_tok)
    rows = engram_rows.table_rows(spec.engram)
    args = configs.model_args(spec, len(hf_tok), rows, compressed, tok.token_to_id(NOISE_TOKEN))
    if rows:
        ref_rows = ref.engram.EngramLayout.from_args(model_args(ref, args, configs.MAX_SEQ_LEN)).primes
        if tuple(sum(p for ng in layer for p in ng) for layer in ref_rows) != rows:
            raise AssertionError(
                f"{spec.name}: Engram rows {rows} disagree with the reference's bucket primes"
            )
    state = stored.state(layout.tensors(spec, len(hf_tok), rows), spec.seed)
    return Prepared(spec, tok, hf_tok, args, state, prompts.prompts(spec, tok))


def fresh_model(ref: Reference, p: Prepared):
    return build(ref, p.args, p.hf_tok, p.state, configs.MAX_SEQ_LEN)


def prompt_tensors(ref: Reference, p: Prepared) -> dict[str, torch.Tensor]:
    out = {f"prompt.{i}.ids": torch.tensor(ids) for i, ids in enumerate(p.prompts)}
    for mode in MODES:
        for i, ids in enumerate(p.prompts):
            model = fresh_model(ref, p)
            with patches.numerics(ref, mode):
                got = runs.prompt_and_greedy(model, ref, ids, p.spec.greedy_tokens)
            out.update({f"{mode}.{i}.{k}": v for k, v in got.items()})
    return out


def dspark_tensors(ref: Reference, p: Prepared) -> dict[str, torch.Tensor]:
    contexts = prompts.dspark_contexts(p.spec, p.tok)
    out = {f"context.{c}.ids": torch.tensor(ids) for c, ids in enumerate(contexts)}
    for mode in MODES:
        for c, ids in enumerate(contexts):
            model = fresh_model(ref, p)
            with patches.numerics(ref, mode):
                got = dspark.drafts(model, ids, p.spec.dspark_steps)
            out.update({f"{mode}.{c}.{k}": v for k, v in got.items()})
    return out


def engram_tensors(ref: Reference, p: Prepared) -> dict[str, torch.Tensor]:
    model = fresh_model(ref, p)
    out = {"token_map": model.engram_hash.token_map.clone()}
    for i, ids in enumerate(p.prompts):
        out[f"hash.{i}.ids"] = model.engram_hash(torch.tensor([ids]), 0)[0].int()
    return out


def seeds(spec: TinySpec) -> dict:
    return {
        "weights": spec.seed,
        "weights_rule": "torch.Generator seed = weights * 1000003 + crc32(tensor name)",
        "prompts_rule": "torch.Generator seed = weights * 7919 + prompt length; ids in [3, V-1)",
    }


def write(ref: Reference, spec: TinySpec, out: Path, parts: set[str], command: str) -> list[Path]:
    """Write the requested ``parts`` of ``spec``'s goldens under ``out/<name>``; returns the files written."""
    p = prepare(ref, spec)
    d = out / spec.name
    prov = provenance(ref.sha256, command, seeds(spec), {"name": spec.name, "inference_config": p.args})
    written = []
    if "checkpoint" in parts:
        write_checkpoint(d / "checkpoint", p.args, p.state, p.tok, configs.MAX_SEQ_LEN)
    makers = {"prompts": prompt_tensors, "dspark": dspark_tensors, "engram": engram_tensors}
    for part, make in makers.items():
        if part in parts and (part != "dspark" or spec.dspark) and (part != "engram" or spec.engram):
            write_tensors(d / f"{part}.safetensors", make(ref, p), prov)
            written.append(d / f"{part}.safetensors")
    write_json(d / "goldens.json", describe(spec, p, prov))
    return written


def describe(spec: TinySpec, p: Prepared, prov: dict) -> dict:
    return {
        "name": spec.name,
        "covers": spec.covers,
        "spec": configs.as_dict(spec),
        "prompt_lengths": [len(ids) for ids in p.prompts],
        "dspark_context_lengths": [len(c) for c in prompts.dspark_contexts(spec, p.tok)]
        if spec.dspark
        else [],
        "modes": patches.MODES,
        "topk": {"prompts": runs.TOPK, "dspark": dspark.TOPK},
        "provenance": prov,
    }
