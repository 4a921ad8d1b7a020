"""The layer-range seam on the engine's side: which rows a model's later layers run on.

A model may declare (:meth:`~deepinfer_core.models.base.CausalLM.bounded_replay`) that its layers from
``first_layer`` on need only the last ``window`` rows of each request's chunk. With
``EngineConfig.swa_bounded_replay`` on, :func:`tail_batch` gives each mixed step where that drops rows a
:class:`~deepinfer_core.models.batch.TailBatch`. Rows whose logits are wanted are always kept: a request
whose logits rows start before its last ``window`` rows (prompt logprobs, many drafts) keeps every row.
Static steps (decode and verify) never get one: each of their rows is sampled.

The state those layers keep is then written only on the rows they ran on, so it is not what another
request resuming from the same prefix would need. :class:`BoundedReplay` names its groups: the KV manager
keeps them out of the prefix cache, and a cache hit leaves at least ``window`` tokens to compute, which
rebuilds them (the window is replayed on a hit). Reads of late state that was never written (rows dropped
earlier in the chunk, or positions before a cache hit) are the model's to mask, below
:attr:`TailBatch.state_from`; a model whose late layers depend on fewer rows than ``window`` never needs to.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch

from deepinfer_core.config import ConfigError
from deepinfer_core.kv.spec import CacheSpec, group_windows
from deepinfer_core.models.base import CausalLM
from deepinfer_core.models.batch import ForwardBatch, TailBatch


@dataclass(frozen=True)
class BoundedReplay:
    first_layer: int
    window: int  # rows of each chunk the layers >= first_layer run on
    groups: frozenset[str]  # cache groups written by those layers (windowed, nothing else in them)


def bounded_replay(
    model: CausalLM, specs: list[CacheSpec], enabled: bool, taps_hidden: bool
) -> BoundedReplay | None:
    """The model's bounded replay when ``swa_bounded_replay`` is on, checked against its cache specs;
    ``None`` when it is off. Raises :class:`ConfigError` when it cannot be honoured."""
    if not enabled:
        return None
    declared = model.bounded_replay()
    name = type(model).__name__
    if declared is None:
        raise ConfigError(f"swa_bounded_replay=True is invalid: {name} declares no bounded replay")
    if taps_hidden:
        raise ConfigError(
            "swa_bounded_replay=True cannot be combined with a proposer that reads the target's hidden "
            "states: rows outside the replayed window do not hold the last layer's output"
        )
    first_layer, window = declared
    bad = _misfits(specs, first_layer, window)
    if window < 1 or first_layer < 0 or bad:
        raise ValueError(
            f"{name}.bounded_replay() = {declared} does not fit its cache specs {bad}: every spec names its "
            f"writer, and the state of layers >= {first_layer} is windowed (window < {window}) in groups "
            "of its own"
        )
    late = {s.group for s in specs if s.writer >= first_layer}
    return BoundedReplay(first_layer, window, frozenset(late))


def _misfits(specs: list[CacheSpec], first_layer: int, window: int) -> list[str]:
    """Names of the specs that break what bounded replay needs of them."""
    late = {s.group for s in specs if s.writer is not None and s.writer >= first_layer}
    windows = group_windows(specs)
    out = []
    for s in specs:
        is_late = s.writer is not None and s.writer >= first_layer
        short = 0 < (windows[s.group] or 0) < window
        if s.writer is None or (s.group in late) != is_late or (is_late and not short):
            out.append(s.name)
    return out


def tail_batch(
    batch: ForwardBatch, replay: BoundedReplay | None, resumed_at: list[int] | None = None
) -> TailBatch | None:
    """For ``batch`` (on the host): the rows layers ``>= replay.first_layer`` run on, or ``None`` when that
    is every row and nothing they read is missing (or ``replay`` is ``None``).

    ``resumed_at[b]``: the tokens request ``b`` took from the prefix cache (its late state below them was
    never written). :attr:`TailBatch.state_from` gives, per request, the first position whose late state
    exists: the first row kept when rows are dropped, else ``resumed_at``."""
    if replay is None or batch.num_requests == 0:
        return None
    first_layer, window = replay.first_layer, replay.window
    resumed_at = resumed_at or [0] * batch.num_requests
    qsl = batch.query_start_loc.tolist()
    pos = batch.positions.tolist()
    wanted = batch.logits_indices.tolist()
    owner = [bisect.bisect_right(qsl, r) - 1 for r in wanted]
    first_wanted = qsl[1:]  # per request: its first logits row (its end when it has none)
    for r, b in zip(wanted, owner):
        first_wanted[b] = min(first_wanted[b], r)
    starts, state_from = [], []
    for b in range(batch.num_requests):
        start = max(qsl[b], qsl[b + 1] - window)
        start = start if first_wanted[b] >= start else qsl[b]
        starts.append(start)
        state_from.append(pos[start] if start > qsl[b] else resumed_at[b])
    reads_missing = any(
        f > 0 and qsl[b] < qsl[b + 1] and pos[qsl[b]] - f < window for b, f in enumerate(state_from)
    )
    if starts == qsl[:-1] and not reads_missing:
        return None
    rows, sub_qsl = [], [0]
    for b, start in enumerate(starts):
        rows.extend(range(start, qsl[b + 1]))
        sub_qsl.append(len(rows))
    logits = [r - starts[b] + sub_qsl[b] for r, b in zip(wanted, owner)]
    index = _ints(rows)
    sub = ForwardBatch(
        input_ids=batch.input_ids[index],
        positions=batch.positions[index],
        query_start_loc=_ints(sub_qsl),
        context_lens=batch.context_lens,
        block_tables=batch.block_tables,
        block_size=batch.block_size,
        logits_indices=_ints(logits),
    )
    return TailBatch(first_layer, index, sub, _ints(state_from))


def _ints(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)
