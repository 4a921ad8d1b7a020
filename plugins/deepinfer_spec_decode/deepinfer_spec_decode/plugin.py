"""Hook implementations of the ``spec_decode`` plugin (entry point ``spec_decode``): the ``"ngram"``,
``"mtp"`` and ``"dspark"`` proposers. Verification lives in the core sampler (``deepinfer_core.spec_decode.verify``)
on ``backends.sampling.rejection_sample``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deepinfer_core.plugin_api import hookimpl

DEEPINFER_PLUGIN_API = "2.1"  # Draft (drafts with their probabilities), ProposerContext.draw


@hookimpl
def deepinfer_register_proposers(register: Callable[[str, Callable[..., Any]], None]) -> None:
    register("ngram", "deepinfer_spec_decode.ngram:make_ngram")
    register("mtp", "deepinfer_spec_decode.mtp:make_mtp")
    register("dspark", "deepinfer_spec_decode.dspark:make_dspark")
