"""The built-in demo checkpoint: what ``LLM()`` / ``deepinfer generate`` use when no model is given.

``deepinfer_core/demo_model/`` is a small DeepSeek-V4-architecture model trained on the CPython standard
library by ``tools/train_demo.py`` (recipe, data split and figures in its ``training.json`` and in
``docs/models.md``). Its FP8 variant is made on demand by the project's own quantization tool
(``LLM(quantization="fp8")``, ``deepinfer generate --quantization fp8``), not shipped. This module also holds
the tokenizer recipe the training tool uses.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

SPECIAL_TOKENS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
DEMO_DIR = Path(__file__).parent / "demo_model"


def default_checkpoint() -> Path:
    """Path of the shipped demo checkpoint (BF16)."""
    if not (DEMO_DIR / "config.json").is_file():
        raise FileNotFoundError(
            f"the demo checkpoint is missing from {DEMO_DIR}; reinstall deepinfer-core or pass model=<checkpoint dir>"
        )
    return DEMO_DIR


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
