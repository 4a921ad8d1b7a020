"""Speculative decoding seam: the :class:`Proposer` contract, its resolution from ``speculative_config``,
and the acceptance counters. Proposers come from plugins (``deepinfer_register_proposers``)."""

from deepinfer_core.engine.forward_batch import ForwardBatch
from deepinfer_core.engine.scheduler import SchedulerOutput
from deepinfer_core.engine.sequence import SeqStatus, Sequence
from deepinfer_core.spec_decode.proposer import Proposer, build_proposer
from deepinfer_core.spec_decode.stats import SpecStats

# The engine types a proposer sees are part of the plugin API through this module, so a proposer plugin
# never imports engine internals directly (and the engine can move them without breaking plugins).
__all__ = [
    "ForwardBatch",
    "Proposer",
    "SchedulerOutput",
    "SeqStatus",
    "Sequence",
    "SpecStats",
    "build_proposer",
]
