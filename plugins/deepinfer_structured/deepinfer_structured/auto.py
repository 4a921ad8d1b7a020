"""``structured_outputs_backend="auto"``: xgrammar first; llguidance for constraints xgrammar rejects
(including schemas with keywords xgrammar would silently ignore). llguidance is built on first need."""

from __future__ import annotations

from collections import defaultdict

from deepinfer_core.plugin_api import CompiledGrammar, GrammarBackend, GrammarMatcher, StructuredConstraint
from deepinfer_structured.xgrammar_backend import XGrammarBackend


class AutoBackend(GrammarBackend):
    name = "auto"

    def __init__(self, tokenizer, vocab_size=None, *, stop_token_ids=None, cache=None):
        super().__init__(tokenizer, vocab_size, stop_token_ids=stop_token_ids, cache=cache)
        self._backends: dict[str, GrammarBackend] = {
            "xgrammar": XGrammarBackend(self.vocab, cache=self.cache)
        }

    def _llguidance(self) -> GrammarBackend:
        if "llguidance" not in self._backends:
            from deepinfer_structured.llguidance_backend import LLGuidanceBackend

            self._backends["llguidance"] = LLGuidanceBackend(self.vocab, cache=self.cache)
        return self._backends["llguidance"]

    def _compile(self, c: StructuredConstraint) -> CompiledGrammar:
        try:
            return self._backends["xgrammar"].compile(c)
        except ValueError as xgr_error:
            try:
                fallback = self._llguidance()
            except ImportError as e:
                raise ValueError(f"{xgr_error} (auto cannot fall back: {e})") from None
            try:
                return fallback.compile(c)
            except ValueError as llg_error:
                raise ValueError(
                    f"no backend accepts this constraint. xgrammar: {xgr_error}. llguidance: {llg_error}"
                ) from None

    def matcher(self, grammar: CompiledGrammar) -> GrammarMatcher:
        return self._backends[grammar.backend].matcher(grammar)

    def fill_bitmasks(self, matchers, bitmask, rows) -> None:
        groups: dict[str, tuple[list, list]] = defaultdict(lambda: ([], []))
        for m, r in zip(matchers, rows):
            groups[m.backend_name][0].append(m)
            groups[m.backend_name][1].append(r)
        for name, (ms, rs) in groups.items():
            self._backends[name].fill_bitmasks(ms, bitmask, rs)
