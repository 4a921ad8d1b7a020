"""``LLM``: the offline API (vLLM's names). ``LLM(model, **engine_config)`` then ``generate`` or ``chat``."""

from __future__ import annotations

import time
from typing import Any

from deepinfer_core.config import load_config
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.engine.outputs import RequestOutput
from deepinfer_core.sampling_params import SamplingParams


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
        config = load_config(**kwargs)
        if config.data_parallel_size > 1:
            from deepinfer_core.distributed.dp_engine import DPEngine

            self.engine = DPEngine.from_config(config)  # spawns (or, under torchrun, joins) the DP ranks
        else:
            self.engine = LLMEngine.from_config(config)

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """Wrap an engine built by hand (tests, embedding applications)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        return llm

    @property
    def vocab_size(self) -> int:
        return self.engine.model.vocab_size

    @property
    def backend_name(self) -> str:
        return self.engine.backends.platform

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

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
        Everything is validated before anything is scheduled."""
        items = self.engine.inputs.process(prompts, sampling_params, add_special_tokens)
        if self.engine.config.data_parallel_size > 1:
            return self.engine.generate(items)
        ids = [self.engine.add_request(it) for it in items]
        try:
            return self._run(ids, use_tqdm)
        except BaseException:
            for rid in ids:
                self.engine.abort(rid)
            self.engine.apply_aborts()
            raise

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        wanted = set(ids)
        bar = _Progress(len(ids)) if use_tqdm else None
        while wanted - done.keys():
            for out in self.engine.step():
                if out.request_id in wanted:
                    done[out.request_id] = out
                    if bar:
                        bar.update(out)
        if bar:
            bar.close()
        return [done[i] for i in ids]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        thinking_mode: str | None = None,
        tools: list[dict] | None = None,
    ) -> list[RequestOutput]:
        """Render one conversation (a list of messages) or several with the DeepSeek chat encoding, then
        generate. ``thinking_mode`` (or ``chat_template_kwargs={"thinking_mode": ...}``) picks the mode."""
        from deepinfer_core.chat import render_messages

        kwargs = dict(chat_template_kwargs or {})
        if thinking_mode is not None:
            kwargs["thinking_mode"] = thinking_mode
        convs = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [render_messages(c, tools=tools, **kwargs) for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm, add_special_tokens=False)


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
