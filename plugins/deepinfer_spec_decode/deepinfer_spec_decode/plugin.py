"""Hook implementations of the ``spec_decode`` plugin (entry point ``spec_decode``).

The proposers register here as they are built (issue: speculative decoding). Until then the plugin
loads, declares its API version and registers nothing, so ``speculative_config`` fails with
"no proposer registered".
"""

from __future__ import annotations

DEEPINFER_PLUGIN_API = "1.0"
