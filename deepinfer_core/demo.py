"""The built-in demo checkpoints: what ``LLM()`` / ``deepinfer generate`` use when no model is given.

- ``deepinfer_core/demo_model_v41/`` (the default, ``model="demo"`` or ``"demo-v41"``): a small
  DeepSeek-V4.1-architecture model (Engram, CSA2 Full / Reuse / Reindex layers, single-pass mHC, FP8 weights in
  32x32 blocks, FP4 experts) with a trained DSpark draft head, trained on the CPython standard library by
  ``tools/train_demo_v41.py``.
- ``deepinfer_core/demo_model/`` (``model="demo-v4"``): the DeepSeek-V4-architecture demo with one MTP module,
  BF16, trained on the same corpus by ``tools/train_demo.py``. Its FP8 variant is made on demand by the
  project's own quantization tool (``LLM(model="demo-v4", quantization="fp8")``), not shipped.

Recipes, data split and figures are in each folder's ``training.json`` and in ``docs/models.md``. This module
also holds the tokenizer recipe the training tools use (both demos share the tokenizer; V4.1's adds DSpark's
noise token as its last id).
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

SPECIAL_TOKENS = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"]
#: the V4 demo (BF16, one MTP module)
DEMO_DIR = Path(__file__).parent / "demo_model"
#: the V4.1 demo (FP8 / FP4, Engram, DSpark): the default
DEMO_V41_DIR = Path(__file__).parent / "demo_model_v41"
#: names ``model=`` takes for the shipped checkpoints
DEMO_NAMES = {"demo": DEMO_V41_DIR, "demo-v41": DEMO_V41_DIR, "demo-v4": DEMO_DIR}


def demo_checkpoint(name: str = "demo") -> Path:
    """Path of a shipped demo checkpoint by name (:data:`DEMO_NAMES`)."""
    path = DEMO_NAMES[name]
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"the demo checkpoint {name!r} is missing from {path}; reinstall deepinfer-core or pass "
            "model=<checkpoint dir>"
        )
    return path


def default_checkpoint() -> Path:
    """Path of the default demo checkpoint (the V4.1 demo)."""
    return demo_checkpoint("demo")


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
