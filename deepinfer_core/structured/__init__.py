"""Structured outputs, the core side: constraints, the grammar-backend contract, the bitmask layout
and the manager the engine calls. Grammar libraries live in the ``deepinfer_structured`` plugin."""

from deepinfer_core.structured.backend import CompiledGrammar, GrammarBackend, GrammarCache, GrammarMatcher
from deepinfer_core.structured.bitmask import allocate_bitmask, bitmask_width, pack_allowed, unpack_bitmask
from deepinfer_core.structured.constraint import StructuredConstraint, constraint_from_params
from deepinfer_core.structured.manager import (
    StructuredOutputError,
    StructuredOutputManager,
    check_backend_name,
)
from deepinfer_core.structured.vocab import GrammarVocab

__all__ = [
    "CompiledGrammar",
    "GrammarBackend",
    "GrammarCache",
    "GrammarMatcher",
    "GrammarVocab",
    "StructuredConstraint",
    "StructuredOutputError",
    "StructuredOutputManager",
    "allocate_bitmask",
    "bitmask_width",
    "check_backend_name",
    "constraint_from_params",
    "pack_allowed",
    "unpack_bitmask",
]
