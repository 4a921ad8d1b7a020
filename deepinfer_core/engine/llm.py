"""``LLM``: the offline API (vLLM's names). ``LLM(model, **engine_config)`` then ``generate`` or ``chat``.

Several threads may call ``generate`` on one ``LLM`` at once. There is still one step loop: whichever
caller still waits for outputs and finds nobody stepping runs the next step, and hands every output to
the call that submitted its request, so each caller gets exactly its own requests and all of them share
the batches. Everything that touches the engine's state (submitting, stepping, applying aborts) happens
under one condition variable's lock, never concurrently.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from typing import TYPE_CHECKING, Any

from deepinfer_core.config import load_config
from deepinfer_core.engine.factory import build_engine
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.engine.outputs import RequestOutput
from deepinfer_core.sampling_params import SamplingParams

if TYPE_CHECKING:
    from deepinfer_core.chat import ChatEncoding


class LLM:
    """``LLM(model=None, backend="auto", dtype="auto", seed=0, max_model_len=None, max_num_seqs=64,
    max_num_batched_tokens=2048, block_size=None, kv_cache_memory_bytes=None, gpu_memory_utilization=0.9,
    enable_prefix_caching=True, speculative_config=None, ...)``.

    Keyword arguments are :class:`~deepinfer_core.config.EngineConfig` fields, merged over
    ``DEEPINFER_*`` environment variables and an optional ``config_file``; unknown ones raise.
    """

    def __init__(self, model: str | None = None, **kwargs: Any):
        if model is not None:
            kwargs["model"] = model
        self._attach(build_engine(load_config(**kwargs)))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """Wrap an engine built by hand (tests, embedding applications)."""
        llm = cls.__new__(cls)
        llm._attach(engine)
        return llm

    def _attach(self, engine: Any) -> None:
        self.engine = engine
        self._cv = threading.Condition()
        self._stepping = False  # a caller is inside engine.step() (or another state change)
        self._inbox: dict[str, dict[str, RequestOutput]] = {}  # request id -> its caller's outputs
        self._dp_lock = threading.Lock()  # data-parallel generate calls run one at a time

    @property
    def vocab_size(self) -> int:
        return self.engine.model.vocab_size

    @property
    def backend_name(self) -> str:
        return self.engine.backends.platform

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    @functools.cached_property
    def chat_encoding(self) -> ChatEncoding:
        """The chat encoding of the checkpoint, picked by its config.json (``architectures``, then
        ``model_type``): DeepSeek-V4.1's for ``deepseek_v41``, V4's otherwise."""
        from deepinfer_core.chat import encoding_for_config
        from deepinfer_core.engine.loader import checkpoint_path

        path = checkpoint_path(self.engine.config) / "config.json"
        return encoding_for_config(json.loads(path.read_text()))

    def get_stats(self) -> dict[str, Any]:
        return self.engine.get_stats()

    def abort(self, request_id: str) -> None:
        """Abort a running request (e.g. from another thread during ``generate``); its output comes back
        with ``finish_reason="abort"``."""
        self.engine.abort(request_id)

    def generate(
        self,
        prompts: Any,
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        *,
        add_special_tokens: bool = True,
    ) -> list[RequestOutput]:
        """Complete every prompt (a string or ``{"prompt_token_ids": [...]}``); results in input order.
        Everything is validated before anything is scheduled, and a call's requests are queued all or
        none. Safe to call from several threads at once. A request that fails alone comes back with
        ``finish_reason="error"`` and ``RequestOutput.error``; the others complete normally."""
        items = self.engine.inputs.process(prompts, sampling_params, add_special_tokens)
        if self.engine.config.data_parallel_size > 1:
            with self._dp_lock:
                return self.engine.generate(items)
        box: dict[str, RequestOutput] = {}
        with self._exclusive():
            ids = self.engine.add_requests(items)
            self._inbox.update((rid, box) for rid in ids)
        try:
            return self._wait(ids, box, use_tqdm)
        except BaseException:
            for rid in ids:
                self.engine.abort(rid)
            with self._exclusive():
                self._deliver(self.engine.apply_aborts())
            raise
        finally:
            with self._cv:
                for rid in ids:
                    self._inbox.pop(rid, None)

    def _wait(self, ids: list[str], box: dict[str, RequestOutput], use_tqdm: bool) -> list[RequestOutput]:
        """Step the engine (or wait while another caller does) until every one of ``ids`` is in ``box``."""
        bar = _Progress(len(ids)) if use_tqdm else None
        seen = 0
        while True:
            with self._cv:
                while len(box) < len(ids) and self._stepping:
                    self._cv.wait()
                if bar:
                    for out in list(box.values())[seen:]:
                        bar.update(out)
                    seen = len(box)
                if len(box) == len(ids):
                    break
                self._stepping = True
            outs: list[RequestOutput] = []
            try:
                outs = self.engine.step()
            finally:
                self._release(outs)
        if bar:
            bar.close()
        return [box[i] for i in ids]

    def _release(self, outs: list[RequestOutput]) -> None:
        with self._cv:
            self._stepping = False
            self._deliver(outs)
            self._cv.notify_all()

    def _deliver(self, outs: list[RequestOutput]) -> None:
        """Hand each output to the call waiting for it (the caller holds ``self._cv``)."""
        for out in outs:
            box = self._inbox.get(out.request_id)
            if box is not None:
                box[out.request_id] = out

    def _exclusive(self) -> _Exclusive:
        return _Exclusive(self)

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        thinking_mode: str | None = None,
        tools: list[dict] | None = None,
        *,
        reasoning_effort: int | str | None = None,
        special_tokens_in_content: bool = False,
    ) -> list[RequestOutput]:
        """Render one conversation (a list of messages) or several with the checkpoint's DeepSeek chat
        encoding (:attr:`chat_encoding`), then generate. ``thinking_mode`` and, for V4.1,
        ``reasoning_effort`` (or the same keys in ``chat_template_kwargs``) pick the mode.

        Message content is tokenized as plain text: text that spells a control token (``<｜Assistant｜>``,
        ``<｜end▁of▁sentence｜>``, DSML markers) stays text, so content cannot forge turns. Pass
        ``special_tokens_in_content=True`` to let it become control tokens.

        Images (V4.1 with a vision tower): ``{"type": "image_url", "image_url": {"url": "data:...;base64,..."}}``
        parts of user messages; remote URLs and local paths are refused."""
        from deepinfer_core.chat import encode_prompt, render_prompt
        from deepinfer_core.chat.content import image_url_bytes, image_urls

        tokenizer = self.get_tokenizer()
        if tokenizer is None:
            raise ValueError("chat needs the model's tokenizer; this engine has none (skip_tokenizer_init?)")
        kwargs = dict(chat_template_kwargs or {})
        if thinking_mode is not None:
            kwargs["thinking_mode"] = thinking_mode
        if reasoning_effort is not None:
            kwargs["reasoning_effort"] = reasoning_effort
        kwargs.setdefault("encoding", self.chat_encoding)
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conv in convs:
            rendered = render_prompt(conv, tools=tools, **kwargs)
            ids = encode_prompt(rendered, tokenizer, special_tokens_in_content=special_tokens_in_content)
            prompt: dict[str, Any] = {"prompt": rendered.text, "prompt_token_ids": ids}
            images = [image_url_bytes(url, where) for url, where in image_urls(conv)]
            if images:
                prompt["multi_modal_data"] = {"image": images}
            prompts.append(prompt)
        return self.generate(prompts, sampling_params, use_tqdm)


class _Exclusive:
    """``with llm._exclusive():`` waits until no caller is stepping and keeps the others out meanwhile."""

    def __init__(self, llm: LLM):
        self.llm = llm

    def __enter__(self) -> None:
        llm = self.llm
        with llm._cv:
            while llm._stepping:
                llm._cv.wait()
            llm._stepping = True

    def __exit__(self, *exc: object) -> None:
        self.llm._release([])


class _Progress:
    """tqdm bar: requests done, with input and output tokens per second."""

    def __init__(self, total: int):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
        self.t0 = time.perf_counter()
        self.n_in = self.n_out = 0

    def update(self, out: RequestOutput) -> None:
        self.n_in += len(out.prompt_token_ids)
        self.n_out += sum(len(c.token_ids) for c in out.outputs)
        dt = max(time.perf_counter() - self.t0, 1e-9)
        self.bar.set_postfix_str(f"input: {self.n_in / dt:.1f} toks/s, output: {self.n_out / dt:.1f} toks/s")
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()
