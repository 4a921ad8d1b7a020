"""Does the engine's host work at batch 1 grow with ``max_num_seqs``? On the CPU (reference backend, the toy V4
slice), one overlapped ``LLM.generate`` of one sequence (16 prompt tokens, 32 sampled) under cProfile: the number
of Python calls, per ``max_num_seqs`` given. Deterministic, so a load on the machine does not matter.

    TRITON_INTERPRET=1 python benchmarks/gpu/host_calls_by_capacity.py 1 16 256
"""

from __future__ import annotations

import cProfile
import pstats
import sys

sys.argv.append("--smoke")  # slice_model's toy sizes

import torch  # noqa: E402
from slice_model import build_slice  # noqa: E402

from deepinfer_core import SamplingParams  # noqa: E402
from deepinfer_core.config import load_config  # noqa: E402
from deepinfer_core.engine.llm import LLM  # noqa: E402
from deepinfer_core.engine.llm_engine import LLMEngine  # noqa: E402
from deepinfer_core.runtime import build_runtime  # noqa: E402


def calls(max_num_seqs: int) -> int:
    rt = build_runtime(load_config(environ={}, backend="reference"))
    model = build_slice(4, rt.backends, toy=True)
    config = load_config(
        environ={}, backend="reference", max_model_len=200, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=8192, kv_cache_memory_bytes=1 << 28, async_scheduling=True,
    )  # fmt: skip
    llm = LLM.from_engine(LLMEngine(config, model, rt.backends, None))
    g = torch.Generator().manual_seed(0)
    prompt = [{"prompt_token_ids": torch.randint(2, model.vocab_size, (16,), generator=g).tolist()}]
    sp = SamplingParams(temperature=0.6, top_p=0.95, seed=1, max_tokens=32, ignore_eos=True)
    llm.generate(prompt, [sp], use_tqdm=False)  # warm
    prof = cProfile.Profile()
    prof.enable()
    llm.generate(prompt, [sp], use_tqdm=False)
    prof.disable()
    return sum(v[1] for v in pstats.Stats(prof).stats.values())


if __name__ == "__main__":
    for m in [int(a) for a in sys.argv[1:] if a != "--smoke"] or [1, 16]:
        print(f"max_num_seqs {m}: {calls(m)} Python calls in one generate of one sequence")
