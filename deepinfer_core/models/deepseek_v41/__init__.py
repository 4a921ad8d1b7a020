"""DeepSeek-V4.1: CSA2 attention (Full / Reindex / Reuse layers, candidate pool), single-pass mHC, Engram,
sqrt-softplus MoE, KV stored as trained (FP8 / FP4) (architecture ``DeepseekV41ForCausalLM``). See
``docs/models.md`` and ``docs/v41_reference.md``."""

from deepinfer_core.models.deepseek_v41.config import DeepseekV41Config
from deepinfer_core.models.deepseek_v41.model import DeepseekV41ForCausalLM

__all__ = ["DeepseekV41Config", "DeepseekV41ForCausalLM"]
