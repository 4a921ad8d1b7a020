"""Where the quantized engine and the reference's ``kvq_only`` mode first round a KV / index value differently.

    python tools/v41_kv_flips.py --reference .v41ref --config long_pool --prompt 5

Both prefill one golden prompt (``kv_cache_dtype="auto"``; ``kvq_only``: float32 GEMMs with the KV / index round
trips). The input of every round trip is recorded per layer and site (``window``, ``compressed``, ``keys``,
``query``): in the reference, each ``act_quant`` / ``fp4_act_quant`` call with ``inplace=True``; in the engine,
each :meth:`PackedKV.pack`. Both inputs go through the same (bit-exact) quantiser. For each site the tool prints
the first row whose round trip differs, the largest input difference before it, and the two inputs of the
first differing element with what each rounds to. Inputs a few 1e-7 apart on either side of a rounding midpoint
are a rounding flip (docs/v41_reference.md, 4); a site missing on one side, or a flip with inputs far apart
and no flip before it, is a misplaced round trip.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from v41golden import config_goldens, configs, patches, runs  # noqa: E402
from v41golden.reference import load_reference  # noqa: E402

from deepinfer_core import LLM, SamplingParams  # noqa: E402
from deepinfer_core.models.deepseek_v41 import attention, kv_formats  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "v41"
CODECS = {
    "window": kv_formats.window_kv,
    "compressed": kv_formats.compressed_kv,
    "keys": kv_formats.index_keys,
    "query": kv_formats.index_keys,
}
Inputs = dict[tuple[int, str], torch.Tensor]  # (layer, site) -> round-trip input [rows, width]


@contextlib.contextmanager
def _wrapped(owner, name: str, make):
    old = getattr(owner, name)
    setattr(owner, name, make(old))
    try:
        yield
    finally:
        setattr(owner, name, old)


def reference_inputs(ref, p, ids: list[int]) -> Inputs:
    """The prefill's round-trip inputs in ``kvq_only`` (main layers; DSpark stages are left out)."""
    m, out, layer = ref.model, {}, [None]

    def attn(forward):
        def f(self, *a, **k):
            layer[0] = self.layer_id if type(self) is m.Attention else None
            return forward(self, *a, **k)

        return f

    def record(site_of):
        def wrap(fn):
            def f(x, *a, **k):
                site = site_of(x, a, k)
                if site and layer[0] is not None:
                    out[(layer[0], site)] = x.detach().reshape(-1, x.shape[-1]).clone()
                return fn(x, *a, **k)

            return f

        return wrap

    def fp8_site(x, a, k):  # act_quant(x, block_size, scale_fmt, scale_dtype, inplace)
        return "window" if (a[3] if len(a) > 3 else k.get("inplace", False)) else None

    def fp4_site(x, a, k):  # fp4_act_quant(x, block_size, inplace, scale_dtype)
        block = a[0] if a else k.get("block_size", 32)
        if not (a[1] if len(a) > 1 else k.get("inplace", False)):
            return None
        return "compressed" if block == 16 else ("query" if x.dim() == 4 else "keys")

    model = config_goldens.fresh_model(ref, p)
    with (
        _wrapped(m.Attention, "forward", attn),
        _wrapped(m, "act_quant", record(fp8_site)),
        _wrapped(m, "fp4_act_quant", record(fp4_site)),
        patches.numerics(ref, "kvq_only"),
    ):
        runs.forward_once(model, ref, ids, 0)
    return out


def engine_inputs(name: str, ids: list[int]) -> Inputs:
    """The engine's prefill round-trip inputs (its first call per layer and site)."""
    out, layer, in_query = {}, [None], [False]

    def attn(forward):
        def f(self, *a, **k):
            layer[0] = self.role.layer
            return forward(self, *a, **k)

        return f

    def query(fn):
        def f(*a, **k):
            in_query[0] = True
            try:
                return fn(*a, **k)
            finally:
                in_query[0] = False

        return f

    def pack(fn):
        def f(self, values):
            fmt = self.fmt
            site = "window" if fmt.values == "e4m3" else "compressed" if fmt.scales == "e4m3" else "keys"
            site = "query" if in_query[0] else site
            out.setdefault((layer[0], site), values.detach().clone())
            return fn(self, values)

        return f

    with (
        _wrapped(attention.Attention, "forward", attn),
        _wrapped(attention.Indexer, "query", query),
        _wrapped(kv_formats.PackedKV, "pack", pack),
    ):
        llm = LLM(model=str(DATA / name / "checkpoint"), kv_cache_dtype="auto", dtype="float32")
        llm.generate(
            [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, temperature=0.0), use_tqdm=False
        )
    return out


def describe(site: str, r: torch.Tensor, e: torch.Tensor, tokens: int) -> str:
    """``tokens``: the prompt's length (query rows are token-major over the index heads)."""
    codec = CODECS[site](r.shape[-1], torch.float32)
    qr, qe = codec.roundtrip(r.float()), codec.roundtrip(e.float())
    flips = (qr != qe).any(-1).nonzero().flatten()
    if not len(flips):
        return f"no flip; max |input diff| {float((r - e).abs().max()):.2e}"
    row = int(flips[0])
    el = int((qr[row] != qe[row]).nonzero()[0])
    before = float((r[:row] - e[:row]).abs().max()) if row else 0.0
    at = f" (token {row // (r.shape[0] // tokens)})" if site == "query" else ""
    return (
        f"first flip at row {row}{at} of {r.shape[0]} ({len(flips)} rows differ); max |input diff| before it "
        f"{before:.2e}; element {el}: reference {float(r[row, el]):.9g} -> {float(qr[row, el]):.9g}, "
        f"engine {float(e[row, el]):.9g} -> {float(qe[row, el]):.9g}"
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", type=Path, required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--prompt", type=int, required=True, help="index of the golden prompt")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    ref = load_reference(args.reference)
    p = config_goldens.prepare(ref, configs.by_name(args.config))
    ids = p.prompts[args.prompt]
    r_in, e_in = reference_inputs(ref, p, ids), engine_inputs(args.config, ids)
    for key in sorted(set(r_in) | set(e_in)):
        if key not in r_in or key not in e_in:
            print(key, "only in", "the reference" if key in r_in else "the engine")
        elif r_in[key].shape != e_in[key].shape:
            print(key, "shapes differ:", tuple(r_in[key].shape), tuple(e_in[key].shape))
        else:
            print(key, describe(key[1], r_in[key], e_in[key], len(ids)))


if __name__ == "__main__":
    main()
