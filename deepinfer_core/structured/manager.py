"""The engine's one entry point for structured outputs.

Life of a constrained request (what the engine calls, and when):

1. submission: :meth:`StructuredOutputManager.validate_and_compile` compiles the constraint (cached)
   and raises ``ValueError`` for a bad one, before the request is scheduled;
2. every step, before sampling: :meth:`fill_bitmask` gives one ``[rows, W]`` bitmask for the batch
   (``None`` when no row is constrained), applied with ``SamplingOps.apply_bitmask``;
3. after sampling: :meth:`accept` with the tokens the request emitted; ``True`` means the grammar
   accepted a stop token and the request finishes with ``finish_reason="stop"``;
4. when the request finishes or is aborted: :meth:`free`.

A matcher that raises while filling its row (a grammar library failing mid-generation) does not take
the batch down: its row is left empty (no token allowed), :meth:`failure` says why, and the sampler
ends that request alone with an error.

With speculative decoding, request ``i`` with ``k_i`` drafts occupies ``1 + k_i`` logits rows (row 0
predicts the first draft, row ``k_i`` the bonus token) and :meth:`fill_bitmask` masks row ``j`` with the state reached by tentatively accepting
drafts ``0..j-1``; the state is rolled back before it returns, and only the tokens the verifier
emits are then passed to :meth:`accept`.
"""

from __future__ import annotations

import concurrent.futures
import inspect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from deepinfer_core.config import ConfigError, EngineConfig
from deepinfer_core.structured.backend import CompiledGrammar, GrammarBackend, GrammarCache
from deepinfer_core.structured.bitmask import allocate_bitmask, token_allowed
from deepinfer_core.structured.constraint import constraint_from_params
from deepinfer_core.structured.request_state import RequestGrammar
from deepinfer_core.structured.vocab import GrammarVocab


def check_backend_name(backend_factories: Mapping[str, Any], name: str) -> None:
    """When the engine is built: a ``structured_outputs_backend`` nothing registered is a :class:`ConfigError`
    that lists the installed grammar backends. The default (``xgrammar``) is looked up on the first
    constrained request instead, so an engine without any grammar plugin still serves the others."""
    if name in backend_factories or name == EngineConfig.model_fields["structured_outputs_backend"].default:
        return
    installed = ", ".join(sorted(backend_factories)) or "none"
    raise ConfigError(
        f"structured_outputs_backend={name!r} is not installed; installed grammar backends: {installed}"
    )


class StructuredOutputError(RuntimeError):
    """A grammar was fed a token its own bitmask forbids: the engine did not apply the mask."""


@dataclass
class _Planned:
    state: RequestGrammar
    base: int  # first logits row of the request
    drafts: list[int]
    advanced: int = 0  # drafts tentatively accepted, undone before fill_bitmask returns


class StructuredOutputManager:
    """Owns the grammar backend (built on first use) and every constrained request's state.

    :param backend_factories: ``registry.structured_backends`` (name -> factory).
    :param backend: the ``structured_outputs_backend`` name (``"xgrammar"``, ``"llguidance"``, ``"auto"``).
    :param tokenizer: the engine's tokenizer; :param vocab_size: the logits width.
    :param stop_token_ids: the tokens that end a request (default: the tokenizer's EOS).
    :param max_spec_bytes: the largest constraint text (schema, regex, grammar, choices) accepted.
    :param compile_timeout_s: how long a compile may take before the request is refused. Compiles run
        on the manager's own worker threads (the grammar libraries release the GIL), so a slow one blocks
        only the caller that submitted it; one that times out keeps its worker until it ends.
    """

    def __init__(
        self,
        backend_factories: Mapping[str, Any],
        backend: str,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int] | None = None,
        *,
        cache: GrammarCache | None = None,
        max_spec_bytes: int = 65536,
        compile_timeout_s: float = 10.0,
    ):
        self.max_spec_bytes = max_spec_bytes
        self.compile_timeout_s = compile_timeout_s
        self._compiler: concurrent.futures.ThreadPoolExecutor | None = None
        self._factories = backend_factories
        self.backend_name = backend
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size
        self._stop_token_ids = None if stop_token_ids is None else list(stop_token_ids)
        self._cache = cache
        self._backend: GrammarBackend | None = None
        self._requests: dict[str, RequestGrammar] = {}
        self._failures: dict[str, str] = {}

    @classmethod
    def from_registry(
        cls,
        registry: Any,
        config: Any,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int] | None = None,
    ) -> StructuredOutputManager:
        return cls(
            registry.structured_backends,
            config.structured_outputs_backend,
            tokenizer,
            vocab_size,
            stop_token_ids,
            max_spec_bytes=config.structured_outputs_max_spec_bytes,
            compile_timeout_s=config.structured_outputs_compile_timeout_s,
        )

    # ------------------------------------------------------------------ backend

    @property
    def backend(self) -> GrammarBackend:
        """The backend, built on the first constrained request so unconstrained engines pay nothing.

        :raises ValueError: the configured backend is not installed or cannot be built."""
        if self._backend is None:
            self._backend = self._build_backend()
        return self._backend

    @property
    def vocab(self) -> GrammarVocab:
        return self.backend.vocab

    def _build_backend(self) -> GrammarBackend:
        name = self.backend_name
        if self._tokenizer is None:
            raise ValueError(
                "structured outputs need the model's tokenizer (the engine was built without one)"
            )
        if name not in self._factories:
            installed = ", ".join(sorted(self._factories)) or "none"
            raise ValueError(
                f"structured_outputs_backend {name!r} is not installed (installed: {installed}); "
                "structured outputs need the deepinfer-structured plugin: pip install deepinfer-structured"
            )
        try:
            factory = self._factories[name]
            backend = _call_factory(
                factory,
                self._tokenizer,
                self._vocab_size,
                stop_token_ids=self._stop_token_ids,
                cache=self._cache,
            )
        except ImportError as e:
            raise ValueError(f"structured_outputs_backend {name!r} cannot be used: {e}") from e
        if not isinstance(backend, GrammarBackend):
            raise TypeError(
                f"structured-output backend {name!r} returned {type(backend).__name__}, not a GrammarBackend"
            )
        return backend

    # ------------------------------------------------------------------ submission

    def compile(self, params: Any) -> CompiledGrammar:
        """Validate and compile ``params`` (cached). :raises ValueError: a bad constraint, one over
        ``max_spec_bytes``, or one whose compile takes longer than ``compile_timeout_s``."""
        constraint = constraint_from_params(params)  # malformed input fails before a backend is built
        size = len(constraint.spec.encode())
        if size > self.max_spec_bytes:
            raise ValueError(
                f"the {constraint.kind} constraint is {size} bytes; the limit is "
                f"structured_outputs_max_spec_bytes={self.max_spec_bytes}"
            )
        backend = self.backend
        if self._compiler is None:
            self._compiler = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="deepinfer-grammar")
        job = self._compiler.submit(backend.compile, constraint)
        try:
            return job.result(timeout=self.compile_timeout_s)
        except concurrent.futures.TimeoutError:
            raise ValueError(
                f"compiling the {constraint.kind} constraint took longer than "
                f"structured_outputs_compile_timeout_s={self.compile_timeout_s:g}; simplify it or raise the limit"
            ) from None

    def validate_and_compile(
        self,
        request_id: str,
        params: Any,
        prompt_token_ids: Sequence[int] | None = None,
        *,
        reasoning: bool | None = None,
    ) -> bool:
        """Compile the request's constraint and start its grammar. Call once per sequence at submission.

        :param params: ``SamplingParams.structured_outputs`` (``None``: nothing to do, returns False).
        :param prompt_token_ids: used to detect an open ``<think>`` block (see ``request_state``).
        :param reasoning: force the reasoning phase on or off instead of detecting it.
        :return: whether the request is constrained.
        :raises ValueError: a bad constraint, or the backend is missing.
        """
        if params is None:
            return False
        if request_id in self._requests:
            raise ValueError(f"request {request_id!r} already has a grammar")
        grammar = self.compile(params)
        if reasoning is None:
            reasoning = self._prompt_opens_reasoning(prompt_token_ids or ())
        self._requests[request_id] = RequestGrammar(
            grammar, self.backend.matcher(grammar), self.vocab, reasoning
        )
        return True

    def _prompt_opens_reasoning(self, prompt: Sequence[int]) -> bool:
        start, end = self.vocab.think_start_id, self.vocab.think_end_id
        if start is None or end is None:
            return False
        for t in reversed(prompt):
            if t == end:
                return False
            if t == start:
                return True
        return False

    # ------------------------------------------------------------------ per step

    def fill_bitmask(
        self, request_ids: Sequence[str | None], draft_ids: Mapping[str, Sequence[int]] | None = None
    ) -> torch.Tensor | None:
        """The bitmask for one step's logits rows, or ``None`` when none of them is constrained.

        Request ``i`` owns ``1 + len(draft_ids[request_ids[i]])`` consecutive rows (1 without drafts), in
        order. Unconstrained requests (and ``None`` entries) get all-ones rows. Rows after a draft the
        grammar forbids copy the forbidding row: the verifier rejects that draft, so they are never used.
        """
        drafts = draft_ids or {}
        plan, rows = [], 0
        for rid in request_ids:
            d = list(drafts.get(rid, ())) if rid is not None else []
            state = self._requests.get(rid) if rid is not None else None
            if state is not None:
                plan.append(_Planned(state, rows, d))
            rows += 1 + len(d)
        if not plan:
            return None
        bitmask = allocate_bitmask(rows, self.vocab.vocab_size)
        try:
            self._fill_with_drafts(plan, bitmask)
        finally:
            for p in plan:
                p.state.rollback(p.advanced)
        return bitmask

    def fill_bitmask_for_drafts(self, request_id: str, draft_ids: Sequence[int]) -> torch.Tensor:
        """``[k + 1, W]`` for one request's drafts (all-ones rows when it is unconstrained)."""
        mask = self.fill_bitmask([request_id], {request_id: draft_ids})
        return allocate_bitmask(len(draft_ids) + 1, self._vocab_size) if mask is None else mask

    def _fill_with_drafts(self, plan: list[_Planned], bitmask: torch.Tensor) -> None:
        alive, depth = plan, 0
        while alive:
            self._fill_rows([(p.state, p.base + depth) for p in alive], bitmask)
            depth += 1
            survivors = []
            for p in alive:
                if depth > len(p.drafts):
                    continue
                prev = bitmask[p.base + depth - 1]
                token = p.drafts[depth - 1]
                if token_allowed(prev, token) and p.state.advance(token):
                    p.advanced += 1
                    survivors.append(p)
                else:
                    bitmask[p.base + depth : p.base + len(p.drafts) + 1] = prev
            alive = survivors

    def _fill_rows(self, jobs: list[tuple[RequestGrammar, int]], bitmask: torch.Tensor) -> None:
        todo = [(s, r) for s, r in jobs if not s.fill_fixed_row(bitmask, r)]
        if not todo:
            return
        rows = [r for _, r in todo]
        try:
            self.backend.fill_bitmasks([s.matcher for s, _ in todo], bitmask, rows)
        except Exception:  # noqa: BLE001 - find the matcher(s) that fail, one by one
            todo = self._fill_one_by_one(todo, bitmask)
        unfiltered = [r for s, r in todo if not s.matcher.excludes_added_tokens]
        if unfiltered:
            self._filter_added_tokens(bitmask, unfiltered)

    def _fill_one_by_one(
        self, jobs: list[tuple[RequestGrammar, int]], bitmask: torch.Tensor
    ) -> list[tuple[RequestGrammar, int]]:
        """Fill each row alone; a matcher that raises gets an empty row and a recorded failure."""
        ok = []
        for state, row in jobs:
            try:
                self.backend.fill_bitmasks([state.matcher], bitmask, [row])
                ok.append((state, row))
            except Exception as exc:  # noqa: BLE001 - one request's grammar failing is its own problem
                bitmask[row] = 0
                key = next(k for k, v in self._requests.items() if v is state)
                self._failures[key] = f"its grammar backend failed: {type(exc).__name__}: {exc}"
        return ok

    def _filter_added_tokens(self, bitmask: torch.Tensor, rows: list[int]) -> None:
        index = torch.tensor(rows)
        grammar_rows = bitmask.index_select(0, index)
        text_only = grammar_rows & self.vocab.text_bitmask
        empty = ~text_only.any(dim=-1)
        if bool(empty.any()):  # a grammar that explicitly needs an added token keeps its own row
            text_only[empty] = grammar_rows[empty]
        bitmask.index_copy_(0, index, text_only)

    # ------------------------------------------------------------------ after sampling

    def accept(self, request_id: str, token_ids: Iterable[int]) -> bool:
        """Advance by the tokens the request emitted this step; True once its grammar has terminated.
        A no-op returning False for an unconstrained request.

        :raises StructuredOutputError: a token the request's bitmask forbade (the mask was not applied)."""
        state = self._requests.get(request_id)
        if state is None:
            return False
        for t in token_ids:
            if state.terminated:
                raise StructuredOutputError(
                    f"request {request_id!r}: token {int(t)} after its grammar terminated; "
                    "the engine must stop a request at the stop token that terminates it"
                )
            if not state.advance(int(t)):
                raise StructuredOutputError(
                    f"request {request_id!r}: token {int(t)} is not allowed by its "
                    f"{state.grammar.constraint.describe()} grammar after {state.num_tokens} tokens; "
                    "the grammar bitmask must be applied to every constrained logits row"
                )
        return state.terminated

    def rollback(self, request_id: str, num_tokens: int) -> None:
        """Undo the last ``num_tokens`` accepted tokens (no-op for an unconstrained request)."""
        state = self._requests.get(request_id)
        if state is not None:
            state.rollback(num_tokens)

    def is_constrained(self, request_id: str) -> bool:
        return request_id in self._requests

    def is_terminated(self, request_id: str) -> bool:
        state = self._requests.get(request_id)
        return state is not None and state.terminated

    def failure(self, request_id: str) -> str | None:
        """Why the request's grammar could not fill its row this step (None: it did not fail)."""
        return self._failures.get(request_id)

    def free(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._failures.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._requests)


def _call_factory(factory: Any, tokenizer: Any, vocab_size: int, **optional: Any) -> Any:
    """The hook documents ``factory(tokenizer, vocab_size)``; the keywords the built-in backends also take
    (``stop_token_ids``, ``cache``) are passed only to factories that accept them."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # some builtins and extension types have no signature
        params = {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    return factory(tokenizer, vocab_size, **{k: v for k, v in optional.items() if takes_any or k in params})
