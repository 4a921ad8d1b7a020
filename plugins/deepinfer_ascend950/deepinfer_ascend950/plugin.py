"""Hook implementations of the ``ascend950`` plugin (entry point ``ascend950``)."""

from __future__ import annotations

from deepinfer_ascend950.platform import Ascend950Platform
from deepinfer_core import hookimpl

DEEPINFER_PLUGIN_API = "1.0"


@hookimpl
def deepinfer_register_platforms(register):
    register(Ascend950Platform())
