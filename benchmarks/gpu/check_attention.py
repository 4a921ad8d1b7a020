"""Attention checks of ``check.py``: sparse attention (bf16 and FP8 pools, split-KV decode), the indexer's
scores and top-k, the compressor (direct and from the state pool)."""

# ruff: noqa: B023 - every lambda here is called before its loop variables change
from __future__ import annotations

from dataclasses import replace

from check_common import (  # noqa: E402 - after check_common has set TRITON_INTERPRET for --smoke
    BF16,
    BOUND,
    DEV,
    F32,
    HEAD_DIM,
    HEADS,
    IDX_DIM,
    IDX_HEADS,
    IDX_TOPK,
    ROPE_DIM,
    SMOKE,
    WINDOW,
    G,
    bench,
    bench_graph,
    poisoned,
    record,
    rel_err,
    rnd,
    sizes,
    torch,
)

from deepinfer_core.ops.kv_fp8 import Fp8KVFormat  # noqa: E402
from deepinfer_core.ops.reference import reference_op  # noqa: E402
from deepinfer_cuda_sm100 import dispatch, settings  # noqa: E402
from deepinfer_cuda_sm100.ops.attention import CudaAttentionOps  # noqa: E402

#: query rows of the sparse-attention rows, bf16 and FP8 side by side; from ``dispatch.UNPACK_DISTINCT_ROWS`` rows
#: (the prefill rows) FP8 entries are unpacked once each before the plain kernel
ATTN_T = (16, 64, 256, 2048, 2048)
ATTN_TAGS = ("check", "decode", "decode", "prefill", "prefill_shared")


def slot_lists(T, tag, S, C):
    """``[T, WINDOW]`` window and ``[T, IDX_TOPK]`` compressed slots, some padding: random over the pools, or (a
    real prefill chunk, ``prefill_shared``) sliding windows over consecutive slots and ``T / 4`` entries."""
    kv_slots = torch.randint(0, S, (T, WINDOW), device=DEV, generator=G)
    cmp_slots = torch.randint(0, C, (T, IDX_TOPK), device=DEV, generator=G)
    if tag == "prefill_shared":
        t = torch.arange(T, device=DEV)
        kv_slots = (t[:, None] + torch.arange(WINDOW, device=DEV)[None, :]) % S
        cmp_slots = cmp_slots % max(1, min(C, T // 4))
    kv_slots[0, 100:] = -1
    cmp_slots[1, 300:] = -1
    return kv_slots, cmp_slots


def check_attention():
    ops, ref = CudaAttentionOps(), reference_op("attention")
    S = 1 << 20 if not SMOKE else 512
    kv_pool, cmp_pool, sinks = rnd(S, HEAD_DIM), rnd(S // 4, HEAD_DIM), rnd(HEADS, dtype=F32)
    scale = HEAD_DIM**-0.5
    for T, tag in zip(sizes(*ATTN_T), ATTN_TAGS):
        q = rnd(T, HEADS, HEAD_DIM)
        kv_slots, cmp_slots = slot_lists(T, tag, S, S // 4)
        args = (q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale)
        out = poisoned(lambda: ops.sparse_attention(*args))
        err = rel_err(out, ref.sparse_attention(*args)) if tag == "check" else None
        n = WINDOW + IDX_TOPK
        record(f"sparse_attention[{tag}]", f"T={T} H={HEADS} D={HEAD_DIM} slots={n}", err, BOUND["bf16"],
               bench(lambda: ops.sparse_attention(*args)), T * n * HEAD_DIM * 2 + 2 * q.numel() * 2,
               4 * T * HEADS * n * HEAD_DIM)  # fmt: skip
    check_split_kv(kv_pool, cmp_pool, sinks, scale, ref)
    check_fp8_kv(ops, ref, kv_pool, cmp_pool, sinks, scale)
    keys = rnd(S // 4, IDX_DIM)
    for T, C in zip(sizes(8, 64, 64), (8192, 8192, 65536) if not SMOKE else (64, 64, 96)):
        q, w = rnd(T, IDX_HEADS, IDX_DIM), rnd(T, IDX_HEADS, dtype=F32).abs() * IDX_HEADS**-0.5
        cand = torch.randint(0, S // 4, (T, C), device=DEV, generator=G)
        cand[0, C // 2 :] = -1
        from deepinfer_cuda_sm100.kernels import indexer

        sc = poisoned(lambda: indexer.indexer_scores(q, w, keys, cand))
        err = None
        if T == 8:
            kf = keys.double()[cand.clamp(min=0)]
            exact = (torch.relu(torch.einsum("thd,tcd->thc", q.double(), kf)) * w.double()[..., None]).sum(1)
            valid = cand >= 0
            err = rel_err(sc[valid], exact[valid])
            got, rsel = (
                ops.indexer_topk(q, w, keys, cand, IDX_TOPK),
                ref.indexer_topk(q, w, keys, cand, IDX_TOPK),
            )
            overlap = min(len(set(got[t].tolist()) & set(rsel[t].tolist())) / IDX_TOPK for t in range(T))
            print(f"indexer top-{IDX_TOPK}: min overlap with reference selection {overlap:.4f}", flush=True)
        by, fl = T * C * IDX_DIM * 2 + T * C * 12, 2 * T * C * IDX_HEADS * IDX_DIM
        record("indexer_scores", f"T={T} C={C} Hi={IDX_HEADS} Di={IDX_DIM}", err, BOUND["bf16"],
               bench(lambda: indexer.indexer_scores(q, w, keys, cand)), by, fl)  # fmt: skip
        record("indexer_topk (scores+torch.topk)", f"T={T} C={C} k={IDX_TOPK}", None, None,
               bench(lambda: ops.indexer_topk(q, w, keys, cand, IDX_TOPK)), by, fl)  # fmt: skip
        if C <= 16384:  # the select kernel (off by default on GPUs until this row has been seen)
            k = min(IDX_TOPK, C)
            mine = poisoned(lambda: indexer.select_topk(sc, k))
            val, idx = torch.topk(sc, k, dim=1)
            same = all(
                torch.equal(
                    sc[t, mine[t][mine[t] >= 0]].sort().values, val[t][val[t] > float("-inf")].sort().values
                )
                for t in range(T)
            )
            record("indexer select kernel vs torch.topk", f"T={T} C={C} k={k}", 0.0 if same else float("inf"),
                   BOUND["f32"], bench(lambda: indexer.select_topk(sc, k)), T * C * 4,
                   note=f"torch.topk {bench(lambda: torch.topk(sc, k, dim=1, sorted=False)) * 1e3:.1f} us")  # fmt: skip
            # the threshold by digit histograms (settings.radix_select), against the same torch.topk
            active = settings.active()
            settings.use(active.model_copy(update={"radix_select": True}))
            mine = poisoned(lambda: indexer.select_topk(sc, k))
            same = all(
                torch.equal(
                    sc[t, mine[t][mine[t] >= 0]].sort().values, val[t][val[t] > float("-inf")].sort().values
                )
                for t in range(T)
            )
            record("indexer select kernel, radix, vs torch.topk", f"T={T} C={C} k={k}",
                   0.0 if same else float("inf"), BOUND["f32"], bench(lambda: indexer.select_topk(sc, k)), T * C * 4)  # fmt: skip
            settings.use(active)
    check_select_one_row()
    inv_freq = 1.0 / (10000 ** (torch.arange(0, ROPE_DIM, 2, device=DEV).float() / ROPE_DIM))
    nw = rnd(HEAD_DIM, dtype=F32)
    for E, L in zip(sizes(16, 2048, 64), (8, 8, 128) if not SMOKE else (8, 8, 16)):
        kv, score = rnd(E, L, HEAD_DIM), rnd(E, L, HEAD_DIM, dtype=F32)
        score[0, L // 2 :] = float("-inf")
        pos = torch.randint(0, 1 << 20, (E,), device=DEV, generator=G)
        out = poisoned(lambda: ops.compress(kv, score, nw, 1e-6, pos, inv_freq))
        err = rel_err(out, ref.compress(kv, score, nw, 1e-6, pos, inv_freq)) if E == 16 else None
        record("compress", f"E={E} L={L} D={HEAD_DIM}", err, BOUND["bf16"],
               bench(lambda: ops.compress(kv, score, nw, 1e-6, pos, inv_freq)), E * L * HEAD_DIM * 6 + E * HEAD_DIM * 2)  # fmt: skip
    check_compress_into(ref, nw, inv_freq)
    check_v41_one_launch(ops, inv_freq)


def check_select_one_row():
    """The select kernel at batch-1 decode (one row; the V4.1 slice's 4k context: a few thousand candidates),
    bisection against digit histograms (``settings.radix_select``), graphed as in a step: the same scores as
    ``torch.topk``."""
    from deepinfer_cuda_sm100.kernels import indexer

    active = settings.active()
    for C in (2048, 4096) if not SMOKE else (96,):
        sc = rnd(1, C, dtype=F32)
        k = min(IDX_TOPK, C // 2)
        want = torch.topk(sc, k, dim=1).values.sort().values
        for radix in (False, True):
            settings.use(active.model_copy(update={"radix_select": radix}))
            got = poisoned(lambda: indexer.select_topk(sc, k))
            same = torch.equal(sc[0, got[0]].sort().values, want[0])
            record(f"indexer select kernel, one row, {'radix' if radix else 'bisection'}", f"C={C} k={k}",
                   0.0 if same else float("inf"), BOUND["f32"], bench_graph(lambda: indexer.select_topk(sc, k)),
                   C * 4)  # fmt: skip
    settings.use(active)


def check_v41_one_launch(ops, inv_freq):
    """V4.1's steps in one launch, byte for byte against the launches they replace, at V4.1-Flash's index query
    (32 heads x 128) and head (512) widths: the index query rotated, round-tripped through the keys' FP4
    format and its weights scaled (``index_query``, 2.12) against rope + round trip + torch; the window KV row
    normed, rotated and packed (``rms_norm_rope_store_kv``, 2.11) against norm-rope + store, and V4's into its
    plain pool."""
    from deepinfer_core.models.deepseek_v41.kv_formats import kv_formats
    from deepinfer_cuda_sm100.kernels import kv_store, norm_rope

    fmts = kv_formats("auto", HEAD_DIM, 128, BF16)
    for T in sizes(1, 64):
        q, w = rnd(T, 32, 128), rnd(T, 32)
        pos = torch.randint(0, 1 << 16, (T,), device=DEV, generator=G)
        got_q, got_w = poisoned(lambda: ops.index_query(q, w, 0.0156, pos, inv_freq, fmts.keys))
        two = kv_store.roundtrip_v41(norm_rope.rope(q, pos, inv_freq).reshape(-1, 128), fmts.keys).view(
            q.shape
        )
        same = torch.equal(got_q.view(torch.int16), two.view(torch.int16)) and torch.equal(
            got_w, w.float() * 0.0156
        )
        record("index_query (one launch) vs rope + roundtrip + torch", f"T={T} Hi=32 Di=128",
               0.0 if same else float("inf"), BOUND["f32"],
               bench(lambda: ops.index_query(q, w, 0.0156, pos, inv_freq, fmts.keys)), T * 32 * (128 * 4 + 6),
               note="separate: " + f"{bench(lambda: (kv_store.roundtrip_v41(norm_rope.rope(q, pos, inv_freq).reshape(-1, 128), fmts.keys), w.float() * 0.0156)) * 1e3:.1f} us")  # fmt: skip
        x, nwt = rnd(T, HEAD_DIM), rnd(HEAD_DIM)
        slots = torch.randperm(4 * T, device=DEV, generator=G)[:T]
        one = torch.zeros(4 * T + 1, fmts.window.row_bytes, dtype=torch.uint8, device=DEV)
        two = one.clone()
        ops.rms_norm_rope_store_kv(x, nwt, 1e-6, pos, inv_freq, one, slots, fmts.window)
        rows = norm_rope.rms_norm_rope(x[:, None], nwt, 1e-6, pos, inv_freq)[:, 0]
        kv_store.store_v41(two, slots, rows, fmts.window)
        record("rms_norm_rope_store_kv (one launch) vs norm-rope + store", f"T={T} D={HEAD_DIM}",
               0.0 if torch.equal(one, two) else float("inf"), BOUND["f32"],
               bench(lambda: ops.rms_norm_rope_store_kv(x, nwt, 1e-6, pos, inv_freq, one, slots, fmts.window)),
               T * (HEAD_DIM * 2 + fmts.window.row_bytes))  # fmt: skip
        # V4's plain (bf16) pool: normed, rotated and stored by one program a row
        one = rnd(4 * T + 1, HEAD_DIM)
        two = one.clone()
        ops.rms_norm_rope_store_kv(x, nwt, 1e-6, pos, inv_freq, one, slots, None)
        kv_store.store_plain(two, slots, rows)
        record("rms_norm_rope_store_kv plain pool (one launch) vs norm-rope + store", f"T={T} D={HEAD_DIM}",
               0.0 if torch.equal(one, two) else float("inf"), BOUND["f32"],
               bench(lambda: ops.rms_norm_rope_store_kv(x, nwt, 1e-6, pos, inv_freq, one, slots, None)),
               T * HEAD_DIM * 4)  # fmt: skip


def check_compress_into(ref, nw, inv_freq):
    """``compress_into`` from the state pool at decode (one window per token), in a graph: HCA's 128-row windows
    in chunks against one program per window, and CSA's 8-row overlapping windows."""
    from deepinfer_cuda_sm100.kernels import compressor

    S = 4096
    for E, L, overlap in ((1, 128, False), (16, 128, False), (1, 8, True), (16, 8, True)):
        C = 2 * HEAD_DIM if overlap else HEAD_DIM
        state = rnd(S, 2, C, dtype=F32)
        src = torch.randint(0, S, (E, L), device=DEV, generator=G)
        src[0, : L // 2] = -1
        pos = torch.randint(0, 1 << 20, (E,), device=DEV, generator=G)
        slots = torch.randperm(S, device=DEV, generator=G)[:E]
        out = torch.zeros(S, HEAD_DIM, dtype=BF16, device=DEV)
        args = (state, src, overlap, nw, 1e-6, pos, inv_freq)
        want = out.clone()
        ref.compress_into(*args, want, slots, None)
        compressor.compress_from_state(*args, out, slots)
        cfg = dispatch.compress_config(L, HEAD_DIM)
        one = bench_graph(lambda: compressor.compress_from_state(*args, out, slots, 1))
        record("compress_into[graph]", f"E={E} L={L} D={HEAD_DIM} splits={dispatch.compress_splits(E, L, cfg.block_l)}",
               rel_err(out[slots], want[slots]), BOUND["bf16"],
               bench_graph(lambda: compressor.compress_from_state(*args, out, slots)), E * L * C * 8,
               note=f"one program per window: {one * 1e3:.1f} us")  # fmt: skip


def check_split_kv(kv_pool, cmp_pool, sinks, scale, ref):
    """Split-KV decode at the few-token sizes it is chosen for, in a graph, against one program per head block."""
    import deepinfer_cuda_sm100.kernels.sparse_attention as sa

    S = kv_pool.shape[0]
    for T in sizes(1, 4, 16, 32):
        q = rnd(T, HEADS, HEAD_DIM)
        kv_slots = torch.randint(0, S, (T, WINDOW), device=DEV, generator=G)
        cmp_slots = torch.randint(0, S // 4, (T, IDX_TOPK), device=DEV, generator=G)
        cmp_slots[0, 200:] = -1
        args = (q, kv_pool, kv_slots, cmp_pool, cmp_slots, sinks, scale)
        cfg = dispatch.attention_config(T, HEADS, HEAD_DIM, WINDOW + IDX_TOPK)
        splits = dispatch.attention_splits(T * -(-HEADS // cfg.block_h), WINDOW + IDX_TOPK, cfg.block_n)
        out = poisoned(lambda: sa.sparse_attention(*args))
        one = bench_graph(lambda: sa.sparse_attention(*args, splits=1))
        n = WINDOW + IDX_TOPK
        record("sparse_attention split-KV[graph]", f"T={T} splits={splits}", rel_err(out, ref.sparse_attention(*args)),
               BOUND["bf16"], bench_graph(lambda: sa.sparse_attention(*args)), T * n * HEAD_DIM * 2,
               note=f"one program per head block: {one * 1e3:.1f} us")  # fmt: skip


def check_fp8_kv(ops, ref, kv_pool, cmp_pool, sinks, scale):
    """Sparse attention over FP8-packed pools (against the reference reading the same bytes) and the packing
    store (byte-equal to ``Fp8KVFormat.pack``)."""
    fmt = Fp8KVFormat(HEAD_DIM, ROPE_DIM, BF16)
    kv8, cmp8 = fmt.pack(kv_pool), fmt.pack(cmp_pool)
    S = kv8.shape[0]
    active = settings.active()
    real_config = dispatch.attention_config
    # the kernel's two ways of scaling the codes side by side (dispatch.fp8_kv_mode), and the gathered scales with
    # the bf16 pool's 64-slot tiles (dispatch.attention_config gives FP8 pools 32: the reshapes' registers overflowed
    # shared memory at 64, v8), which may not compile: then the row says so; and the RoPE channels as a tile of their
    # own (settings.fp8_kv_rope_apart)
    for gather, slots64, apart in (
        (False, False, False),
        (False, False, True),
        (True, False, False),
        (True, True, False),
    ):
        settings.use(active.model_copy(update={"fp8_kv_scale_gather": gather, "fp8_kv_rope_apart": apart}))
        if slots64:
            dispatch.attention_config = lambda *a, **k: replace(real_config(*a, **k), block_n=64)
        name = (
            "sparse_attention fp8 KV"
            + (" scales gathered" if gather else "")
            + (", 64 slots" if slots64 else "")
            + (", RoPE apart" if apart else "")
        )
        try:
            for T, tag in zip(sizes(*ATTN_T), ATTN_TAGS):
                q = rnd(T, HEADS, HEAD_DIM)
                kv_slots, cmp_slots = slot_lists(T, tag, S, cmp8.shape[0])
                args = (q, kv8, kv_slots, cmp8, cmp_slots, sinks, scale, fmt)
                # from UNPACK_DISTINCT_ROWS rows: unpacked once
                out = poisoned(lambda: ops.sparse_attention(*args))
                err = rel_err(out, ref.sparse_attention(*args)) if tag != "decode" else None
                n = WINDOW + IDX_TOPK
                record(f"{name}[{tag}]", f"T={T} H={HEADS} D={HEAD_DIM} slots={n}", err, BOUND["bf16"],
                       bench(lambda: ops.sparse_attention(*args)), T * n * fmt.row_bytes + 2 * q.numel() * 2,
                       4 * T * HEADS * n * HEAD_DIM)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - a tile that does not fit is a finding, not a failed check
            if not slots64:
                raise
            record(f"{name}[does not compile]", type(e).__name__, note=str(e)[:200])
        finally:
            dispatch.attention_config = real_config
    settings.use(active)
    for n in sizes(64, 4096):
        vals, slots = rnd(n, HEAD_DIM), torch.randperm(S, device=DEV, generator=G)[:n]
        pool = torch.zeros_like(kv8)
        ops.store_kv(pool, slots, vals, fmt)
        same = torch.equal(pool[slots], fmt.pack(vals))
        record("store_kv fp8 (pack + scatter)", f"N={n} D={HEAD_DIM}", 0.0 if same else float("inf"), BOUND["f32"],
               bench(lambda: ops.store_kv(pool, slots, vals, fmt)), n * (HEAD_DIM * 2 + fmt.row_bytes),
               note=f"torch pack {bench(lambda: pool.index_copy_(0, slots, fmt.pack(vals))) * 1e3:.1f} us")  # fmt: skip
