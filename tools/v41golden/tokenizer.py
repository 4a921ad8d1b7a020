"""A tiny byte-level BPE tokenizer for the tiny V4.1 checkpoints.

Engram hashes n-grams over *compressed* token ids: every token is decoded alone, normalised (NFKC, NFD,
accents stripped, lower case, whitespace runs to one space, stripped, a lone space kept), and tokens that
normalise alike share an id. The reference builds that map from the checkpoint's tokenizer, so a tiny
checkpoint needs a tokenizer whose vocabulary equals the model's. This one is trained on a fixed text with
case, accent and whitespace variants, so the map merges tokens; single-byte tokens that are not valid UTF-8
on their own take the raw-token path. Ids 0, 1, 2 are BOS, EOS and PAD (``engram_pad_id`` is 2, as in the
published config); the DSpark noise token is the last id.
"""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from .configs import NOISE_TOKEN

SPECIALS = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>")
TRAIN_VOCAB = 383
CORPUS = (
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the Quick brown Fox?\n",
    "Café, cafe, CAFÉ and café au lait; naïve naive NAÏVE; résumé resume Résumé.\n",
    "def quicksort(xs):\n    if len(xs) <= 1:\n        return xs\n\tpivot = xs[0]\n\n\n",
    "  leading spaces,\ttabs\t\tand\r\nnew lines   collapse to one space.   \n",
    "Straße STRASSE strasse; ｆｕｌｌｗｉｄｔｈ fullwidth; ﬁ ligature fi; ² squared 2.\n",
    "日本語のテキスト、中文文本，한국어 텍스트 — emoji 🙂 and symbols ≤ ≥ ≠.\n",
)


def build() -> Tokenizer:
    """Train the tokenizer (deterministic: same corpus and settings, same vocabulary and merges)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TRAIN_VOCAB,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(CORPUS) * 4, trainer=trainer)
    tok.add_special_tokens([NOISE_TOKEN])
    return tok


def as_transformers(tok: Tokenizer):
    """The ``PreTrainedTokenizerFast`` the reference's ``build_compressed_token_map`` expects."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIALS[0], eos_token=SPECIALS[1], pad_token=SPECIALS[2]
    )
