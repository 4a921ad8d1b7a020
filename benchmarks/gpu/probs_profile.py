"""Where the sampler's sort-free ``probs`` spends its time: each launch of one call (``kernels/probs.py``) at the
engine benchmark's rows (temperature 0.6, top-p 0.95), in launch order, from the CUDA profiler, at 1, 64 and 256
rows of the real vocabulary. ``DEEPINFER_CUDA_SM100__*`` variables set the plugin's settings: ``PDL=0`` for each
kernel's own time (with PDL on a kernel is charged its wait for the one before), ``PROBS_COMPACT_FIRST=1``.

    python benchmarks/gpu/probs_profile.py [--batches 1 64 256]     (the GPU)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_common import F32, VOCAB, bench_graph, rnd, torch  # noqa: E402
from check_probs import _kept_agree, _rows  # noqa: E402
from cuda_settings import use_env_settings  # noqa: E402

from deepinfer_core.ops.reference import reference_op  # noqa: E402
from deepinfer_cuda_sm100.kernels import probs as kp  # noqa: E402


def launches(fn) -> list[tuple[str, float]]:
    """``(kernel name, us)`` of each GPU kernel of one ``fn`` call, in the order they ran."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    ev = [
        e for e in prof.events() if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start
    ]
    ev.sort(key=lambda e: e.time_range.start)
    return [(e.name[:60], (e.time_range.end - e.time_range.start)) for e in ev]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    print("settings:", use_env_settings().model_dump(include={"pdl", "probs_compact_first"}), flush=True)
    res = []
    for B in args.batches:
        prm = _rows(B, True)
        logits = rnd(B, VOCAB, dtype=F32, scale=3.0)
        a = (logits, prm.temperature, prm.top_k, prm.top_p, prm.min_p)

        def call(a=a):
            return kp.probs(*a, top_k_used=False, top_p_used=True)

        for _ in range(3):
            call()
        seq = launches(call)
        graphed = bench_graph(call, calls=5) * 1e3
        got = call()
        kept = int((got > 0).sum())
        agree, rows_differ = _kept_agree(got, reference_op("sampling").probs(logits, prm), logits, prm)
        if not agree:
            raise SystemExit(f"B={B}: the kernels keep other tokens than the reference op")
        row = {"B": B, "graphed_us": round(graphed, 1), "kept_tokens": kept, "rows_differ_at_boundary": rows_differ,
               "launches": [[n, round(us, 1)] for n, us in seq]}  # fmt: skip
        res.append(row)
        print(f"B={B}: graphed {graphed:.1f} us, {kept / B:.0f} tokens kept a row (the reference's; "
              f"{rows_differ} rows differ within 1e-5 of top-p), {len(seq)} launches, "
              f"{sum(us for _, us in seq):.1f} us of kernels (eager)", flush=True)  # fmt: skip
        for n, us in seq:
            print(f"   {us:8.1f} us  {n}", flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probs_profile.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
