"""Add to the SM100 manifest (``launches_h200.json``) the launches of plugin paths the V4 slice never takes, as
the CPU interpreter makes them (``"source": "interpreter"``, tiny shapes): V4.1's single-pass mHC kernels, its
GEMMs with 32 x 32 FP8 scale blocks (``SB = 32``), its packed-KV attention (``KV_PACK`` / ``CMP_PACK``) and the
indexer over its FP4 keys (``KEY_PACK``), its packed KV stores (``_pack_v41_kernel``) and its Engram rows read in
the step from page-locked host memory (``_host_rows_kernel``).
They stay there until ``benchmarks/gpu/record_launches.py v41`` records them on a GPU.

    PYTHONPATH=.:plugins/deepinfer_cuda_sm100 python tests/plugins/cuda_sm100/record_interpreter_launches.py
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "1"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import launch_manifest as lm  # noqa: E402
import torch  # noqa: E402

NOTE = (
    "kernels the slice run never launched (sampling penalties, grammar bitmask), and V4.1's paths the V4 slice "
    "does not take (single-pass mHC: _hc_coeffs_kernel, _hc_collapse_kernel; FP8 32x32 weights: SB=32; packed "
    "KV attention: KV_PACK/CMP_PACK; FP4 index keys: KEY_PACK; packed stores: _pack_v41_kernel; the index queries' round trip: _roundtrip_v41_kernel (not yet run on a GPU); Engram rows read in the step: _host_rows_kernel; activation quantisation: _act_quant_kernel, and SM100's MX GEMM: _mx_gemm_kernel, neither yet run on a GPU; the mHC site entries in the boundary kernels: PRE_IN, not yet run on a GPU; the shared expert's add in the GEMM epilogue: HAS_ADD, and V4's FP8 KV scales gathered per channel: FP8=2, and V4.1's Engram gate in one launch: _engram_gate_kernel, and the keyed draw of sampling: _draw_rows_kernel, _chunk_sums_kernel, _draw_chunk_kernel, and the sort-free probs: _stats_kernel, _softmax_kernel, _radix_pass_kernel, _cut_kernel (NEGLIGIBLE: not yet run on a GPU), and split-KV attention's combine with the output rotated back: _combine_kernel UNROPE, and the query rotated (and normed) as the attention kernel loads it: _sparse_attn_kernel ROPE_Q, and V4.1's KV rows normed, rotated and packed in one launch: _norm_rope_pack_v41_kernel, and V4.1's index query in one launch: _index_query_kernel, and V4's KV row normed, rotated and stored in one launch: _rms_norm_rope_kernel SCATTER, and V4.1's Engram hashes and dequantised rows in one launch each: _engram_hash_kernel, _host_rows_dequant_kernel, and the select kernel's threshold by digit histograms: _topk_select_kernel RADIX, and the 64-head attention tiles over V4's FP8 rows and V4.1's packed entries (dispatch's tables, DOT_T as a GPU launches them), and V4's FP8 rows with the RoPE channels apart: FP8=3, and prefill's weights dequantised for cuBLAS: _dequant_kernel (as a GPU launches it: bf16 out, FP4 by PTX), and device_plan's static plan: _static_window_kernel, _static_compression_kernel (PDL as a decode step launches them), none yet run on a GPU): their launches under TRITON_INTERPRET=1 (CPU, Triton 3.9), tiny shapes "
    "(record_interpreter_launches.py); the H200 run of record_launches.py v41 (meta v41_gpu_run) has since recorded these paths at the tiny V4.1 checkpoints' shapes as well"
)


@contextlib.contextmanager
def _arch(name: str, **switches):
    """Dispatch as on ``name`` with these ``cuda_sm100`` settings (the interpreter runs what its tables pick)."""
    from deepinfer_cuda_sm100 import dispatch, settings

    arch, active = dispatch.arch, settings.active()
    dispatch.arch = lambda: name
    settings.use(settings.CudaSM100Settings(**switches))
    try:
        yield
    finally:
        dispatch.arch = arch
        settings.use(active)


def v41_launches() -> dict:
    from deepinfer_core.models.deepseek_v41.kv_formats import kv_formats
    from deepinfer_core.ops.kv_fp8 import Fp8KVFormat
    from deepinfer_core.ops.mhc import HCParams
    from deepinfer_core.ops.quant_formats import quantize_fp4_e2m1, quantize_fp8_block
    from deepinfer_core.ops.weights import ExpertWeights
    from deepinfer_cuda_sm100.kernels import act_quant, probs, sampling, sparse_attention
    from deepinfer_cuda_sm100.kernels.host_rows import host_rows, host_rows_dequant
    from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps
    from deepinfer_cuda_sm100.ops.dense import CudaDenseOps
    from deepinfer_cuda_sm100.ops.moe import CudaMoEOps

    dense, attn = CudaDenseOps(), CudaAttentionOps()
    g = torch.Generator().manual_seed(0)

    def r(*shape, dt=torch.float32):
        return torch.randn(*shape, generator=g).to(dt)

    store: dict = {}
    with lm.record(store):
        for T in (1, 16):
            for dt in (torch.bfloat16, torch.float32):
                x = r(T, 4, 128, dt=dt)
                hc = HCParams(r(24, 512) * 0.05, r(24), torch.rand(3, generator=g) + 0.5, 20, 1e-6, 1e-6)
                pre, _, _ = dense.hc_mixes(x, hc)
                dense.hc_collapse(x, pre)
                if (
                    T == 1
                ):  # the site entries' fused launches (plugin API 2.6; the two boundary kernels, PRE_IN)
                    w_norm = torch.rand(128, generator=g) + 0.5
                    dense.hc_site_norm(x, hc, pre, w_norm)
                    post, comb = (
                        torch.rand(T, 4, generator=g) * 2,
                        torch.rand(T, 4, 4, generator=g).softmax(-1),
                    )
                    dense.hc_post_site_norm(r(T, 128, dt=dt), x, post, comb, hc, pre, w_norm)
                    # the coefficients on a side stream (forked before the collapse)
                    with _arch("interpreter", hc_side_coeffs=True):
                        dense.hc_post_site_norm(r(T, 128, dt=dt), x, post, comb, hc, pre, w_norm)
                w = quantize_fp8_block(r(96, 128) * 0.1, "ue8m0", block=32)
                dense.linear(r(T, 128, dt=dt), w)
                w1, w3 = (quantize_fp8_block(r(64, 128) * 0.1, "ue8m0", block=32) for _ in range(2))
                w2 = quantize_fp8_block(r(128, 64) * 0.1, "ue8m0", block=32)
                dense.swiglu_mlp(r(T, 128, dt=dt), w1, w3, w2, 10.0)
                # the shared expert with the routed output added in its epilogue (plugin API 2.7): V4.1's 32 x 32
                # and V4's 128 x 128 FP8 blocks
                dense.swiglu_mlp_add(r(T, 128, dt=dt), w1, w3, w2, 10.0, r(T, 128, dt=dt))
                v1, v3 = (quantize_fp8_block(r(64, 128) * 0.1, "ue8m0") for _ in range(2))
                v2 = quantize_fp8_block(r(128, 64) * 0.1, "ue8m0")
                dense.swiglu_mlp_add(r(T, 128, dt=dt), v1, v3, v2, 10.0, r(T, 128, dt=dt))
                dense.engram_gate(
                    r(T, 4, 128, dt=dt), r(T, 4, 128, dt=dt), r(T, 128, dt=dt), r(4, 128), 1e-20
                )
                f = kv_formats("auto", 64, 64, dt)
                q = r(T, 8, 64, dt=dt)
                kv, cmp = f.window.pack(r(40, 64, dt=dt)), f.compressed.pack(r(20, 64, dt=dt))
                slots = torch.randint(0, 20, (T, 12), generator=g)
                for c, cf in ((cmp, f.compressed), (f.window.pack(r(20, 64, dt=dt)), None)):
                    attn.sparse_attention(
                        q, kv, slots, c, slots, r(8), 0.1, kv_format=f.window, cmp_format=cf
                    )
                # split-KV, its combine kernel with and without the output rotated back (plugin API 2.9)
                inv = 1.0 / 10000 ** (torch.arange(0, 16, 2).float() / 16)
                for unrope in (None, (torch.arange(T), inv)):
                    sparse_attention.sparse_attention(
                        q, kv, slots, cmp, slots, r(8), 0.1, splits=3, unrope=unrope,
                        kv_pack=sparse_attention.packed_layout(f.window, 64),
                        cmp_pack=sparse_attention.packed_layout(f.compressed, 64),
                    )  # fmt: skip
                # the query rotated (V4: normed first) as the kernel loads it (plugin API 2.10), split and not,
                # over V4.1's packed pools, plain pools and V4's FP8 pools
                v4 = Fp8KVFormat(64, 16, dt)
                pools = (
                    (kv, cmp, None, {"kv_pack": sparse_attention.packed_layout(f.window, 64),
                                     "cmp_pack": sparse_attention.packed_layout(f.compressed, 64)}),
                    (r(40, 64, dt=dt), r(20, 64, dt=dt), None, {}),
                    (v4.pack(r(40, 64, dt=dt)), v4.pack(r(20, 64, dt=dt)), v4, {}),
                )  # fmt: skip
                for pool_kv, pool_cmp, v4f, pack in pools:
                    for splits, eps in ((3, None), (1, None), (3, 1e-6), (1, 1e-6)):
                        sparse_attention.sparse_attention(
                            q, pool_kv, slots, pool_cmp, slots, r(8), 0.1, v4f, splits=splits,
                            unrope=(torch.arange(T), inv), rope_q=True, q_norm_eps=eps, **pack,
                        )  # fmt: skip
                for fmt in (f.window, f.compressed, f.keys):
                    pool = torch.zeros(8, fmt.row_bytes, dtype=torch.uint8)
                    attn.store_kv(pool, torch.arange(T) % 8, r(T, 64, dt=dt), fmt)
                    # normed, rotated and packed in one launch (plugin API 2.11)
                    attn.rms_norm_rope_store_kv(
                        r(T, 64, dt=dt),
                        r(64, dt=dt),
                        1e-6,
                        torch.arange(T),
                        inv,
                        pool,
                        torch.arange(T) % 8,
                        fmt,
                    )
                    attn.kv_roundtrip(r(T, 64, dt=dt), fmt)  # V4.1's index queries (plugin API 2.3)
                    # V4.1's index query rotated, round-tripped and its weights scaled in one launch (2.12)
                    attn.index_query(r(T, 8, 64, dt=dt), r(T, 8, dt=dt), 0.02, torch.arange(T), inv, fmt)
                attn.index_query(r(T, 8, 64, dt=dt), r(T, 8, dt=dt), 0.02, torch.arange(T), inv, None)
                # V4's KV row normed, rotated and stored into its plain pool in one launch (SCATTER)
                attn.rms_norm_rope_store_kv(
                    r(T, 64, dt=dt),
                    r(64, dt=dt),
                    1e-6,
                    torch.arange(T),
                    inv,
                    r(9, 64, dt=dt),
                    torch.arange(T) % 8,
                    None,
                )
                keys = f.keys.pack(r(20, 64, dt=dt))
                attn.indexer_scores(r(T, 8, 64, dt=dt), r(T, 8), keys, slots, key_format=f.keys)
                for width in (128, 2304, 5120):  # GEMM inputs under activation_quant="fp8" (experts: row_w)
                    act_quant.fp8_act_roundtrip(r(T, width, dt=dt))
                    act_quant.fp8_act_roundtrip(r(T * 6, width, dt=dt), row_w=torch.rand(T * 6, generator=g))
                    act_quant.fp8_act_codes(r(T, width, dt=dt))
                # the select kernel's threshold by digit histograms (settings.radix_select)
                with _arch("interpreter", radix_select=True):
                    sel = CudaAttentionOps()
                    sel.indexer_topk_slots(r(T, 8, 64, dt=dt), r(T, 8), keys, slots, 4, key_format=f.keys)
                # V4's FP8 KV, scales gathered per channel
                with _arch("interpreter", fp8_kv_scale_gather=True):
                    f8 = Fp8KVFormat(512, 64, dt)
                    kv8, cmp8 = f8.pack(r(40, 512, dt=dt)), f8.pack(r(20, 512, dt=dt))
                    q8 = r(T, 8, 512, dt=dt)
                    attn.sparse_attention(q8, kv8, slots, cmp8, slots, r(8), 0.1, kv_format=f8)
            # the sparse-attention tiles the GPU's tables pick for V4's FP8 rows and V4.1's packed entries at
            # 64 heads of 512 (dispatch.attention_config: every head in one program), one chunk, PDL off (the
            # interpreter has no griddepcontrol)
            with _arch("sm90", pdl=False):
                bf = torch.bfloat16
                f8, fv = Fp8KVFormat(512, 64, bf), kv_formats("auto", 512, 128, bf)
                q64, s64 = r(2, 64, 512, dt=bf), torch.randint(0, 20, (2, 40), generator=g)
                sparse_attention.sparse_attention(q64, f8.pack(r(20, 512, dt=bf)), s64, f8.pack(r(20, 512, dt=bf)),
                                                  s64, r(64), 0.1, f8, splits=1)  # fmt: skip
                sparse_attention.sparse_attention(
                    q64, fv.window.pack(r(20, 512, dt=bf)), s64, fv.compressed.pack(r(20, 512, dt=bf)), s64, r(64),
                    0.1, splits=1, kv_pack=sparse_attention.packed_layout(fv.window, 512),
                    cmp_pack=sparse_attention.packed_layout(fv.compressed, 512),
                )  # fmt: skip
            # V4's FP8 rows with their RoPE channels as a tile of their own (settings.fp8_kv_rope_apart), the
            # 64-head tile, one chunk and split-KV
            with _arch("sm90", pdl=False, fp8_kv_rope_apart=True):
                for splits in (1, 2):
                    sparse_attention.sparse_attention(q64, f8.pack(r(20, 512, dt=bf)), s64,
                                                      f8.pack(r(20, 512, dt=bf)), s64, r(64), 0.1, f8,
                                                      splits=splits)  # fmt: skip
            for width in (256, 8):  # an Engram table's codes and scales rows, read in the step
                table = torch.randint(0, 256, (30, width), generator=g, dtype=torch.uint8)
                host_rows(table, torch.randint(0, 30, (T * 4,), generator=g), torch.device("cpu"))
            # read and dequantised in one launch (plugin API 2.13), and the step's n-gram hashes
            codes = torch.randint(0, 120, (30, 256), generator=g, dtype=torch.uint8)
            scales = torch.randint(120, 130, (30, 8), generator=g, dtype=torch.uint8)
            for dt in (torch.bfloat16, torch.float32):
                host_rows_dequant(
                    codes, scales, torch.randint(0, 30, (T * 4,), generator=g), 32, dt, torch.device("cpu")
                )
            from deepinfer_core.testing.cases_dense import _engram_hashes

            CudaDenseOps().engram_hashes(*_engram_hashes(g)[0])
        for V in (
            129280,
            300,
        ):  # the keyed draw (plugin API 2.8): a real vocabulary a row; small ones, rows a program
            keyed = torch.randint(0, 2**40, (2, 3), generator=g)
            sampling.draw(torch.rand(3, V, generator=g), keyed[0], keyed[1])
        for V, k_used, p_used in [
            (129280, True, True),
            (129280, False, True),
            (129280, False, False),
            (300, True, True),
        ]:
            probs.probs(
                torch.randn(2, V, generator=g),
                torch.ones(2),
                torch.tensor([0, 50]),
                torch.full((2,), 0.9),
                torch.zeros(2),
                top_k_used=k_used,
                top_p_used=p_used,
            )  # fmt: skip (the sort-free probs)
        with _arch(
            "interpreter", probs_compact_first=True
        ):  # top-p over the non-negligible tokens, compacted first
            probs.probs(torch.randn(2, 129280, generator=g), torch.ones(2), torch.tensor([0, 50]),
                        torch.full((2,), 0.9), torch.zeros(2))  # fmt: skip
        from deepinfer_cuda_sm100.kernels import grouped_gemm as gg

        for (
            q
        ) in (  # prefill's dequantised weights (dispatch.dequant_gemm): V4's and V4.1's formats, 160 x 256
            quantize_fp8_block(r(160, 256) * 0.1),
            quantize_fp8_block(r(160, 256) * 0.1, "ue8m0", block=32),
            quantize_fp4_e2m1(r(160, 256) * 0.1),
        ):
            gg.dequantize(gg.WeightTable.build([q], torch.device("cpu")), torch.bfloat16)
        for T in (1, 16):  # device_plan's static plan (V4-Flash: window 128, ratios 4 overlapped and 128)
            pos = torch.arange(T, dtype=torch.int64) * 37 + 100
            tables = torch.arange(T * 32, dtype=torch.int64).view(T, 32)
            attn.static_plan(pos, tables, tables, 1, 128, ((4, True), (128, False)), 4096, 128)
        for where in (_arch("sm100"), _arch("sm90", fp8_mma=True)):  # the MX MMA, SM90's FP8 MMA path
            with where:
                for fmt in ("fp8", "fp4"):
                    w = r(96, 256) * 0.1
                    q = quantize_fp8_block(w, "ue8m0", block=32) if fmt == "fp8" else quantize_fp4_e2m1(w)
                    q.act_block = 32
                    dense.linear(r(160, 256, dt=torch.bfloat16), q)
                ws = []  # routed experts: the gated up projection (a_idx) and the down projection (c_idx)
                for o, i in [(64, 128)] * 8 + [(128, 64)] * 4:
                    q = quantize_fp4_e2m1(r(o, i) * 0.1)
                    q.act_block = 32
                    ws.append(q)
                experts = ExpertWeights(ws[0:4], ws[4:8], ws[8:12], [0, 1, 2, 3])
                ids = torch.stack([torch.randperm(4, generator=g)[:2] for _ in range(80)])
                CudaMoEOps().experts(
                    r(80, 128, dt=torch.bfloat16), ids, torch.rand(80, 2, generator=g), experts, 10.0
                )
    keep = (
        "_hc_coeffs_kernel",
        "_hc_collapse_kernel",
        "_pack_v41_kernel",
        "_roundtrip_v41_kernel",
        "_norm_rope_pack_v41_kernel",
        "_index_query_kernel",
        "_engram_hash_kernel",
        "_host_rows_dequant_kernel",
        "_host_rows_kernel",
        "_act_quant_kernel",
        "_mx_gemm_kernel",
        "_engram_gate_kernel",
        "_draw_rows_kernel",
        "_chunk_sums_kernel",
        "_draw_chunk_kernel",
        "_stats_kernel",
        "_softmax_kernel",
        "_radix_pass_kernel",
        "_cut_kernel",
        "_dequant_kernel",
        "_static_window_kernel",
        "_static_compression_kernel",
    )
    return {
        k: _as_on_a_gpu(dict(e, source="interpreter"))
        for k, e in store.items()
        if e["kernel"] in keep
        or e["constexprs"].get("SB") == 32
        or e["constexprs"].get("KV_PACK", 0) > 0
        or e["constexprs"].get("KEY_PACK", 0) > 0
        or e["constexprs"].get("PRE_IN") is True
        or e["constexprs"].get("HAS_ADD") is True
        or e["constexprs"].get("FP8") == 2
        or "UNROPE" in e["constexprs"]  # split-KV attention's combine (the MoE's has no such argument)
        or e["constexprs"].get("ROPE_Q") is True
        or e["constexprs"].get("SCATTER") is True
        or (e["kernel"] == "_sparse_attn_kernel" and e["constexprs"].get("BLOCK_H") == 64)
        or e["constexprs"].get("RADIX") is True
    }


def _as_on_a_gpu(e: dict) -> dict:
    """The 64-head attention tiles over bf16 queries with the bf16 dot a GPU launches them with (``dot_dtype``
    gives the interpreter float32 operands, whose tiles no GPU launch has at 64 heads of 512)."""
    if (
        e["kernel"] == "_sparse_attn_kernel"
        and e["constexprs"].get("BLOCK_H") == 64
        and e["signature"]["q_ptr"] == "*bf16"
    ):
        e = dict(e, constexprs=dict(e["constexprs"], DOT_T={"repr": "bf16"}))
    if (
        e["kernel"] == "_dequant_kernel"
    ):  # a GPU writes bf16 itself (the interpreter writes float32, torch rounds)
        fp4 = e["constexprs"]["FMT"] == 2  # and decodes ue8m0-scaled FP4 by PTX (dispatch.fp4_decode_ptx)
        e = dict(e, signature=dict(e["signature"], out_ptr="*bf16"),
                 constexprs=dict(e["constexprs"], DOT_T={"repr": "bf16"}, FP4_ASM=fp4))  # fmt: skip
    if e["kernel"] in (
        "_static_window_kernel",
        "_static_compression_kernel",
    ):  # a decode step's: PDL on SM90+
        e = dict(e, constexprs=dict(e["constexprs"], PDL=True))
    return e


def main() -> None:
    m = json.loads(lm.MANIFEST.read_text())
    have = {json.dumps(e, sort_keys=True) for e in m["entries"]}
    added = [e for e in v41_launches().values() if json.dumps(e, sort_keys=True) not in have]
    m["entries"] = sorted(m["entries"] + added, key=lambda e: json.dumps(e, sort_keys=True))
    m["meta"]["interpreter_entries"] = NOTE
    lm.MANIFEST.write_text(json.dumps(m, indent=1) + "\n")
    print(f"{len(added)} entries added: {sorted({e['kernel'] for e in added})}")


if __name__ == "__main__":
    main()
