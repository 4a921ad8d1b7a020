"""The core's own plugin: the reference platform and the DeepSeek-V4 and V4.1 architectures.

Registered directly (not through an entry point) so the core works with ``DEEPINFER_PLUGINS=""``.
"""

from __future__ import annotations

from deepinfer_core.platforms.reference import ReferencePlatform
from deepinfer_core.plugins.markers import hookimpl
from deepinfer_core.version import PLUGIN_API_VERSION

DEEPINFER_PLUGIN_API = PLUGIN_API_VERSION


@hookimpl
def deepinfer_register_platforms(register):
    register(ReferencePlatform())


@hookimpl
def deepinfer_register_models(register):
    register("DeepseekV4ForCausalLM", "deepinfer_core.models.deepseek_v4:DeepseekV4ForCausalLM")
    register("DeepseekV41ForCausalLM", "deepinfer_core.models.deepseek_v41:DeepseekV41ForCausalLM")
