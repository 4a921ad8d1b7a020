"""Integrity of the committed DeepSeek-V4.1 oracle data in ``tests/data/v41`` (written by ``tools/v41_goldens.py``).

These tests need neither DeepSeek's reference code nor the tool: they check that the files are whole (sizes and
sha256 from ``manifest.json``), that every golden records the release's reference sha256, that each tiny
checkpoint is in the published layout and its index resolves, and that the goldens are shaped and consistent
as docs/v41_reference.md describes. The last test regenerates part of the data and compares bytes; it runs only
where ``DEEPINFER_V41_REFERENCE`` names the folder holding the reference (see the doc).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "tests" / "data" / "v41"
RELEASE_REVISION = "dba1be0a40aa45a94ad051997016db3960a90277"
RELEASE_SHA256 = {  # /work/shared/v41/README.md
    "model.py": "ef19ed51386a9f3ce54a3fd6316166e0f9d8cef727f664ecc630e1faad65bdc5",
    "engram.py": "8038b08fa69c1a787e5b4f84d051d637c02affb6b3c913b02fba1427b90ab3f7",
}
#: the modes every config's goldens hold; ``kvq_only`` (tools/v41golden/patches.py) was added later and only the
#: configs regenerated since hold it (each ``goldens.json`` lists its own modes)
MODES = ("exact", "kvq_off", "kvq_on")
ALL_MODES = (*MODES, "kvq_only")
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP8_NAMES = re.compile(
    r"(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|indexer\.wq_b|shared_experts\.w[123]|engram\.wkv|main_proj)\.weight$"
)
FP4_NAMES = re.compile(r"ffn\.experts\.\d+\.w[123]\.weight$")
F32_NAMES = re.compile(r"(attn_sink|gate\.bias|hc_(attn|ffn)_(fn|base|scale))$")


def manifest() -> dict:
    return json.loads((DATA / "manifest.json").read_text())


CONFIGS = sorted(manifest()["configs"]) if (DATA / "manifest.json").is_file() else []


def provenance_of(path: Path) -> dict:
    with safe_open(str(path), "pt") as f:
        return json.loads(f.metadata()["provenance"])


def inference_config(name: str) -> dict:
    return json.loads((DATA / name / "checkpoint" / "inference" / "config.json").read_text())


def goldens_json(name: str) -> dict:
    return json.loads((DATA / name / "goldens.json").read_text())


def modes_of(name: str) -> list[str]:
    """The numerics modes ``name``'s goldens were written in: the three base modes and possibly ``kvq_only``."""
    modes = list(goldens_json(name)["modes"])
    assert set(MODES) <= set(modes) <= set(ALL_MODES), (name, modes)
    return modes


def test_manifest_lists_every_file_with_its_size_and_sha256():
    files = manifest()["files"]
    on_disk = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "manifest.json"}
    assert set(files) == on_disk
    for rel, entry in files.items():
        data = (DATA / rel).read_bytes()
        assert len(data) == entry["bytes"], rel
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], rel
    assert sum(e["bytes"] for e in files.values()) < 5_000_000


def test_every_golden_records_the_release_reference():
    goldens = [p for p in DATA.rglob("*.safetensors") if "checkpoint" not in p.parts]
    records = [provenance_of(p) for p in goldens] + [goldens_json(c)["provenance"] for c in CONFIGS]
    records.append(manifest()["provenance"])
    assert len(goldens) == 1 + 3 * len(CONFIGS)  # quantisers, then prompts, dspark and engram per config
    for prov in records:
        assert prov["reference"]["revision"] == RELEASE_REVISION
        for file, sha in RELEASE_SHA256.items():
            assert prov["reference"]["sha256"][file] == sha
        assert prov["command"].startswith("python tools/v41_goldens.py --reference ")


@pytest.mark.parametrize("name", CONFIGS)
def test_checkpoint_index_resolves_to_its_shards(name):
    ckpt = DATA / name / "checkpoint"
    index = json.loads((ckpt / "model.safetensors.index.json").read_text())
    by_shard: dict[str, set[str]] = {}
    for key, shard in index["weight_map"].items():
        by_shard.setdefault(shard, set()).add(key)
    total = 0
    for shard, keys in by_shard.items():
        with safe_open(str(ckpt / shard), "pt") as f:
            assert set(f.keys()) == keys, shard
            total += sum(f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in keys)
    assert len(by_shard) == 2 and total == index["metadata"]["total_size"]
    assert not any(k.startswith("model.") for k in index["weight_map"])


def _expected_dtype(key: str) -> str:
    if key.endswith(".scale"):
        return "F8_E8M0"
    if FP4_NAMES.search(key):
        return "I8"
    if FP8_NAMES.search(key) or key.endswith("engram.embed.weight"):
        return "F8_E4M3"
    return "F32" if F32_NAMES.search(key) else "BF16"


def _check_scale(key: str, shape: list[int], scale: list[int], rows: dict[str, int]) -> None:
    if FP4_NAMES.search(key):
        assert scale == [shape[0], shape[1] * 2 // 32], key
    elif key.endswith("engram.embed.weight"):
        assert scale == [shape[0], shape[1] // 32] and shape[0] == rows[key], key
    else:
        assert scale == [math.ceil(shape[0] / 32), math.ceil(shape[1] / 32)], key


@pytest.mark.parametrize("name", CONFIGS)
def test_checkpoint_tensors_are_in_the_published_formats(name):
    args = inference_config(name)
    ckpt = DATA / name / "checkpoint"
    rows = {
        f"layers.{i}.engram.embed.weight": n
        for i, n in zip(args.get("engram_layer_ids", []), args.get("engram_num_embeddings", []))
    }
    info = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            info.update({k: (f.get_slice(k).get_dtype(), f.get_slice(k).get_shape()) for k in f.keys()})
    for key, (dtype, shape) in info.items():
        assert dtype == _expected_dtype(key), (key, dtype)
        if key.endswith(".weight") and dtype in ("I8", "F8_E4M3"):
            _check_scale(key, shape, info[key[: -len(".weight")] + ".scale"][1], rows)
    assert info["embed.weight"][1] == [args["vocab_size"], args["dim"]]
    assert not any(
        k.startswith("mtp.") and (".embed." in k or ".head." in k) and "markov" not in k for k in info
    )
    for k in range(args.get("n_mtp_layers", 0)):
        assert f"mtp.{k}.attn.wq_a.weight" in info


@pytest.mark.parametrize("name", CONFIGS)
def test_root_config_nests_the_same_model_as_inference_config(name):
    root = json.loads((DATA / name / "checkpoint" / "config.json").read_text())
    args, text = inference_config(name), root["text_config"]
    assert root["model_type"] == "deepseek_v41" and root["architectures"] == ["DeepseekV41ForCausalLM"]
    q = root["quantization_config"]
    assert q["weight_block_size"] == [32, 32] and q["scale_fmt"] == "ue8m0" and q["expert_dtype"] == "fp4"
    pairs = {
        "hidden_size": "dim",
        "num_hidden_layers": "n_layers",
        "num_nextn_predict_layers": "n_mtp_layers",
        "sliding_window": "window_size",
        "compress_ratios": "compress_ratios",
        "index_topk": "index_topk",
        "kv_source_layers": "kv_source_layers",
        "candidate_source_layer": "candidate_source_layer",
    }
    for hf, ds in pairs.items():
        assert text[hf] == args[ds], hf
    assert len(args["compress_ratios"]) == args["n_layers"] + args["n_mtp_layers"]
    assert args["index_n_heads"] >= 16


def _prompt_checks(g: dict, i: int, mode: str, greedy: int) -> None:
    ids = g[f"prompt.{i}.ids"]
    n = len(ids)
    lp, top_ids, top_lp = g[f"{mode}.{i}.logprob"], g[f"{mode}.{i}.topk_ids"], g[f"{mode}.{i}.topk_logprobs"]
    assert ids.dtype == torch.int64 and ids[0] == 0
    assert lp.shape == (n - 1,) and top_ids.shape == top_lp.shape == (n, 4) and top_ids.dtype == torch.int32
    assert torch.isfinite(lp).all() and (lp <= 0).all() and (lp <= top_lp[:-1, 0] + 1e-6).all()
    assert (top_lp[:, :-1] >= top_lp[:, 1:]).all() and (top_lp.exp().sum(-1) <= 1 + 1e-5).all()
    margins = g[f"{mode}.{i}.margins"]
    assert margins.shape == (n, 3) and not margins.isnan().any() and (margins >= 0).all()
    gids, gap = g[f"{mode}.{i}.greedy_ids"], g[f"{mode}.{i}.greedy_top2_gap"]
    assert gids.shape == gap.shape == (greedy,) and (gap >= 0).all()
    assert g[f"{mode}.{i}.greedy_margins"].shape == (greedy, 3)
    clear = gap > 1e-6
    assert torch.equal(gids[clear], g[f"{mode}.{i}.greedy_topk_ids"][clear, 0].long())


@pytest.mark.parametrize("name", CONFIGS)
def test_prompt_goldens_are_shaped_and_consistent(name):
    g = load_file(str(DATA / name / "prompts.safetensors"))
    desc = goldens_json(name)
    lengths = desc["prompt_lengths"]
    assert [len(g[f"prompt.{i}.ids"]) for i in range(len(lengths))] == lengths
    assert min(lengths) == 1 and max(lengths) >= 200
    modes = modes_of(name)
    assert {k.split(".")[0] for k in g if not k.startswith("prompt.")} == set(modes)
    for mode in modes:
        for i in range(len(lengths)):
            _prompt_checks(g, i, mode, desc["spec"]["greedy_tokens"])


@pytest.mark.parametrize("name", CONFIGS)
def test_dspark_goldens_chain_their_steps(name):
    args, desc = inference_config(name), goldens_json(name)
    g = load_file(str(DATA / name / "dspark.safetensors"))
    steps, block = desc["spec"]["dspark_steps"], args["dspark_block_size"]
    modes = modes_of(name)
    assert {k.split(".")[0] for k in g if not k.startswith("context.")} == set(modes)
    for mode in modes:
        for c in range(len(desc["dspark_context_lengths"])):
            p = f"{mode}.{c}."
            assert g[p + "draft_ids"].shape == g[p + "confidence"].shape == (steps, block)
            assert g[p + "draft_topk_ids"].shape == (steps, block, 8)
            assert torch.equal(g[p + "fed_ids"][1:], g[p + "draft_input_ids"][:-1])
            clear = g[p + "draft_top2_gap"] > 1e-6
            assert torch.equal(g[p + "draft_ids"][clear], g[p + "draft_topk_ids"][..., 0][clear].long())
            assert torch.isfinite(g[p + "confidence"]).all() and (g[p + "draft_logprob"] <= 0).all()


def _bucket_primes(n_layers: int, max_ngram: int, heads: int, vocab: int) -> list[list[int]]:
    """The documented rule: next unused prime above ``vocab - 1``, restarting for every n-gram size."""
    seen, out = set(), []
    for _ in range(n_layers):
        flat = []
        for _ in range(max_ngram - 1):
            cur = vocab - 1
            for _ in range(heads):
                cur += 1
                while any(cur % f == 0 for f in range(2, int(cur**0.5) + 1)) or cur in seen:
                    cur += 1
                seen.add(cur)
                flat.append(cur)
        out.append(flat)
    return out


@pytest.mark.parametrize("name", CONFIGS)
def test_engram_hashes_lie_in_their_buckets(name):
    args = inference_config(name)
    g = load_file(str(DATA / name / "engram.safetensors"))
    token_map = g["token_map"]
    assert (
        token_map.shape == (args["vocab_size"],)
        and int(token_map.max()) + 1 == args["engram_compressed_vocab_size"]
    )
    primes = _bucket_primes(
        len(args["engram_layer_ids"]),
        args["engram_max_ngram_size"],
        args["engram_n_heads"],
        args["engram_vocab_size"],
    )
    assert [sum(p) for p in primes] == args["engram_num_embeddings"]
    firsts = []
    for key in sorted(k for k in g if k.startswith("hash.")):
        h = g[key]
        for layer, flat in enumerate(primes):
            lo = torch.tensor([sum(flat[:j]) for j in range(len(flat))])
            assert ((h[:, layer] >= lo) & (h[:, layer] < lo + torch.tensor(flat))).all(), key
        firsts.append(h[0])
    assert all(torch.equal(f, firsts[0]) for f in firsts)  # every prompt starts with BOS and no history


def _unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    codes = torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2).long()
    return torch.where(codes >= 8, -E2M1[codes % 8], E2M1[codes % 8])


def test_quantiser_goldens_decode_to_their_round_trips():
    g = load_file(str(DATA / "quantisers.safetensors"))
    x = g["input"]
    fp8 = g["fp8_window.data"].float() * g["fp8_window.scale"].float().repeat_interleave(32, -1)
    assert (
        g["fp8_window.data"].dtype == torch.float8_e4m3fn
        and g["fp8_window.scale"].dtype == torch.float8_e8m0fnu
    )
    assert torch.equal(fp8, g["fp8_window.roundtrip"])
    for name, block, scale_dtype in (
        ("fp4_index", 32, torch.float8_e8m0fnu),
        ("fp4_ckv", 16, torch.float8_e4m3fn),
    ):
        packed, scale = g[f"{name}.packed"], g[f"{name}.scale"]
        assert packed.shape == (x.shape[0], x.shape[1] // 2) and scale.dtype == scale_dtype
        decoded = _unpack_fp4(packed) * scale.float().repeat_interleave(block, -1)
        assert torch.equal(decoded, g[f"{name}.roundtrip"])
    assert ((g["fp4_index.packed"] & 0xF) == 8).any()  # negative zero keeps its sign bit


@pytest.mark.skipif(not os.environ.get("DEEPINFER_V41_REFERENCE"), reason="DEEPINFER_V41_REFERENCE not set")
def test_regenerated_goldens_are_byte_identical(tmp_path):
    """The quantiser goldens and one config's checkpoint, Engram and DSpark files, rewritten from the reference."""
    ref = os.environ["DEEPINFER_V41_REFERENCE"]
    parts = ["quantisers", "checkpoint", "engram", "dspark"]
    cmd = [
        sys.executable,
        str(ROOT / "tools" / "v41_goldens.py"),
        "--reference",
        ref,
        "--out",
        str(tmp_path),
        "--configs",
        "reindex_r2",
        "--parts",
        *parts,
    ]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "manifest.json"]
    assert len(written) > 8
    for p in written:
        rel = p.relative_to(tmp_path)
        assert p.read_bytes() == (DATA / rel).read_bytes(), rel
