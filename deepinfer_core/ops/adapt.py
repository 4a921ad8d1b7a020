"""Adapt an ops object, once, when the backends are built, to the call shape the model uses today.

The contract grew keyword arguments after some implementations were written (``kv_format`` of
:meth:`~deepinfer_core.ops.attention.AttentionOps.sparse_attention` and ``compress_into``, for the FP8 KV
cache; ``cmp_format`` of ``sparse_attention`` and ``key_format`` of ``indexer_topk``, for V4.1's packed cache).
The model always passes them; an implementation whose method does not take one gets, here and only here, a
wrapper that leaves the keyword out while it is ``None`` (the only value such a platform is given, as it does
not list ``"fp8"`` in ``kv_cache_dtypes`` nor declare ``packed_kv``). Model code never asks which version an
op was written for.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

#: keyword arguments the attention contract added after its first version, by method
ADDED_ATTENTION_KEYWORDS = {
    "sparse_attention": ("kv_format", "cmp_format"),
    "compress_into": ("kv_format",),
    "indexer_topk": ("key_format",),
}


def accepts(method: Callable[..., Any], keyword: str) -> bool:
    """Does ``method`` take ``keyword`` (by name, or through ``**kwargs``)?"""
    try:
        params = inspect.signature(method, follow_wrapped=False).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: assume the current contract
        return True
    return any(p.name == keyword or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def _without(method: Callable[..., Any], keywords: tuple[str, ...]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        for keyword in keywords:
            if kwargs.pop(keyword, None) is not None:
                raise TypeError(
                    f"{method.__qualname__} takes no {keyword!r}; its platform cannot run this configuration"
                )
        return method(*args, **kwargs)

    return call


def adapt_attention(ops: object) -> None:
    """Wrap, on ``ops`` itself, each method that lacks keywords of :data:`ADDED_ATTENTION_KEYWORDS`."""
    for name, keywords in ADDED_ATTENTION_KEYWORDS.items():
        method = getattr(ops, name, None)
        missing = tuple(k for k in keywords if method is not None and not accepts(method, k))
        if missing:
            setattr(ops, name, _without(method, missing))
