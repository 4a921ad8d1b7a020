"""A grammar backend in plain Python (``structured_outputs_backend="example_choice"``).

It enforces ``choice`` constraints, and ``regex`` constraints that are alternations of literals
(``yes|no|maybe``, metacharacters escaped with a backslash): the output is exactly one of the
alternatives, then a stop token. Other kinds are refused at submission with a ``ValueError``.

How: each ordinary token of the vocabulary is decoded once, on its own. A matcher holds the text accepted
so far; the tokens allowed next are those whose text extends it to a prefix of an alternative, plus the
stop tokens once it equals one. Tokens that decode to part of a character are never allowed, so the text
is always whole characters, and a vocabulary whose tokens decode independently (byte-level BPE, as
DeepSeek's) gives ``decode(output) == text``. A constraint is compiled only if every character of every
alternative is a token of its own: then no prefix is a dead end.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from deepinfer_core.plugin_api import (
    CompiledGrammar,
    GrammarBackend,
    GrammarMatcher,
    GrammarVocab,
    StructuredConstraint,
    pack_allowed,
)

_META = set(".^$*+?{}[]()|\\")


@dataclass(frozen=True)
class Pieces:
    """The text of every ordinary token (added and stop tokens excluded), and the tokens of each text."""

    text: dict[int, str]
    by_text: dict[str, tuple[int, ...]]


_PIECES: dict[str, Pieces] = {}  # by vocabulary fingerprint: decoding V4's 129k tokens takes ~2 s
_PIECES_LOCK = threading.Lock()


def pieces(vocab: GrammarVocab) -> Pieces:
    with _PIECES_LOCK:
        if vocab.fingerprint not in _PIECES:
            _PIECES[vocab.fingerprint] = _decode_pieces(vocab)
        return _PIECES[vocab.fingerprint]


def _decode_pieces(vocab: GrammarVocab) -> Pieces:
    excluded = vocab.control_token_ids | set(vocab.stop_token_ids)
    ids = sorted(i for i in vocab.known_token_ids if i not in excluded)
    texts = vocab.tokenizer.batch_decode([[i] for i in ids], clean_up_tokenization_spaces=False)
    text = {i: t for i, t in zip(ids, texts) if t and "\ufffd" not in t}
    by_text: dict[str, list[int]] = {}
    for i, t in text.items():
        by_text.setdefault(t, []).append(i)
    return Pieces(text, {t: tuple(v) for t, v in by_text.items()})


def literal_alternatives(pattern: str) -> list[str]:
    """``"yes|no|a\\.b"`` -> ``["yes", "no", "a.b"]``.

    :raises ValueError: the pattern has an unescaped metacharacter, a class escape such as ``\\d``, or an
        empty alternative."""
    out, cur, i = [], [], 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            nxt = pattern[i + 1 : i + 2]
            if not nxt or nxt.isalnum():
                raise ValueError(
                    f"the example_choice backend takes literal regexes only; got the escape \\{nxt}"
                )
            cur.append(nxt)
            i += 2
            continue
        if ch == "|":
            out.append("".join(cur))
            cur = []
        elif ch in _META:
            raise ValueError(
                f"the example_choice backend takes literal regexes only; {ch!r} is a metacharacter"
            )
        else:
            cur.append(ch)
        i += 1
    out.append("".join(cur))
    if "" in out:
        raise ValueError("the example_choice backend needs non-empty alternatives")
    return out


class ChoiceMatcher(GrammarMatcher):
    """One request's text so far, against the alternatives; a stack of earlier texts for rollback."""

    excludes_added_tokens = True  # rows never allow an added token: the pieces leave them out

    def __init__(self, alternatives: tuple[str, ...], pieces: Pieces, vocab: GrammarVocab):
        self.alternatives, self.pieces, self.vocab = alternatives, pieces, vocab
        self.reset()

    def reset(self) -> None:
        self._text, self._earlier, self._done = "", [], False

    def allowed(self) -> set[int]:
        """Token ids allowed next."""
        ids: set[int] = set()
        for alt in self.alternatives:
            if alt.startswith(self._text):
                rest = alt[len(self._text) :]
                for n in range(1, len(rest) + 1):
                    ids.update(self.pieces.by_text.get(rest[:n], ()))
        if self._text in self.alternatives:
            ids.update(self.vocab.stop_token_ids)
        return ids

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        allowed = torch.zeros(self.vocab.vocab_size, dtype=torch.bool)
        ids = sorted(self.allowed())
        if ids:
            allowed[torch.tensor(ids)] = True
        bitmask[row] = pack_allowed(allowed)

    def accept_token(self, token_id: int) -> bool:
        if self._done:
            return False
        if token_id in self.vocab.stop_token_ids:
            if self._text not in self.alternatives:
                return False
            self._earlier.append(self._text)
            self._done = True
            return True
        piece = self.pieces.text.get(token_id)
        text = self._text + (piece or "")
        if piece is None or not any(alt.startswith(text) for alt in self.alternatives):
            return False
        self._earlier.append(self._text)
        self._text = text
        return True

    def rollback(self, num_tokens: int) -> None:
        if not 0 <= num_tokens <= len(self._earlier):
            raise ValueError(f"cannot roll back {num_tokens} tokens: {len(self._earlier)} were accepted")
        if num_tokens:
            self._text = self._earlier[-num_tokens]
            del self._earlier[-num_tokens:]
            self._done = False

    def is_terminated(self) -> bool:
        return self._done


class ChoiceBackend(GrammarBackend):
    name = "example_choice"

    def __init__(
        self,
        tokenizer,
        vocab_size: int | None = None,
        *,
        stop_token_ids: Iterable[int] | None = None,
        cache=None,
    ):
        super().__init__(tokenizer, vocab_size, stop_token_ids=stop_token_ids, cache=cache)
        self.pieces = pieces(self.vocab)

    def _compile(self, constraint: StructuredConstraint) -> CompiledGrammar:
        if constraint.kind == "choice":
            alternatives = constraint.choices()
        elif constraint.kind == "regex":
            alternatives = literal_alternatives(constraint.spec)
        else:
            raise ValueError(
                f"the example_choice backend enforces choice and literal regex constraints; got {constraint.kind}"
            )
        for ch in sorted({ch for alt in alternatives for ch in alt}):
            if ch not in self.pieces.by_text:
                raise ValueError(
                    f"the example_choice backend cannot spell {ch!r}: no token is that character"
                )
        return CompiledGrammar(constraint, self.name, tuple(dict.fromkeys(alternatives)))

    def matcher(self, grammar: CompiledGrammar) -> ChoiceMatcher:
        return ChoiceMatcher(grammar.native, self.pieces, self.vocab)
