"""Data-parallel serving: one :class:`LLMEngine` per rank, stepped in lock step by the DP vote.

Per step every rank votes (:mod:`.vote`): if nobody has work the loop ends (offline: everything is
done); otherwise a rank with work runs ``engine.step()`` and a rank without work runs an empty batch,
so the MoE all-to-alls of expert parallelism still meet. Every ``interval_steps`` the ranks rebalance
experts together (:class:`.ep.ExpertParallel`).

Control traffic (which requests a rank serves, its outputs) goes through the rendezvous store, not
collectives, so idle ranks can wait between ``generate`` calls for as long as the user likes. It is
plain JSON authenticated with the run's secret (:mod:`.control`, :mod:`.wire`): a value that anyone
else wrote into the store is refused, and nothing read from it is ever unpickled.

Failures. Any error inside the loop marks ``deepinfer/failed/<rank>`` in the store. A rank whose
collective failed waits a short grace period for the other survivors' marks; the ranks that never
mark (or, on a single host, whose process is gone) are the failed ones, and :class:`RankFailureError`
names them. Collectives are bounded by the process-group timeout, so nothing hangs.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any

import torch.distributed as dist

from deepinfer_core.config import ConfigError, EngineConfig
from deepinfer_core.distributed import launcher
from deepinfer_core.distributed.control import ControlChannel, ControlMessageError, new_secret
from deepinfer_core.distributed.ep import ExpertParallel
from deepinfer_core.distributed.vote import DPVoter, RankFailureError, Vote
from deepinfer_core.engine.input_processor import ProcessedPrompt
from deepinfer_core.engine.llm_engine import LLMEngine
from deepinfer_core.engine.outputs import RequestOutput
from deepinfer_core.engine.scheduler import SchedulerOutput
from deepinfer_core.engine.wire import output_from_wire, output_to_wire, prompt_from_wire, prompt_to_wire

_GRACE_S = 3.0
_POLL_S = 0.02
log = logging.getLogger("deepinfer.distributed")


class RankEngine:
    """One DP rank: its engine, its expert shard and the per-step vote."""

    def __init__(self, config: EngineConfig, ctx: launcher.DistContext):
        from deepinfer_core.runtime import build_runtime

        self.ctx = ctx
        self.channel = ControlChannel(ctx.store, ctx.secret)
        _check_supported(config)
        rt = build_runtime(config)
        self.engine = LLMEngine.from_config(config, rt)
        self.ep = (
            ExpertParallel(self.engine.model, ctx.rank, ctx.world, rt.backends.comm, config.eplb)
            if config.expert_parallel
            else None
        )
        # a step retried one sequence at a time would run MoE all-to-alls the other ranks do not join
        self.engine.isolate_failures = self.ep is None
        self.engine.async_scheduling = False  # every rank runs the step it voted for, now
        self.voter = DPVoter(store=ctx.store)
        self.idle_steps = 0  # empty batches run so the MoE collectives meet

    def run(self, items: list[tuple[str, ProcessedPrompt]]) -> dict[str, RequestOutput]:
        """Serve ``items`` (this rank's share) until every rank is done; -> outputs by request id."""
        eng = self.engine
        for rid, item in items:
            eng.add_request(item, rid)
        done: dict[str, RequestOutput] = {}
        try:
            while True:
                eng.apply_aborts()
                vote = self._vote()
                if not self.voter.exchange(vote).run:
                    return done
                if vote.has_work:
                    done.update((o.request_id, o) for o in eng.step())
                elif self.ep is not None:
                    eng.runner.run(eng.runner.prepare(SchedulerOutput()))  # empty batch: meet the all-to-alls
                    self.idle_steps += 1
                if self.ep is not None:
                    self.ep.after_step()
        except Exception as exc:
            raise self._failure(exc) from exc

    def stats(self) -> dict:
        return {**self.engine.get_stats(), "dp_idle_steps": self.idle_steps}

    def _vote(self) -> Vote:
        sched = self.engine.scheduler
        waiting = sum(s.num_tokens - s.num_computed for s in sched.waiting)
        prefill = bool(sched.waiting) or any(s.num_computed < s.num_prompt_tokens for s in sched.running)
        tokens = min(waiting + len(sched.running), sched.max_num_batched_tokens)
        return Vote(tokens, prefill, False, sched.has_unfinished())

    # ------------------------------------------------------------------ failures

    def _failure(self, exc: Exception) -> Exception:
        peer = _is_transport_error(exc)
        store, me, world = self.ctx.store, self.ctx.rank, self.ctx.world
        try:
            store.set(f"deepinfer/failed/{me}", ("peer" if peer else "origin") + f": {exc}"[:400])
        except Exception:  # noqa: BLE001 - the store dies with rank 0
            return RankFailureError(
                f"data-parallel rank {me}: failed rank(s): [0] (the rendezvous store on rank 0 is unreachable) "
                f"at step {self.voter.step}: {exc}",
                [0],
            )
        if not peer:
            return exc
        failed = self._failed_ranks(store, me, world)
        return RankFailureError(
            f"data-parallel rank {me}: failed rank(s): {failed} (died, timed out or raised) at step "
            f"{self.voter.step}; {type(exc).__name__}: {str(exc)[:300]}",
            failed,
        )

    def _failed_ranks(self, store: dist.Store, me: int, world: int) -> list[int]:
        """Survivors mark themselves; the rest failed. On a single host a dead process is known at once;
        otherwise live ranks mark within a grace period of our own error (their collectives fail or time
        out together with ours). A process that died after marking itself a survivor (a peer's failure
        made it exit) is not a cause: when rank 1 hangs, rank 2 may time out, mark and exit before our
        own timeout fires."""
        deadline = time.monotonic() + _GRACE_S
        while True:
            dead = {r for r, p in enumerate(self.ctx.procs, start=1) if p.exitcode is not None}
            marks = {}
            for r in range(world):
                if r != me and store.check([f"deepinfer/failed/{r}"]):
                    marks[r] = store.get(f"deepinfer/failed/{r}").decode()
            origins = {r for r, m in marks.items() if m.startswith("origin")}
            survivors = set(marks) - origins
            silent = {r for r in range(world) if r != me and r not in marks}
            if dead - survivors:
                return sorted(origins | (dead - survivors))
            if not silent or time.monotonic() > deadline:
                return sorted(origins | silent)
            time.sleep(_POLL_S)


class DPEngine:
    """Rank 0's face of a data-parallel engine: what :class:`~deepinfer_core.engine.llm.LLM` uses.

    ``generate`` spreads the requests over the ranks by load (prompt + max new tokens, each to the rank
    with the least so far), every rank serves its share, and the outputs come back in input order."""

    def __init__(self, config: EngineConfig, ctx: launcher.DistContext):
        self.config, self.ctx = config, ctx
        self.rank = RankEngine(config, ctx)
        local = self.rank.engine
        self.model, self.backends, self.tokenizer = local.model, local.backends, local.tokenizer
        self.inputs, self.max_model_len = local.inputs, local.max_model_len
        self._cmd = 0
        self._stats: dict[int, dict[str, Any]] = {}
        self._closed = False

    @classmethod
    def from_config(cls, config: EngineConfig) -> DPEngine:
        """Spawn the ranks (single host) or join torchrun's group. Under torchrun, ranks other than 0
        serve here until rank 0 closes, then exit the process."""
        backend = _dist_backend(config)
        world, timeout = config.data_parallel_size, config.dist_timeout_s
        given = config.dist_secret.get_secret_value() if config.dist_secret is not None else None
        if launcher.under_torchrun():
            ctx = launcher.init_torchrun(world, backend, given, timeout)
            if ctx.rank != 0:
                serve(RankEngine(config, ctx))
                launcher.shutdown()
                sys.exit(0)
        else:
            ctx = launcher.spawn_ranks(
                world, backend, given or new_secret(), timeout, _rank_main, (config.model_dump(),)
            )
        try:
            return cls(config, ctx)
        except BaseException:
            for p in ctx.procs:
                p.join(timeout)
                if p.is_alive():
                    p.kill()
            launcher.shutdown()
            raise

    def generate(self, items: list[ProcessedPrompt]) -> list[RequestOutput]:
        if self._closed:
            raise RuntimeError("this data-parallel engine is closed (a rank failed or close() was called)")
        shares = assign_by_load(items, self.ctx.world, self.max_model_len)
        self._cmd += 1
        wire = [[(rid, prompt_to_wire(it)) for rid, it in share] for share in shares]
        self.rank.channel.send(f"deepinfer/cmd/{self._cmd}", {"cmd": "run", "shares": wire})
        try:
            done = self.rank.run(shares[0])
        except RankFailureError as exc:
            for r in exc.ranks:  # a hung rank would never exit on its own
                if 0 < r <= len(self.ctx.procs):
                    self.ctx.procs[r - 1].kill()
            self.close(force=True)
            raise
        except BaseException:
            self.close(force=True)
            raise
        self._stats[0] = self.rank.stats()
        for r in range(1, self.ctx.world):
            result = _recv_authentic(
                self.rank.channel, f"deepinfer/result/{self._cmd}/{r}", self.ctx.timeout_s
            )
            done.update((o["request_id"], output_from_wire(o)) for o in result["outputs"])
            self._stats[r] = result["stats"]
        return [done[str(i)] for i in range(len(items))]

    def get_stats(self) -> dict[str, Any]:
        """Integer counters summed over ranks (means and lists from rank 0) plus the EPLB imbalance (max/mean GPU
        load of the last window) before and after the last rebalance."""
        total: dict[str, Any] = dict(self._stats.get(0, {}))
        for r, stats in self._stats.items():
            for k, v in stats.items():
                if r and _is_count(v) and _is_count(total.get(k)):
                    total[k] += v
        ep = self.rank.ep
        if ep is not None:
            total["eplb_rebalances"] = ep.stats.rebalances
            total["eplb_imbalance_before"] = ep.stats.imbalance_before
            total["eplb_imbalance_after"] = ep.stats.imbalance_after
        return total

    def abort(self, request_id: str) -> None:
        self.rank.engine.abort(request_id)

    def apply_aborts(self) -> list[RequestOutput]:
        return []

    def close(self, force: bool = False) -> None:
        """Stop the other ranks and leave the process group."""
        if self._closed:
            return
        self._closed = True
        try:
            self.rank.channel.send(f"deepinfer/cmd/{self._cmd + 1}", {"cmd": "exit"})
        except Exception:  # noqa: BLE001 - the store may be unusable after a failure
            force = True
        for p in self.ctx.procs:
            p.join(None if not force else self.ctx.timeout_s + 2 * _GRACE_S)  # survivors exit on their own
            if p.is_alive():
                p.kill()
        launcher.shutdown()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


def _is_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def assign_by_load(
    items: list[ProcessedPrompt], world: int, max_model_len: int
) -> list[list[tuple[str, Any]]]:
    """Request ``i`` (id ``str(i)``) goes to the rank with the least load so far, load being prompt tokens
    plus the most tokens it may generate, counting every sample."""
    loads = [0] * world
    shares: list[list[tuple[str, Any]]] = [[] for _ in range(world)]
    for i, it in enumerate(items):
        r = min(range(world), key=lambda q: (loads[q], q))
        new = it.params.max_tokens or max_model_len - len(it.token_ids)
        loads[r] += (len(it.token_ids) + new) * max(1, it.params.n)
        shares[r].append((str(i), it))
    return shares


def serve(rank: RankEngine) -> None:
    """A rank other than 0: run commands from the store until told to exit."""
    store, me, n = rank.ctx.store, rank.ctx.rank, 0
    parent = os.getppid()
    while True:
        n += 1
        key = f"deepinfer/cmd/{n}"
        while not store.check([key]):
            if os.getppid() != parent:
                raise RuntimeError(f"data-parallel rank {me}: the host process is gone")
            time.sleep(_POLL_S)
        msg = _recv_authentic(rank.channel, key, None)
        if msg.get("cmd") == "exit":
            return
        items = [(str(rid), prompt_from_wire(d)) for rid, d in msg["shares"][me]]
        outs = rank.run(items)
        rank.channel.send(
            f"deepinfer/result/{n}/{me}",
            {"outputs": [output_to_wire(o) for o in outs.values()], "stats": rank.stats()},
        )


def _recv_authentic(channel: ControlChannel, key: str, timeout_s: float | None) -> Any:
    """The authentic value under ``key``. A forged value (someone else wrote the key) is logged and
    waited out: the real writer's value replaces it. ``timeout_s`` bounds the wait (None: forever)."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    warned = False
    while True:
        try:
            return channel.recv(key)
        except ControlMessageError as exc:
            if not warned:
                log.warning("deepinfer: %s", exc)
                warned = True
            if deadline is not None and time.monotonic() > deadline:
                raise
            time.sleep(_POLL_S)


_TRANSPORT_MARKERS = ("connection closed", "connection reset", "timed out", "timeout", "gloo", "nccl", "hccl")


def _is_transport_error(exc: BaseException) -> bool:
    """A collective failed because of a peer (not a bug on this rank). gloo raises plain RuntimeErrors."""
    if isinstance(exc, (dist.DistError, RankFailureError)):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc).lower() for m in _TRANSPORT_MARKERS)


def _rank_main(
    rank: int, world: int, port: int, backend: str, secret: str, timeout_s: float, config: dict
) -> None:
    ctx = launcher.init_rank(rank, world, port, backend, secret, timeout_s)
    try:
        serve(RankEngine(EngineConfig(**config), ctx))
    except RankFailureError as exc:
        print(exc, file=sys.stderr, flush=True)
        ctx.store.set(f"deepinfer/diagnosis/{rank}", str(exc))
        os._exit(1)
    launcher.shutdown()


def _check_supported(config: EngineConfig) -> None:
    spec = config.speculative_config or {}
    if config.expert_parallel and spec and spec.get("method") != "ngram":
        raise ConfigError(
            f"speculative_config.method={spec.get('method')!r} with expert_parallel=True is not supported yet: "
            "its draft model runs MoE layers outside the voted step, so the ranks' all-to-alls would not meet "
            "(use method='ngram', or expert_parallel=False)"
        )


def _dist_backend(config: EngineConfig) -> str:
    from deepinfer_core.runtime import build_runtime

    return build_runtime(config).backends.comm.dist_backend
