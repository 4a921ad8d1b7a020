"""The built-in demo checkpoint: what ``LLM()`` / ``deepinfer generate`` use when no model is given.

Until a trained demo model ships, this is a *random-weight* tiny DeepSeek-V4 checkpoint generated
locally on first use (it prints noise, not Python): a byte-level BPE tokenizer trained on the Python
standard library's top-level modules, and a V4 config with every attention kind, mHC, hash and routed
MoE, saved by ``transformers``. Generation is deterministic, so every machine builds the same files.
"""

from __future__ import annotations

import hashlib
import json
import os
import sysconfig
from pathlib import Path

DEMO_VERSION = "random-v1"

DEMO_CONFIG = dict(
    vocab_size=4096,
    hidden_size=128,
    moe_intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    qk_rope_head_dim=16,
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=32,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    layer_types=[
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    hc_mult=4,
    sliding_window=32,
    index_n_heads=8,
    index_head_dim=32,
    index_topk=8,
    max_position_embeddings=4096,
    num_nextn_predict_layers=0,
    bos_token_id=0,
    eos_token_id=1,
)
SPECIAL_TOKENS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]


def cache_dir() -> Path:
    root = os.environ.get("DEEPINFER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "deepinfer")
    return Path(root)


def stdlib_sources(limit: int | None = None) -> list[Path]:
    """Top-level ``.py`` modules of this interpreter's standard library, sorted (deterministic)."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    return files[:limit] if limit else files


def train_tokenizer(out_dir: Path, vocab_size: int, texts=None) -> None:
    """Byte-level BPE (default corpus: the standard library's top-level modules); writes tokenizer.json
    and tokenizer_config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    if texts is None:
        texts = (p.read_text(encoding="utf-8", errors="replace") for p in stdlib_sources())
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=SPECIAL_TOKENS[0],
        eos_token=SPECIAL_TOKENS[1],
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(out_dir)


def build_random_checkpoint(out_dir: Path, seed: int = 0) -> None:
    """Random weights via transformers' DeepseekV4ForCausalLM, saved with ``save_pretrained``."""
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV4Config(**DEMO_CONFIG)
    model = DeepseekV4ForCausalLM(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for layer in model.model.layers:
            gate = layer.mlp.gate
            if hasattr(gate, "tid2eid"):  # distinct experts per token, as a real hash table has
                perm = torch.stack(
                    [torch.randperm(config.n_routed_experts, generator=g) for _ in range(config.vocab_size)]
                )
                gate.tid2eid.copy_(perm[:, : config.num_experts_per_tok])
    model.save_pretrained(out_dir, safe_serialization=True)


def default_checkpoint() -> Path:
    """Path of the demo checkpoint, building it on first use (a few seconds)."""
    key = hashlib.sha256(json.dumps([DEMO_VERSION, DEMO_CONFIG], sort_keys=True).encode()).hexdigest()[:12]
    out = cache_dir() / f"demo-v4-{DEMO_VERSION}-{key}"
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    train_tokenizer(tmp, DEMO_CONFIG["vocab_size"])
    build_random_checkpoint(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return out
