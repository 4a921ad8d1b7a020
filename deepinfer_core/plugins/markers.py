"""pluggy markers for the ``deepinfer`` project. Plugins import ``deepinfer_core.hookimpl``."""

import pluggy

PROJECT = "deepinfer"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
