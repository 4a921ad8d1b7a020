"""DeepSeek-V4: mHC streams, hybrid SWA / CSA / HCA attention, hash and top-k MoE, MTP (architecture
``DeepseekV4ForCausalLM``). See ``docs/models.md`` for supported configs, layouts and formats."""

from deepinfer_core.models.deepseek_v4.checkpoint import CheckpointError
from deepinfer_core.models.deepseek_v4.config import DeepseekV4Config, ModelConfigError
from deepinfer_core.models.deepseek_v4.model import DeepseekV4ForCausalLM

__all__ = ["CheckpointError", "DeepseekV4Config", "DeepseekV4ForCausalLM", "ModelConfigError"]
