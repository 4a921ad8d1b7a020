"""Hook implementations of the ``structured`` plugin (entry point ``structured``).

Backends are registered as ``"module:attr"`` strings, so a grammar library is imported only when an
engine first serves a constrained request with that backend.
"""

from __future__ import annotations

from deepinfer_core.plugin_api import hookimpl

DEEPINFER_PLUGIN_API = "2.0"

BACKENDS = {
    "xgrammar": "deepinfer_structured.xgrammar_backend:XGrammarBackend",
    "llguidance": "deepinfer_structured.llguidance_backend:LLGuidanceBackend",
    "auto": "deepinfer_structured.auto:AutoBackend",
}


@hookimpl
def deepinfer_register_structured_backends(register):
    for name, target in BACKENDS.items():
        register(name, target)
