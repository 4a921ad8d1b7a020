"""Speculative decoding seam: the :class:`Proposer` contract and the :class:`ProposerContext` a proposer gets
(contract 2.0), its resolution from ``speculative_config``, verification and the acceptance counters.
Proposers come from plugins (``deepinfer_register_proposers``)."""

from deepinfer_core.spec_decode.context import Draft, DraftFn, DraftSequence, ProposerContext, VerifiedRows
from deepinfer_core.spec_decode.proposer import Proposer, build_proposer
from deepinfer_core.spec_decode.stats import SpecStats

__all__ = [
    "Draft",
    "DraftFn",
    "DraftSequence",
    "Proposer",
    "ProposerContext",
    "SpecStats",
    "VerifiedRows",
    "build_proposer",
]
