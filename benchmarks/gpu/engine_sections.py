"""The whole engine on the slice (``v4_slice.py --sections engine``): what a user gets from ``LLM.generate``,
next to the forward pass alone, in the same run, with overlap scheduling off and on.

Per batch ``B`` (``--batches``): ``B`` prompts of ``--engine-prompt`` random tokens, ``--engine-tokens`` sampled
tokens each (seeded top-p 0.95, temperature 0.6, EOS ignored). Reported:

- ``forward_ms``: one captured decode step (forward + logits) of ``B`` rows at the mid-generation context,
  timed as ``v4_slice.py``'s slice section times it;
- ``engine_step_ms``: the median wall time of the engine's steps in which all ``B`` sequences decode (one
  ``LLMEngine.step`` call each; with overlap a call launches one step and lands the one before);
- ``engine_tok_s`` (``B / engine_step_ms``) and ``pct_of_forward`` (``forward_ms / engine_step_ms``), the
  issue's target being at least 90%; ``generate_tok_s``: output tokens over the whole ``generate`` call
  (prefill included);
- ``greedy_equal``: greedy tokens with overlap equal those without, at every batch;
- ``launch_sync_free``: on the GPU, every overlapped launch of a decode step (prepare, the forward pass,
  sampling) ran under ``torch.cuda.set_sync_debug_mode("error")``, i.e. without waiting for the device.
"""

from __future__ import annotations

import time

import torch
from bench_common import RESULTS, SMOKE, cuda_runtime, log, sync, time_call
from cuda_settings import cuda_env
from slice_model import SliceRunner, build_slice


def section_engine(args) -> None:
    from deepinfer_core import SamplingParams
    from deepinfer_core.config import load_config
    from deepinfer_core.engine.llm import LLM
    from deepinfer_core.engine.llm_engine import LLMEngine
    from deepinfer_core.runtime import build_runtime

    backend = "reference" if SMOKE else "cuda_sm100"
    env = {} if SMOKE else cuda_env()
    rt = (
        build_runtime(load_config(environ={}, backend=backend))
        if SMOKE
        else cuda_runtime(load_config(environ=env, backend=backend))
    )
    dev = rt.backends.memory.device
    model = build_slice(args.layers, rt.backends, toy=SMOKE)
    batches, p_len, t_len = args.batches, args.engine_prompt, args.engine_tokens
    ctx = p_len + t_len
    sr = SliceRunner(model, rt.backends, max(batches), ctx, graphs=True)
    forward = {}
    for b in batches:
        fb = sr.batch(b, p_len + t_len // 2, graph=True).to(dev)
        forward[b] = time_call(lambda fb=fb: sr.runner.run(fb), reps=5 if SMOKE else 20)
    sr = None
    if not SMOKE:
        torch.cuda.empty_cache()
    g = torch.Generator().manual_seed(0)
    vocab = model.vocab_size
    prompts = [
        {"prompt_token_ids": torch.randint(2, vocab, (p_len,), generator=g).tolist()}
        for _ in range(max(batches))
    ]
    rows, greedy = {b: {"batch": b, "forward_ms": forward[b]} for b in batches}, {}
    for overlap in (False, True):
        config = load_config(
            environ=env,
            backend=backend,
            max_model_len=ctx + 8,
            max_num_seqs=max(batches + [getattr(args, "engine_max_seqs", 0)]),
            max_num_batched_tokens=max(8192, p_len),
            kv_cache_memory_bytes=args.engine_kv_bytes,
            async_scheduling=overlap,
            device_plan=bool(getattr(args, "device_plan", 1)),
        )
        engine = LLMEngine(config, model, rt.backends, None)
        llm = LLM.from_engine(engine)
        steps = _timed_steps(engine)
        tag = "overlap" if overlap else "sync"
        if overlap and not SMOKE:
            rows_sync = _check_launches(engine, llm, prompts[: max(batches)], t_len)
        for b in batches:
            params = [
                SamplingParams(temperature=0.6, top_p=0.95, seed=i, max_tokens=t_len, ignore_eos=True)
                for i in range(b)
            ]
            llm.generate(prompts[:b], params, use_tqdm=False)
            steps.clear()  # (the first call captured the graphs)
            t0 = time.perf_counter()
            outs = llm.generate(prompts[:b], params, use_tqdm=False)
            sync()
            wall = time.perf_counter() - t0
            full = sorted(ms for n, t, ms in steps if n == b and t == b)
            step_ms = full[len(full) // 2] if full else float("nan")
            rows[b][f"{tag}_step_ms"] = step_ms
            rows[b][f"{tag}_tok_s"] = b / step_ms * 1e3
            rows[b][f"{tag}_pct_of_forward"] = 100 * forward[b] / step_ms
            rows[b][f"{tag}_generate_tok_s"] = sum(len(o.outputs[0].token_ids) for o in outs) / wall
            sp = SamplingParams(temperature=0.0, max_tokens=min(t_len, 32), ignore_eos=True)
            greedy[(overlap, b)] = [
                o.outputs[0].token_ids for o in llm.generate(prompts[: min(b, 16)], sp, use_tqdm=False)
            ]
            log("engine", tag, rows[b])
            if overlap and getattr(args, "engine_host_profile", False) and b == batches[0]:
                rows[b]["host_profile"] = _host_profile(llm, prompts[:b], params)
        engine = llm = None
        if not SMOKE:
            torch.cuda.empty_cache()
    for b in batches:
        rows[b]["greedy_equal"] = greedy[(False, b)] == greedy[(True, b)]
    out = {"prompt": p_len, "tokens": t_len, "layers": args.layers, "rows": list(rows.values())}
    if not SMOKE:
        out["launch_sync_free"] = rows_sync
    log("engine", out)
    RESULTS["engine"] = out


def _host_profile(llm, prompts, params, top: int = 25) -> dict:
    """Where the host's time goes in one overlapped ``generate`` call: ``cProfile``'s top functions by own time
    and by cumulative time, then the CUDA runtime calls of the same call counted by ``torch.profiler`` (kernel
    launches outside the graphs, graph launches, copies, synchronisations), per decode step."""
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    outs = llm.generate(prompts, params, use_tqdm=False)
    sync()
    prof.disable()
    steps = max(1, sum(len(o.outputs[0].token_ids) for o in outs) // max(1, len(prompts)))
    res: dict = {"steps": steps}
    for key in ("tottime", "cumulative"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(top)
        res[key] = [ln.rstrip()[:200] for ln in buf.getvalue().splitlines() if ln.strip()][-top - 1 :]
    if not SMOKE:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            llm.generate(prompts, params, use_tqdm=False)
            sync()
        calls: dict[str, list[float]] = {}
        for e in p.events():
            if e.name.startswith("cuda") or e.name.startswith("cu"):
                c = calls.setdefault(e.name, [0, 0.0])
                c[0] += 1
                c[1] += e.cpu_time_total / 1e3
        res["cuda_api_per_step"] = {
            k: {"calls": round(v[0] / steps, 2), "ms": round(v[1] / steps, 4)}
            for k, v in sorted(calls.items(), key=lambda kv: -kv[1][1])[:15]
        }
    for ln in res["tottime"]:
        log("engine host", ln)
    return res


def _check_launches(engine, llm, prompts, t_len: int) -> str:
    """Generate once with every overlapped decode launch under ``set_sync_debug_mode("error")``."""
    from deepinfer_core import SamplingParams

    loop = engine.overlap
    launch, seen = loop.launch, {"checked": 0}

    def checked(sched):
        if any(s.num_tokens != 1 or not s.samples for s in sched.scheduled) or loop.inflight is None:
            return launch(sched)  # prefill, or nothing in flight: not the steady state
        torch.cuda.set_sync_debug_mode("error")
        try:
            return launch(sched)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            seen["checked"] += 1

    loop.launch = checked
    sp = [
        SamplingParams(temperature=0.6, top_p=0.95, seed=i, max_tokens=min(t_len, 16))
        for i in range(len(prompts))
    ]
    try:
        llm.generate(prompts, sp, use_tqdm=False)
    except RuntimeError as e:
        return f"FAILED after {seen['checked']} launches: {e}"[:400]
    finally:
        loop.launch = launch
    return f"ok: {seen['checked']} overlapped decode launches without a host synchronisation"


def _timed_steps(engine) -> list[tuple[int, int, float]]:
    """Wrap ``engine.step``: ``(sequences, tokens, wall ms)`` of each step call, by the step it scheduled."""
    steps: list[tuple[int, int, float]] = []
    schedule, step = engine.scheduler.schedule, engine.step
    seen: list[tuple[int, int]] = []

    def scheduled():
        s = schedule()
        seen.append((len(s.scheduled), s.num_tokens))
        return s

    def timed():
        seen.clear()
        t0 = time.perf_counter()
        r = step()
        n, t = seen[-1] if seen else (0, 0)
        steps.append((n, t, (time.perf_counter() - t0) * 1e3))
        return r

    engine.scheduler.schedule, engine.step = scheduled, timed
    return steps
