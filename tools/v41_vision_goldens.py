"""Write the V4.1 vision goldens: the oracle's token counts, patches and tower outputs, for the engine's tests.

    python tools/v41_vision_goldens.py --oracle .v41vision --out tests/data/v41_vision

``--oracle`` is the folder described in ``tools/v41visiongolden/oracle.py`` (DeepSeek's image processor and a
public port of its vision tower, checked by sha256; docs/vision.md says where they come from). For the
``logprobs`` part it also holds the release's ``model.py``, ``engram.py`` and ``kernel_cpu.py`` (as in
docs/v41_reference.md), run as the reference with the tower (:mod:`v41visiongolden.logprobs`). It is
imported at run time; nothing of it is copied. One CPU thread, float32; two runs write identical bytes.
``--parts`` writes a subset (the other files are left as they are).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import PIL
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from v41golden.files import sha256_file, write_json, write_tensors  # noqa: E402
from v41visiongolden import cases  # noqa: E402
from v41visiongolden.oracle import build_tower, encode_span, load_oracle, oracle_args  # noqa: E402

PARTS = ("preprocess", "tower", "logprobs")

COMMAND = "python tools/v41_vision_goldens.py --oracle <ORACLE> --out tests/data/v41_vision"
SOURCES = {
    "image_processor.py": "DeepSeek's inference/image_processor.py of deepseek-ai/DeepSeek-V4.1-Flash at "
    "dba1be0a40aa45a94ad051997016db3960a90277, vendored verbatim under a 5-line header (stored-index file "
    "71070083622, 8,009 characters)",
    "vision.py": "ArqAlice/FreeToken python/freetoken/models/deepseek_v41/vision.py at "
    "1d7508813b894b370c16c5f364787d7deee13ddf (a port of DeepSeek's inference/vision.py; MIT NOTICE)",
    "vision_crosscheck.py": "the tower classes of stored-index file 68920654072 (an independent port that "
    "loads the released vision.*/aligner.* tensors of the same revision)",
}


def provenance(oracle, seeds: dict | None = None, config: dict | None = None) -> dict:
    out = {
        "oracle": {"sha256": dict(sorted(oracle.sha256.items())), "sources": SOURCES},
        "torch": torch.__version__.split("+")[0],
        "pillow": PIL.__version__,
        "command": COMMAND,
    }
    if seeds is not None:
        out["seeds"] = seeds
    if config is not None:
        out["config"] = config
    return out


def token_counts(oracle) -> dict:
    """Per preprocessing config, ``[w, h, best_w, best_h, n_llm_h, n_llm_w, tokens]`` for every size."""
    sizes = cases.EDGE_SIZES + cases.random_sizes(2029, 400)
    ip = oracle.processor
    out = {}
    for name, cfg in cases.PREPROCESS.items():
        rows = []
        for w, h in sizes:
            n_llm_h, n_llm_w, best_h, best_w = ip.plan_image_grid(w, h, oracle_args(cfg))
            rows.append([w, h, best_w, best_h, n_llm_h, n_llm_w, ip.num_image_tokens(n_llm_h, n_llm_w)])
        out[name] = rows
    return {
        "configs": cases.PREPROCESS,
        "columns": ["w", "h", "best_w", "best_h", "n_llm_h", "n_llm_w", "tokens"],
        "sizes": out,
    }


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def pixel_goldens(oracle) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, meta = {}, {}
    for case in cases.PIXEL_CASES:
        name, pre, src, final, mode, enc = case
        tensors[f"source.{name}"] = cases.source(*src[:3], *(src[3:] or (3,))).contiguous()
        image = cases.build_image(case, tensors)
        data = cases.encode(image, enc)
        if mode == "P" or enc != "png":  # conversions / lossy encoders differ between Pillow builds
            tensors[f"bytes.{name}"] = torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()
        patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w = oracle.processor.load_image(
            {"data": data}, oracle_args(cases.PREPROCESS[pre])
        )
        if patches.numel() <= 60_000:
            tensors[f"patches.{name}"] = patches
        meta[name] = {
            "preprocess": pre, "source": list(src), "final": final, "mode": mode, "encoding": enc,
            "grid": [n_vit_h, n_vit_w, n_llm_h, n_llm_w], "patches_shape": list(patches.shape),
            "patches_sha256": _sha(patches),
        }  # fmt: skip
    return tensors, meta


def tower_goldens(oracle, weights: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict]:
    args = oracle_args(cases.TOWER)
    ours = build_tower(oracle.vision, args, weights)
    other = build_tower(oracle.crosscheck, args, weights)
    tensors, meta = {}, {}
    for name, src, final in cases.TOWER_CASES:
        pix = ("tower." + name, "tiny", src, final, "RGB", "png")
        tensors[f"source.{name}"] = cases.source(*src)
        image = cases.build_image(pix, {f"source.tower.{name}": tensors[f"source.{name}"]})
        patches, n_vit_h, n_vit_w, n_llm_h, n_llm_w = oracle.processor.load_image(
            {"data": cases.encode(image, "png")}, args
        )
        types = oracle.processor.image_token_types(n_llm_h, n_llm_w)
        feats, rows, span = encode_span(ours, patches, n_vit_h, n_vit_w, types, oracle.processor)
        check = encode_span(other, patches, n_vit_h, n_vit_w, types, oracle.processor)[2]
        tensors |= {f"{name}.types": types, f"{name}.features": feats, f"{name}.rows": rows,
                    f"{name}.span": span}  # fmt: skip
        meta[name] = {"final": final, "grid": [n_vit_h, n_vit_w, n_llm_h, n_llm_w], "source": list(src),
                      "patches_sha256": _sha(patches),
                      "crosscheck_max_abs_diff": float((check - span).abs().max())}  # fmt: skip
    return tensors, meta


def write_manifest(oracle, out: Path) -> None:
    files = sorted(p for p in out.rglob("*") if p.is_file() and p.name != "manifest.json")
    entries = {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256_file(p)} for p in files}
    write_json(out / "manifest.json", {"provenance": provenance(oracle), "files": entries})


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--oracle", type=Path, required=True, help="folder with image_processor.py, vision.py, ..."
    )
    ap.add_argument("--out", type=Path, default=Path("tests/data/v41_vision"))
    ap.add_argument("--allow-other-oracle", action="store_true", help="accept files with another sha256")
    ap.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)
    oracle = load_oracle(args.oracle, args.allow_other_oracle)
    out = args.out
    if "preprocess" in args.parts:
        write_json(out / "token_counts.json", {"provenance": provenance(oracle), **token_counts(oracle)})
        tensors, meta = pixel_goldens(oracle)
        write_tensors(out / "pixels.safetensors", tensors, provenance(oracle))
        write_json(out / "pixels.json", {"provenance": provenance(oracle), "cases": meta})
    if "tower" in args.parts:
        write_tower(oracle, out)
    if "logprobs" in args.parts:
        write_logprobs(oracle, args, out / "logprobs")
    write_manifest(oracle, out)
    for p in sorted(out.rglob("*")):
        if p.is_file():
            print(p, p.stat().st_size)


def write_logprobs(oracle, args, out: Path) -> None:
    from v41golden.reference import load_reference
    from v41visiongolden import logprobs

    ref = load_reference(args.oracle, args.allow_other_oracle)
    prov = provenance(oracle) | {"reference_sha256": dict(sorted(ref.sha256.items()))}
    logprobs.write(ref, out, write_tensors, write_json, prov)


def write_tower(oracle, out: Path) -> None:
    weights = cases.tower_weights(cases.TOWER, cases.TOWER_SEED)
    ckpt = {k: v for k, v in cases.TOWER.items()} | {"image_token_id": 129264}
    write_json(out / "tower" / "config.json", ckpt)
    write_tensors(
        out / "tower" / "model.safetensors", weights, provenance(oracle, {"weights": cases.TOWER_SEED})
    )
    tensors, meta = tower_goldens(oracle, weights)
    write_tensors(out / "tower.safetensors", tensors, provenance(oracle, config=cases.TOWER))
    write_json(out / "tower.json", {"provenance": provenance(oracle, config=cases.TOWER), "cases": meta})


if __name__ == "__main__":
    main()
