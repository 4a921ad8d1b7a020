"""Prompt logprobs of DeepSeek's reference ``model.py`` on a tiny V4.1 checkpoint with a vision tower.

The reference package is the oracle folder (``.v41vision/``): it holds the release's ``model.py`` and
``engram.py`` (the sha256 sums docs/v41_reference.md records), the CPU kernel stand-in, DeepSeek's
``image_processor.py`` and the vision port, so ``model.py``'s own ``Transformer`` builds ``ViT`` / ``Aligner``
and splices the spans (``merge_image_embeddings``), steers image positions with ``bias_vl`` and masks them
out of Engram. Prompts are built the way ``prepare_vl_inputs`` builds them (each placeholder replaced by the
image's span, the types out of band), from the oracle's ``load_image`` on PNG bytes; the encoding module it
imports the placeholder spelling from is not part of the release files here, so the loop is spelled out.

The config is ``reindex_r2`` (docs/v41_reference.md) without its DSpark stage, plus a 2-layer vision tower; the
tokenizer is the tiny one with the image placeholder added as a special token (its id is
``image_token_id``). Numerics: the ``exact`` mode (float32 GEMMs, no KV round trips). A fresh model per prompt.
"""

from __future__ import annotations

import io
import sys
from dataclasses import replace
from pathlib import Path

import torch
from PIL import Image
from v41golden import configs, engram_rows, layout, patches, stored
from v41golden.checkpoint_files import write_checkpoint
from v41golden.configs import NOISE_TOKEN
from v41golden.layout import TensorSpec
from v41golden.margins import MarginRecorder
from v41golden.reference import PACKAGE, Reference, build, model_args
from v41golden.runs import TOPK
from v41golden.tokenizer import as_transformers
from v41golden.tokenizer import build as build_tokenizer

from . import cases

SPEC = replace(
    configs.by_name("reindex_r2"),
    name="vl_r2",
    covers="reindex_r2 without DSpark, with a 2-layer vision tower: spans spliced, bias_vl, Engram dead tokens",
    dspark={},
)
PLACEHOLDER = "<｜deepseek_image｜>"
VISION = {
    "vision_n_layers": 2, "vision_dim": 32, "vision_n_heads": 2, "vision_inter_dim": 48,
    "vision_patch_size": 14, "vision_rope_theta": 10000.0, "vision_downsample_ratio": 3,
    "vision_max_n_token": 40, "vision_min_pixels": 84 * 84, "vision_max_wh_ratio": None,
}  # fmt: skip
VISION_SEED = 291
BIAS_VL_STD = 0.5  # gate.bias is 0.1: image positions route visibly differently
#: images: (name, source seed, width, height)
IMAGES = [("a", 31, 100, 60), ("b", 32, 50, 120), ("c", 33, 200, 200)]
#: prompts: text pieces and image names, in order (BOS first)
PROMPTS = [
    ["Describe this picture: ", "a", " It shows the quick brown fox."],
    ["Compare ", "b", " and ", "c", " please; which one is naïve?"],
    ["b", "a", "the lazy dog jumps"],
    ["Text only: the quick brown fox jumps over the lazy dog. Café au lait?"],
]


def tokenizer():
    tok = build_tokenizer()
    tok.add_special_tokens([PLACEHOLDER])
    return tok


def png(name: str) -> bytes:
    seed, w, h = next((s, w, h) for n, s, w, h in IMAGES if n == name)
    src = cases.source(seed, w, h)
    image = Image.frombytes("RGB", (w, h), src.numpy().tobytes())
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def checkpoint_state(args: dict, vocab: int, rows: tuple[int, ...]) -> dict[str, torch.Tensor]:
    specs = layout.tensors(SPEC, vocab, rows)
    specs += [
        TensorSpec(f"layers.{i}.ffn.gate.bias_vl", (SPEC.n_routed_experts,), "f32", BIAS_VL_STD)
        for i in range(SPEC.n_layers)
    ]
    state = stored.state(specs, SPEC.seed)
    return state | cases.tower_weights({**VISION, "dim": SPEC.dim}, VISION_SEED)


def prepare(ref: Reference):
    tok = tokenizer()
    hf_tok = as_transformers(tok)
    _, compressed = ref.engram.build_compressed_token_map(hf_tok)
    rows = engram_rows.table_rows(SPEC.engram)
    args = configs.model_args(SPEC, len(hf_tok), rows, compressed, tok.token_to_id(NOISE_TOKEN))
    args |= VISION | {
        "vision_n_layers": VISION["vision_n_layers"],
        "image_token_id": tok.token_to_id(PLACEHOLDER),
    }
    return tok, hf_tok, args, checkpoint_state(args, len(hf_tok), rows)


def vl_inputs(ref: Reference, tok, margs, pieces: list[str]):
    """``(tokens, types, images)`` as ``prepare_vl_inputs`` builds them; the prompt starts with BOS."""
    ip = sys.modules[f"{PACKAGE}.image_processor"]
    tokens, types, images = [0], [ip.TEXT], []
    names = {n for n, *_ in IMAGES}
    for piece in pieces:
        if piece not in names:
            ids = tok.encode(piece).ids
            tokens += ids
            types += [ip.TEXT] * len(ids)
            continue
        p, n_vit_h, n_vit_w, n_llm_h, n_llm_w = ip.load_image({"data": png(piece)}, margs)
        t = ip.image_token_types(n_llm_h, n_llm_w)
        # the ViT runs in float32 here; the bfloat16 patches widen losslessly
        images.append(ip.ImageInput(len(tokens), p.float(), n_vit_h, n_vit_w, t))
        tokens += [margs.image_token_id] * t.numel()
        types += t.tolist()
    return tokens, types, images


@torch.inference_mode()
def prompt_logprobs(model, ref: Reference, tokens, types, images) -> dict[str, torch.Tensor]:
    with patches.capture_logits(model) as cap, MarginRecorder(ref, len(tokens)) as rec:
        if images:
            model(torch.tensor([tokens]), 0, images=[images], token_types=torch.tensor([types]))
        else:  # text only: the release's text path (no token types)
            model(torch.tensor([tokens]), 0)
    lp = cap.last[0].float().log_softmax(-1)
    top = lp.topk(TOPK, dim=-1)
    return {
        "ids": torch.tensor(tokens),
        "types": torch.tensor(types),
        "logprob": lp[:-1].gather(-1, torch.tensor(tokens[1:]).unsqueeze(-1)).squeeze(-1),
        "topk_ids": top.indices.int(),
        "topk_logprobs": top.values,
        "margins": rec.stacked(),
    }


def write(ref: Reference, out: Path, write_tensors, write_json, prov: dict) -> None:
    """``out/checkpoint/`` and ``out/prompts.safetensors`` (``image.<name>`` PNG bytes, ``<i>.<field>``)."""
    tok, hf_tok, args, state = prepare(ref)
    write_checkpoint(out / "checkpoint", args, state, tok, configs.MAX_SEQ_LEN)
    margs = model_args(ref, args, configs.MAX_SEQ_LEN)
    tensors = {f"image.{n}": torch.frombuffer(bytearray(png(n)), dtype=torch.uint8) for n, *_ in IMAGES}
    meta = []
    for i, pieces in enumerate(PROMPTS):
        tokens, types, images = vl_inputs(ref, tok, margs, pieces)
        model = build(ref, args, hf_tok, state, configs.MAX_SEQ_LEN)
        with patches.numerics(ref, "exact"):
            got = prompt_logprobs(model, ref, tokens, types, images)
        tensors |= {f"{i}.{k}": v for k, v in got.items()}
        meta.append(
            {
                "pieces": pieces,
                "length": len(tokens),
                "spans": [[im.start, im.types.numel()] for im in images],
            }
        )
    write_tensors(out / "prompts.safetensors", tensors, prov)
    write_json(out / "prompts.json", {"provenance": prov, "spec": configs.as_dict(SPEC), "vision": VISION,
                                       "bias_vl_std": BIAS_VL_STD, "images": IMAGES, "prompts": meta,
                                       "mode": "exact", "topk": TOPK})  # fmt: skip
