"""Hooks are resolved once: generation never calls into pluggy, so a device graph can capture a step."""

from __future__ import annotations

import pluggy

from deepinfer_core import LLM, SamplingParams
from deepinfer_core.runtime import build_registry

from ..models.deepseek_v4.tiny import CSA, HCA, Schedule, build_hf


def test_generate_makes_no_deepinfer_hook_call(tmp_path, monkeypatch):
    build_hf(Schedule("hot", (CSA, HCA)), seed=2).save_pretrained(tmp_path)
    llm = LLM(str(tmp_path), kv_cache_memory_bytes=16 << 20, max_model_len=64)
    original = pluggy.HookCaller.__call__
    calls: list[str] = []

    def spy(self, *args, **kwargs):
        if self.name.startswith("deepinfer_"):
            calls.append(self.name)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pluggy.HookCaller, "__call__", spy)
    reg = build_registry()
    calls.clear()
    reg.pm.hook.deepinfer_dense_ops(platform="reference", config=None)
    assert calls == ["deepinfer_dense_ops"]  # the spy sees deepinfer hook calls
    calls.clear()
    outs = llm.generate(
        [{"prompt_token_ids": [4, 8, 15, 16, 23, 42]}] * 3,
        SamplingParams(max_tokens=4, temperature=0.8, seed=3, ignore_eos=True),
        use_tqdm=False,
    )
    assert all(len(o.outputs[0].token_ids) == 4 for o in outs)
    assert calls == [], f"hooks called during generation: {calls}"
