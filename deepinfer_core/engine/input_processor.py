"""Prompts and parameters in, validated requests out; every error is raised here, before scheduling.

Errors are :class:`~deepinfer_core.sampling_params.InvalidParameterError` (a ``ValueError``) naming the
parameter, the value and the allowed range.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from deepinfer_core.sampling_params import InvalidParameterError, SamplingParams, check_text, invalid

Prompt = str | dict


@dataclass
class ProcessedPrompt:
    prompt: str | None
    token_ids: list[int]
    params: SamplingParams
    #: the prompt's image spans (the model's, see ``CausalLM.prepare_images``); ``token_ids`` holds them
    images: list = field(default_factory=list)
    #: why its images cannot be used: the request is queued only to fail alone (``finish_reason="error"``)
    error: str | None = None


class InputProcessor:
    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        max_model_len: int,
        structured: Any = None,
        max_n: int = 128,
        prepare_images: Callable[[list[int], list], tuple[list[int], list]] | None = None,
        max_encoder_patches: int | None = None,
    ):
        self.tokenizer = tokenizer
        #: the model's ``prepare_images`` (None: image input refused)
        self.prepare_images = prepare_images
        self.max_encoder_patches = max_encoder_patches
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.max_n = max_n
        #: the engine's StructuredOutputManager (compiles constraints; None: structured outputs refused)
        self.structured = structured

    def process(
        self,
        prompts: Any,
        params: SamplingParams | list[SamplingParams] | None,
        add_special_tokens: bool = True,
    ) -> list[ProcessedPrompt]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise invalid("prompts", type(prompts).__name__, "must be a prompt or a list of prompts")
        plist = self._params_list(params, len(prompts))
        return [self._one(i, p, sp, add_special_tokens) for i, (p, sp) in enumerate(zip(prompts, plist))]

    def _params_list(self, params: Any, n: int) -> list[SamplingParams]:
        if params is None:
            return [SamplingParams()] * n
        if isinstance(params, SamplingParams):
            return [params] * n
        if not isinstance(params, (list, tuple)) or not all(isinstance(p, SamplingParams) for p in params):
            raise invalid("sampling_params", params, "must be a SamplingParams or a list of them")
        if len(params) != n:
            raise invalid(
                "sampling_params", f"list of {len(params)}", f"must have one entry per prompt ({n} prompts)"
            )
        return list(params)

    def _one(self, i: int, prompt: Any, sp: SamplingParams, add_special: bool) -> ProcessedPrompt:
        text, ids = self._tokens(i, prompt, add_special)
        images = self._images(i, prompt)
        if images:
            self._check_ids(i, ids)
            try:
                return self._with_images(i, text, ids, images, sp)
            except ValueError as e:  # the image is bad: this request fails alone
                return ProcessedPrompt(text, ids, sp, error=str(e))
        self._check_ids(i, ids)
        if self.prepare_images is not None:  # an image placeholder without its image fails alone
            try:
                self.prepare_images(ids, [])
            except ValueError as e:
                return ProcessedPrompt(text, ids, sp, error=f"prompts[{i}] is invalid: {e}")
        self._check_params(i, sp, len(ids))
        return ProcessedPrompt(text, ids, sp)

    def _with_images(self, i: int, text: str | None, ids: list[int], images: list, sp: SamplingParams):
        where = f"prompts[{i}].multi_modal_data"
        if self.prepare_images is None:
            raise InvalidParameterError(f"{where} is invalid: this engine takes no images")
        try:
            expanded, spans = self.prepare_images(ids, images)
        except ValueError as e:
            raise InvalidParameterError(f"{where} is invalid: {e}") from None
        budget = self.max_encoder_patches
        for k, span in enumerate(spans):
            patches = span.image.patches.shape[0]
            if budget is not None and patches > budget:
                raise invalid(
                    f"{where} image {k}", f"{patches} ViT patches", f"must fit max_encoder_patches={budget}"
                )
        n = sum(s.end - s.start for s in spans)
        if len(expanded) >= self.max_model_len:
            raise invalid(
                f"prompts[{i}] length",
                len(expanded),
                f"must be < max_model_len={self.max_model_len}; its {len(spans)} image(s) take {n} tokens "
                f"(text: {len(expanded) - n})",
            )
        self._check_params(i, sp, len(expanded))
        return ProcessedPrompt(text, expanded, sp, spans)

    def _images(self, i: int, prompt: Any) -> list:
        """``prompt["multi_modal_data"]["image"]``: one image (``PIL.Image`` or encoded bytes) or a list."""
        mm = prompt.get("multi_modal_data") if isinstance(prompt, dict) else None
        if mm is None:
            return []
        if not isinstance(mm, dict) or set(mm) - {"image"}:
            raise invalid(
                f"prompts[{i}].multi_modal_data", mm, 'must be {"image": image or [images]} (images only)'
            )
        images = mm.get("image")
        if images is None:
            return []
        return list(images) if isinstance(images, (list, tuple)) else [images]

    def _tokens(self, i: int, prompt: Any, add_special: bool) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            ids = prompt["prompt_token_ids"]
            if not isinstance(ids, (list, tuple)):
                raise invalid(f"prompts[{i}].prompt_token_ids", ids, "must be a list of token ids")
            return prompt.get("prompt"), list(ids)
        text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
        if not isinstance(text, str):
            raise invalid(
                f"prompts[{i}]", prompt, 'must be a string, {"prompt": str} or {"prompt_token_ids": [...]}'
            )
        if not text:
            raise invalid(f"prompts[{i}]", text, "the prompt must not be empty")
        check_text(f"prompts[{i}]", text)
        if self.tokenizer is None:
            raise InvalidParameterError(
                f"prompts[{i}]={text[:40]!r} is invalid: this model has no tokenizer (checkpoint without tokenizer "
                'files, or skip_tokenizer_init=True); pass {"prompt_token_ids": [...]} instead'
            )
        return text, list(self.tokenizer.encode(text, add_special_tokens=add_special))

    def _check_ids(self, i: int, ids: list[int]) -> None:
        if not ids:
            raise invalid(f"prompts[{i}].prompt_token_ids", ids, "the prompt must not be empty")
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise invalid(
                    f"prompts[{i}].prompt_token_ids", t, f"token ids must be ints in [0, {self.vocab_size})"
                )
        if len(ids) >= self.max_model_len:
            raise invalid(
                f"prompts[{i}] length",
                len(ids),
                f"must be < max_model_len={self.max_model_len} (room for one token)",
            )

    def _check_params(self, i: int, sp: SamplingParams, n: int) -> None:
        if sp.n > self.max_n:
            raise invalid("n", sp.n, f"must be <= max_n={self.max_n} (an engine setting)")
        room = self.max_model_len - n
        if sp.max_tokens is not None and sp.max_tokens > room:
            raise invalid(
                "max_tokens",
                sp.max_tokens,
                f"prompt {i} has {n} tokens, so prompt + max_tokens must be <= max_model_len={self.max_model_len}: max_tokens <= {room}",
            )
        if sp.min_tokens > room:
            raise invalid(
                "min_tokens",
                sp.min_tokens,
                f"must be <= {room} (max_model_len - prompt length) for prompt {i}",
            )
        v = self.vocab_size
        for t in sp.stop_token_ids:
            if t >= v:
                raise invalid("stop_token_ids", t, f"token ids must be in [0, {v})")
        for t in sp.logit_bias or {}:
            if t >= v:
                raise invalid("logit_bias", t, f"keys must be token ids in [0, {v})")
        if sp.stop and self.tokenizer is None:
            raise invalid(
                "stop", sp.stop, "stop strings need a tokenizer; this model has none (use stop_token_ids)"
            )
        if sp.structured_outputs is not None:
            self._check_structured(sp)

    def _check_structured(self, sp: SamplingParams) -> None:
        so = sp.structured_outputs
        if self.structured is None:
            raise invalid(
                "structured_outputs", so.kind, "structured outputs need the deepinfer-structured plugin"
            )
        try:
            self.structured.compile(so)  # cached: compiling again when the request is added is free
        except ValueError as e:
            raise InvalidParameterError(f"structured_outputs={so.kind!r} is invalid: {e}") from None
