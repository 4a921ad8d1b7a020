"""DeepSeek's published encoders, imported from a folder outside the repository and run on our cases.

The folder (``--reference``) holds ``v4/encoding_dsv4.py`` and ``v41/encoding.py``, each checked by
sha256 (see docs/chat.md for where they come from). They are imported at run time and never copied.

How a case (our API's arguments) becomes a call of DeepSeek's ``encode_messages``: offered tools go on the
leading system message, or on an empty system message put in front when there is none (what our encoder
does too); ``non-think`` is the encoders' ``thinking_mode="chat"``, the others ``"thinking"``; V4's
``think-high``/``think-max`` and V4.1's ``think-high``/``think-max`` pass ``reasoning_effort`` "high"/"max",
V4.1's ``non-think``/``think`` pass the case's ``reasoning_effort``.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

SOURCES = {
    "deepseek_v4": {
        "path": "v4/encoding_dsv4.py",
        "sha256": "8c472456a5ee0baed3e16eb934b1ae0d7d5073aa81767c7898e0bec1d6e69f73",
        "from": "deepseek-ai/DeepSeek-V4-Flash encoding/encoding_dsv4.py, as copied (comments translated) in "
        "supermy/ds4rs@2ecc534c2423f589fd2c3f04b76b46dc41f6f162 encoding/encoding_dsv4.py",
    },
    "deepseek_v41": {
        "path": "v41/encoding.py",
        "sha256": "b4bd8a06f94a06a61564156c7a543d649ed86ecdd72a4dfb94b064e16d9c572f",
        "from": "deepseek-ai/DeepSeek-V4.1-Flash encoding/encoding.py (a revision before tool namespaces), as "
        "vendored in ztxz16/fastllm@fd873f3a74385599d4993c7c00b11d2689f68c22 "
        "tools/fastllm_pytools/encoding_dsv41.py, its 267-character vendoring note removed",
    },
}


@dataclass(frozen=True)
class Oracle:
    encoding: str
    module: ModuleType
    sha256: str

    def render(self, case: dict[str, Any]) -> str:
        mode, effort = self._mode(case)
        return self.module.encode_messages(
            to_reference_messages(case), thinking_mode=mode, reasoning_effort=effort
        )

    def completion(self, assistant: dict[str, Any], thinking_mode: str) -> str:
        """What the model writes for ``assistant`` after the generation prompt: DeepSeek's rendering of
        that turn alone, following a user turn."""
        mode, _ = self._mode({"thinking_mode": thinking_mode})
        context = [{"role": "user", "content": "?"}]
        return self.module.encode_messages([copy.deepcopy(assistant)], thinking_mode=mode, context=context)

    def parse(self, text: str, thinking_mode: str) -> dict[str, Any]:
        mode, _ = self._mode({"thinking_mode": thinking_mode})
        out = self.module.parse_message_from_completion_text(text, thinking_mode=mode)
        return {k: out[k] for k in ("reasoning_content", "content", "tool_calls")}

    def _mode(self, case: dict[str, Any]) -> tuple[str, Any]:
        name = case["thinking_mode"]
        fixed = {"think-high": "high", "think-max": "max"}
        if name in fixed:
            return "thinking", fixed[name]
        return ("chat" if name == "non-think" else "thinking"), case.get("reasoning_effort")


def to_reference_messages(case: dict[str, Any]) -> list[dict[str, Any]]:
    messages = copy.deepcopy(case["messages"])
    tools = case.get("tools")
    if tools:
        if messages[0]["role"] == "system":
            messages[0]["tools"] = copy.deepcopy(tools)
        else:
            messages.insert(0, {"role": "system", "content": "", "tools": copy.deepcopy(tools)})
    return messages


def load_oracle(folder: Path, encoding: str, allow_other: bool = False) -> Oracle:
    path = folder / SOURCES[encoding]["path"]
    if not path.is_file():
        raise SystemExit(f"{path} not found: see docs/chat.md for how to set up the reference folder")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SOURCES[encoding]["sha256"] and not allow_other:
        raise SystemExit(
            f"{path} has sha256 {digest}, expected {SOURCES[encoding]['sha256']} "
            "(pass --allow-other-reference to use it anyway)"
        )
    name = f"_chatgolden_reference_{encoding}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return Oracle(encoding, module, digest)
