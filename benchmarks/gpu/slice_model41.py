"""The V4.1-Flash-shaped slice model of ``v41_slice.py``: its config (V4.1-Flash's widths on the demo's layer
pattern), random tensors in DeepSeek's stored formats (each drawn from a generator seeded by its name), the
Engram table as a real file, the model built through the V4.1 loader, and the prompts. DeepSeek's reference
reads the same tensors (``v41_reference_peer.py``)."""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from pathlib import Path

import torch
from bench_common import log, sync

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "deepinfer_core" / "demo_model_v41" / "config.json"

FLASH41 = dict(
    vocab_size=129280,
    hidden_size=5120,
    num_attention_heads=64,
    head_dim=512,
    qk_rope_head_dim=64,
    q_lora_rank=1280,
    o_groups=8,
    o_lora_rank=1024,
    sliding_window=128,
    index_n_heads=32,
    index_head_dim=128,
    index_topk=512,
    candidate_topk_blocks=2048,
    candidate_block_size=8,
    n_routed_experts=384,
    num_experts_per_tok=6,
    moe_intermediate_size=2304,
    engram_head_dim=256,
    engram_n_heads=8,
    engram_max_ngram_size=4,
    engram_compressed_vocab_size=99092,
    engram_vocab_size=174763,  # 24 primes above it: 4.19 M rows, 1.1 GB with scales
    dspark_markov_rank=256,
    dspark_n_routed_experts=128,
    dspark_n_activated_experts=3,
    dspark_noise_token_id=128799,
    max_position_embeddings=65536,
    rope_scaling={
        "type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 65536,
        "beta_fast": 32,
        "beta_slow": 1,
    },
)
#: ``--smoke``: the demo's widths (the demo checkpoint's own config) with a small Engram table
TOY41 = dict(engram_vocab_size=1009, engram_compressed_vocab_size=4997)
ENGRAM_LAYERS = [0]  # the issue asks for one Engram layer (V4.1-Flash has two, at layers 1 and 14)


def slice_config(toy: bool) -> dict:
    """``config.json`` of the slice: the demo's layer pattern, V4.1-Flash's widths (``toy``: the demo's).
    ``V41_SLICE_EXPERTS=N`` routes over N experts instead of 384: the slice then fits an H100's 78 GiB (the
    experts are 6.8 GB a layer at 384); a batch-1 step reads the same six experts a layer either way."""
    from deepinfer_core.models.deepseek_v41.config import EngramConfig
    from deepinfer_core.models.deepseek_v41.engram import bucket_primes

    raw = json.loads(DEMO_CONFIG.read_text())
    text = {**raw["text_config"], **(TOY41 if toy else FLASH41), "engram_layer_ids": ENGRAM_LAYERS}
    if os.environ.get("V41_SLICE_EXPERTS"):
        text["n_routed_experts"] = int(os.environ["V41_SLICE_EXPERTS"])
    e = EngramConfig(
        tuple(ENGRAM_LAYERS), (), text["engram_max_ngram_size"], text["engram_vocab_size"],
        text["engram_n_heads"], text["engram_head_dim"], text["engram_pad_id"],
        text["engram_compressed_vocab_size"],
    )  # fmt: skip
    # a table's rows are the sum of its bucket primes
    text["engram_num_embeddings"] = [sum(p for per_n in layer for p in per_n) for layer in bucket_primes(e)]
    return {**raw, "text_config": text}


class RandomReader41:
    """A checkpoint reader over random tensors in V4.1's stored formats, made on ``device`` on demand; Engram
    tables come from the real file ``path / ENGRAM_FILE`` (memory-mapped by the loader)."""

    ENGRAM_FILE = "engram.safetensors"

    def __init__(self, model, path: Path, device):
        from deepinfer_core.models.deepseek_v41.weights import StoredSlot

        self.path, self.device = Path(path), device
        self.meta: dict[str, tuple[str, tuple[int, ...], str, int]] = {}
        for name, s in model.named_slots():
            if not isinstance(s, StoredSlot):
                continue
            shape, scale = s.expected()
            if s.stored == "fp8":
                self.meta[name] = ("F8_E4M3", shape, "fp8", s.shape[1])
            elif s.stored == "fp4":
                self.meta[name] = ("U8", shape, "fp4", s.shape[1])
            elif s.stored == "rows8":
                self.meta[name] = ("F8_E4M3", shape, "engram", 0)
            else:
                self.meta[name] = ("F32" if s.stored == "f32" else "BF16", shape, s.stored, 0)
            if scale is not None:
                base = name[: -len("weight")]
                self.meta[base + "scale"] = ("F8_E8M0", scale, s.stored + "_scale", s.shape[1])

    def keys(self):
        return list(self.meta)

    def file_of(self, key):
        return self.ENGRAM_FILE if self.meta[key][2].startswith("engram") or key.endswith("engram.embed.scale") \
            else "random.safetensors"  # fmt: skip

    def info(self, key):
        dt, shape, _, _ = self.meta[key]
        return dt, shape

    def close(self):
        pass

    def get(self, key) -> torch.Tensor:
        """Tensor ``key``, from a generator seeded by its name: the same values whoever asks and in whatever
        order (DeepSeek's reference reads them too: ``v41_reference_peer.py``)."""
        dt, shape, kind, fan_in = self.meta[key]
        d = self.device
        g = torch.Generator(d).manual_seed(zlib.crc32(key.encode()))
        if kind == "fp8":  # codes ~ N(0, 1): weights of std ``scale``
            return torch.randn(shape, device=d, generator=g).to(torch.float8_e4m3fn)
        if kind == "fp8_scale":
            return torch.full(shape, 2.0 ** round(math.log2(fan_in**-0.5)), device=d).to(torch.float8_e8m0fnu)
        if kind == "fp4":
            return torch.randint(0, 256, shape, device=d, generator=g, dtype=torch.uint8)
        if kind == "fp4_scale":  # random e2m1 codes have an RMS of 2.9
            e = round(math.log2(fan_in**-0.5 / 2.9))
            return torch.full(shape, 2.0**e, device=d).to(torch.float8_e8m0fnu)
        t = torch.randn(shape, device=d, generator=g)
        leaf = key.rsplit(".", 1)[-1]
        if len(shape) == 1 and ("norm" in key or leaf in ("scale", "bias") or key.endswith("_scale")):
            return torch.ones(shape, device=d) if leaf != "bias" else torch.zeros(shape, device=d)
        if len(shape) >= 2 and dt == "F32":
            return t * 0.05
        if dt == "BF16" and len(shape) >= 2:
            return (t * shape[-1] ** -0.5).to(torch.bfloat16)
        return t * 0.1


def write_engram_file(reader: RandomReader41) -> int:
    """The Engram tables of the slice, random FP8 rows with ue8m0 scales, as a real safetensors file."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(1)
    tensors = {}
    for key, (_, shape, kind, _) in reader.meta.items():
        if kind != "engram":
            continue
        codes = torch.empty(shape, dtype=torch.float8_e4m3fn)
        step = 1 << 18
        for r in range(0, shape[0], step):  # in slabs: float32 of the whole table would be 4x its bytes
            codes[r : r + step] = torch.randn((min(step, shape[0] - r), shape[1]), generator=g).to(
                codes.dtype
            )
        scale_key = key[: -len("weight")] + "scale"
        s_shape = reader.meta[scale_key][1]
        tensors[key] = codes
        tensors[scale_key] = torch.full(s_shape, 2.0**-4).to(torch.float8_e8m0fnu)
    save_file(tensors, str(reader.path / reader.ENGRAM_FILE))
    return sum(t.numel() * t.element_size() for t in tensors.values())


def build_v41_slice(backends, dtype, toy: bool, workdir: Path, engram_in_step: bool | None = None):
    """The slice model with DSpark stages, loaded through the V4.1 loader from :class:`RandomReader41`;
    ``engram_in_step`` as ``EngineConfig.engram_in_step`` (None: where the tables fit)."""
    from deepinfer_core.models.deepseek_v41.engram import (
        EngramHasher,
        bucket_primes,
        multipliers,
    )
    from deepinfer_core.models.deepseek_v41.model import DeepseekV41ForCausalLM, read_config
    from deepinfer_core.models.deepseek_v41.weights import load_weights
    from deepinfer_core.models.weight_checks import LoadOptions

    (workdir / "config.json").write_text(json.dumps(slice_config(toy), indent=1))
    cfg = read_config(workdir)
    model = DeepseekV41ForCausalLM(cfg, backends, dtype, True)
    device = backends.memory.device
    reader = RandomReader41(model, workdir, device)
    table_bytes = write_engram_file(reader)
    e = cfg.engram
    # no tokenizer.json: token ids map onto the compressed vocabulary by residue
    primes = bucket_primes(e)
    sizes = [[p for per_n in layer for p in per_n] for layer in primes]
    offsets = torch.tensor([[sum(s[:i]) for i in range(len(s))] for s in sizes], dtype=torch.int64)
    token_map = torch.arange(cfg.vocab_size, dtype=torch.int64) % e.compressed_vocab_size
    model.hasher = EngramHasher(
        token_map, int(token_map[e.pad_id]), torch.tensor(primes), offsets, multipliers(e)
    ).to(device)
    t0 = time.perf_counter()
    model.loaded = load_weights(model, reader, dtype, device, LoadOptions(check_weights_finite=False))
    sync()
    model.use_kv_cache_dtype("auto")
    t1 = time.perf_counter()
    placed = model.place_engram(engram_in_step)
    log(f"Engram tables read in the step: {placed} (placed in {time.perf_counter() - t1:.1f} s)")
    log(f"slice built in {time.perf_counter() - t0:.1f} s; Engram table file {table_bytes / 1e9:.2f} GB")
    return model


def slice_prompts(n: int, length: int, vocab: int, shared: int = 0) -> list[list[int]]:
    """``n`` random prompts of ``length`` ids (the first ``b`` are the same for any ``n >= b``); ``shared``:
    they all start with the same ``min(shared, length)`` ids."""
    g = torch.Generator().manual_seed(0)
    prefix = torch.randint(3, vocab, (min(shared, length),), generator=g).tolist()
    return [prefix + torch.randint(3, vocab, (length - len(prefix),), generator=g).tolist() for _ in range(n)]
