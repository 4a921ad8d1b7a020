"""Speculative decoding seam: the :class:`Proposer` contract, its resolution from ``speculative_config``,
and the acceptance counters. Proposers come from plugins (``deepinfer_register_proposers``)."""

from deepinfer_core.spec_decode.proposer import Proposer, build_proposer
from deepinfer_core.spec_decode.stats import SpecStats

__all__ = ["Proposer", "SpecStats", "build_proposer"]
