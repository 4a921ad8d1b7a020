"""Size every group's block pool from one byte budget, and count the bytes a token costs.

A block of a group costs the sum of :meth:`CacheSpec.page_bytes` over the group's specs, exactly (packed
entries included). Whether a group is *windowed* or *kept* comes from its specs
(:func:`~deepinfer_core.kv.spec.group_windows`). One request of ``max_model_len`` tokens needs, at most:

- a kept group: ``ceil(max_model_len / block_size)`` blocks (kept for the whole context);
- a windowed group: ``ceil((window + chunk) / block_size) + 1`` blocks, ``chunk`` being the largest number
  of tokens one step computes for it (``min(max_num_batched_tokens, max_model_len)``).

A budget below that raises :class:`KVBudgetError`. Above it, the windowed pools grow up to what
``max_num_seqs`` decoding requests plus one full prefill chunk read at once (window blocks are cheap and
beyond that only serve the prefix cache; when the budget cannot reach that, each gets the same share of
the way), and the kept pools take the rest in lock step (every request needs as many blocks of each),
capped at what ``max_num_seqs`` requests of ``max_model_len`` could ever hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from deepinfer_core.kv.spec import CacheSpec, group_windows, required_block_multiple

DEFAULT_MIN_BLOCK_TOKENS = 16


class KVBudgetError(ValueError):
    """The KV byte budget cannot hold one request of ``max_model_len`` tokens."""


@dataclass(frozen=True)
class KVLayout:
    block_size: int
    num_blocks: dict[str, int]  # group -> blocks
    block_bytes: dict[str, int]  # group -> bytes per block

    @property
    def total_bytes(self) -> int:
        return sum(self.num_blocks[g] * self.block_bytes[g] for g in self.num_blocks)


def choose_block_size(specs: list[CacheSpec], requested: int | None) -> int:
    """``requested`` if every spec accepts it, else the smallest valid multiple >= 16."""
    m = required_block_multiple(specs)
    if requested is not None:
        if requested % m:
            raise KVBudgetError(
                f"block_size={requested} is invalid: must be a multiple of {m} (every compression ratio of the model)"
            )
        return requested
    return m * -(-DEFAULT_MIN_BLOCK_TOKENS // m)


def group_block_bytes(specs: list[CacheSpec], block_size: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in specs:
        out[s.group] = out.get(s.group, 0) + s.page_bytes(block_size)
    return out


def min_blocks(specs: list[CacheSpec], block_size: int, max_model_len: int, max_chunk: int) -> dict[str, int]:
    """Blocks per group one request of ``max_model_len`` tokens needs (see the module docstring)."""
    out = {}
    for g, w in group_windows(specs).items():
        if w is not None:
            out[g] = -(-(w + min(max_chunk, max_model_len)) // block_size) + 1
        else:
            out[g] = -(-max_model_len // block_size)
    return out


def plan_kv(
    specs: list[CacheSpec],
    block_size: int,
    budget: int,
    max_model_len: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> KVLayout:
    nbytes = group_block_bytes(specs, block_size)
    need = min_blocks(specs, block_size, max_model_len, max_num_batched_tokens)
    need_bytes = sum(need[g] * nbytes[g] for g in need)
    if need_bytes > budget:
        fit = largest_fitting_len(specs, block_size, budget, max_model_len, max_num_batched_tokens)
        detail = ", ".join(f"{need[g]} {g} blocks of {nbytes[g]} bytes" for g in sorted(need))
        raise KVBudgetError(
            f"KV cache too small: one request of max_model_len={max_model_len} needs {need_bytes} bytes "
            f"({detail}, block_size={block_size}), but only {budget} bytes are available; the largest "
            f"max_model_len that fits is {fit}. Raise kv_cache_memory_bytes (or gpu_memory_utilization) "
            f"or lower max_model_len."
        )
    blocks = dict(need)
    windows = group_windows(specs)
    rest = _grow_windowed(
        blocks, windows, nbytes, budget - need_bytes, block_size, max_num_seqs, max_num_batched_tokens
    )
    kept = [g for g, w in windows.items() if w is None]
    if kept:  # every kept group needs the same blocks per request: they grow together
        extra = min((max_num_seqs - 1) * need[kept[0]], rest // sum(nbytes[g] for g in kept))
        for g in kept:
            blocks[g] += max(0, extra)
    return KVLayout(block_size, blocks, nbytes)


def _grow_windowed(
    blocks: dict[str, int],
    windows: dict[str, int | None],
    nbytes: dict[str, int],
    rest: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> int:
    """Grow each windowed group in ``blocks`` towards what ``max_num_seqs`` decoding requests and one full
    prefill chunk read at once: all the way if ``rest`` bytes allow, else the same fraction of the way for
    every group. Returns the bytes left."""
    chunk = -(-max_num_batched_tokens // block_size)
    short = {
        g: max(0, max_num_seqs * (-(-(w + 1) // block_size) + 1) + chunk - blocks[g])
        for g, w in windows.items()
        if w is not None
    }
    cost, budget = sum(short[g] * nbytes[g] for g in short), rest
    for g, n in short.items():
        extra = n if cost <= budget else n * budget // cost
        blocks[g] += extra
        rest -= extra * nbytes[g]
    return rest


def largest_fitting_len(
    specs: list[CacheSpec], block_size: int, budget: int, upper: int, max_num_batched_tokens: int
) -> int:
    """The largest ``max_model_len <= upper`` whose single-request need fits ``budget`` (0 if none)."""
    nbytes = group_block_bytes(specs, block_size)

    def fits(n: int) -> bool:
        need = min_blocks(specs, block_size, n, max_num_batched_tokens)
        return sum(need[g] * nbytes[g] for g in need) <= budget

    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class KVFootprint:
    """What a model's specs cost, from their entry bytes alone (no block rounding): ``bytes_per_token`` of
    the kept groups (state that grows with the context), and ``window_bytes`` of one request's windowed
    state at its fullest (the ``window`` tokens before a token and the token itself)."""

    bytes_per_token: Fraction
    window_bytes: int


def kv_footprint(specs: list[CacheSpec]) -> KVFootprint:
    windows = group_windows(specs)
    kept = sum((s.bytes_per_token for s in specs if windows[s.group] is None), Fraction(0))
    window = sum(
        -(-(s.window + 1) // s.tokens_per_entry) * s.entry_bytes
        for s in specs
        if windows[s.group] is not None
    )
    return KVFootprint(kept, window)
