"""The V4-Flash-shaped slice: its config, random weights in DeepSeek's formats read through the real
checkpoint loader, the byte and FLOP model of a step, and a runner that builds decode batches by hand.

Used by ``benchmarks/gpu/v4_slice.py`` (GPU) and ``benchmarks/plan_cost.py`` (CPU, ``toy`` sizes).
"""

from __future__ import annotations

import math

import torch

FLASH = dict(
    vocab_size=129280,
    hidden_size=4096,
    num_attention_heads=64,
    num_key_value_heads=1,
    head_dim=512,
    q_lora_rank=1024,
    qk_rope_head_dim=64,
    o_groups=8,
    o_lora_rank=1024,
    sliding_window=128,
    index_n_heads=64,
    index_head_dim=128,
    index_topk=512,
    n_routed_experts=256,
    n_shared_experts=1,
    num_experts_per_tok=6,
    moe_intermediate_size=2048,
    scoring_func="sqrtsoftplus",
    routed_scaling_factor=1.5,
    swiglu_limit=10.0,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1e-6,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    compress_rope_theta=160000.0,
    rope_scaling={
        "rope_type": "yarn",
        "factor": 16.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    max_position_embeddings=65536,
    num_nextn_predict_layers=0,
    eos_token_id=1,
    bos_token_id=0,
    tie_word_embeddings=False,
)
RATIOS = [0, 4, 128, 4, 128, 4, 0, 4]  # sliding, CSA, HCA, CSA, ...


TOY = dict(
    vocab_size=129280,
    hidden_size=128,
    num_attention_heads=4,
    head_dim=64,
    q_lora_rank=64,
    qk_rope_head_dim=16,
    o_groups=2,
    o_lora_rank=32,
    index_n_heads=4,
    index_head_dim=32,
    index_topk=8,
    n_routed_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
)


def slice_raw(layers: int, hash_layers: int = 2, toy: bool = False) -> dict:
    """``config.json`` of the slice (``toy``: small widths, same layer kinds, for CPU checks)."""
    return {
        "architectures": ["DeepseekV4ForCausalLM"],
        "model_type": "deepseek_v4",
        **FLASH,
        **(TOY if toy else {}),
        "num_hidden_layers": layers,
        "compress_ratios": RATIOS[:layers] + [0],
        "num_hash_layers": min(hash_layers, layers),
    }


class RandomReader:
    """A checkpoint reader over random tensors in DeepSeek's formats, made on the GPU on demand."""

    def __init__(self, model, device, experts: str = "fp4"):
        from deepinfer_core.models.deepseek_v4.convert import FP8_LINEARS, ROUTED_EXPERT

        self.path, self.device, self.g = "<random>", device, torch.Generator(device).manual_seed(0)
        self.slots = dict(model.named_slots())
        self.meta: dict[str, tuple[str, tuple[int, ...], str]] = {}
        for name, s in self.slots.items():
            if s.kind == "linear" and ROUTED_EXPERT.match(name) and experts == "fp4":
                self._pair(name, "fp4", s.shape)
            elif s.kind == "linear" and (FP8_LINEARS.match(name) or ROUTED_EXPERT.match(name)):
                self._pair(name, "fp8", s.shape)
            else:
                dt = {"float32": "F32", "index": "I64"}.get(s.kind, "BF16")
                self.meta[name] = (dt, tuple(s.shape), "plain")

    def _pair(self, name, fmt, shape):
        out_f, in_f = shape
        base = name[: -len(".weight")]
        if fmt == "fp8":
            self.meta[name] = ("F8_E4M3", (out_f, in_f), "fp8")
            self.meta[f"{base}.scale"] = ("F32", (-(-out_f // 128), -(-in_f // 128)), "fp8_scale")
        else:
            self.meta[name] = ("U8", (out_f, in_f // 2), "fp4")
            self.meta[f"{base}.scale"] = ("F8_E8M0", (out_f, in_f // 32), "fp4_scale")

    def keys(self):
        return list(self.meta)

    def file_of(self, key):
        return "random.safetensors"

    def info(self, key):
        dt, shape, _ = self.meta[key]
        return dt, shape

    def get(self, key) -> torch.Tensor:
        dt, shape, kind = self.meta[key]
        d, g = self.device, self.g
        if kind == "fp8":
            return torch.randn(shape, device=d, generator=g).to(torch.float8_e4m3fn)
        if kind == "fp8_scale":
            in_f = self.meta[key[: -len(".scale")] + ".weight"][1][1]
            return torch.full(shape, in_f**-0.5, device=d)
        if kind == "fp4":
            return torch.randint(0, 256, shape, device=d, generator=g, dtype=torch.uint8)
        if kind == "fp4_scale":
            in_f = 2 * self.meta[key[: -len(".scale")] + ".weight"][1][1]
            e = round(math.log2(0.5 * in_f**-0.5))
            return torch.full(shape, 2.0**e, device=d).to(torch.float8_e8m0fnu)
        if dt == "I64":  # hash routing table: k distinct experts per token
            n_exp = self.slots[key].shape[1]
            n_routed = int(self.slots[key.replace("tid2eid", "weight")].shape[0])
            rows = torch.rand(shape[0], n_routed, device=d, generator=g).argsort(dim=1)[:, :n_exp]
            return rows
        t = torch.randn(shape, device=d, generator=g)
        leaf = key.rsplit(".", 1)[-1]
        if len(shape) == 1 and ("norm" in key or leaf == "scale" or key.endswith("_scale")):
            return torch.ones(shape, device=d)
        if len(shape) >= 2 and dt == "F32":
            return t * 0.05
        if dt == "BF16":
            return (t * shape[-1] ** -0.5).to(torch.bfloat16)
        return t * 0.1


def build_slice(layers: int, backends, dtype=torch.bfloat16, toy: bool = False, mtp: int = 0):
    from deepinfer_core.models.deepseek_v4.config import DeepseekV4Config
    from deepinfer_core.models.deepseek_v4.loader import load_weights
    from deepinfer_core.models.deepseek_v4.model import DeepseekV4ForCausalLM

    cfg = DeepseekV4Config.from_dict({**slice_raw(layers, toy=toy), "num_nextn_predict_layers": mtp})
    model = DeepseekV4ForCausalLM(cfg, backends, dtype, mtp)
    load_weights(model, RandomReader(model, backends.memory.device), dtype, backends.memory.device)
    return model


def weight_bytes(model, skip=lambda name: False) -> dict[str, float]:
    """Bytes of the routed experts (per expert per layer), of the embedding, and of everything else; slots whose
    name ``skip`` accepts are left out (V4.1: the DSpark stages and the host-resident Engram tables)."""
    from deepinfer_core.ops.weights import QuantizedWeight

    def nbytes(v) -> int:
        if isinstance(
            v, QuantizedWeight
        ):  # FP4 scales as the ue8m0 bytes the kernels read (float32 in the model)
            per_scale = 1 if v.format == "fp4_e2m1" else v.scale.element_size()
            return v.data.numel() * v.data.element_size() + v.scale.numel() * per_scale
        if isinstance(v, torch.Tensor):
            return v.numel() * v.element_size()
        if isinstance(v, (list, tuple)):
            return sum(nbytes(x) for x in v)
        return 0

    expert = other = embed = 0
    for name, s in model.named_slots():
        if skip(name):
            continue
        b = nbytes(s.value)
        if ".ffn.experts." in name:
            expert += b
        elif name == "embed.weight":
            embed += b
        else:
            other += b
    n_moe = model.cfg.num_hidden_layers * model.cfg.n_routed_experts
    return {"per_expert": expert / n_moe, "other": other, "embed_row": embed / model.cfg.vocab_size}


def kv_bytes_per_row(cfg, ctx: int, elt: int = 2, entry: int | None = None) -> float:
    """KV bytes one decode row reads; ``entry``: bytes of one attention KV entry (608 with an FP8 KV cache)."""
    entry = cfg.head_dim * elt if entry is None else entry
    total = 0.0
    for r in cfg.compress_ratios[: cfg.num_hidden_layers]:
        total += cfg.sliding_window * entry
        if r == 4:
            n = ctx // 4
            total += n * cfg.index_head_dim * elt + min(cfg.index_topk, n) * entry
        elif r:
            total += (ctx // r) * entry
    return total


def step_bytes(cfg, wb, batch: int, kv_row: float) -> float:
    """Bytes a decode step of ``batch`` rows reads: the weights (``wb``, :func:`weight_bytes`; each routed expert
    counted once if any row picks it, under uniform routing), one embedding row and ``kv_row`` KV bytes a row."""
    e, k = cfg.n_routed_experts, cfg.num_experts_per_tok
    touched = e * (1 - (1 - k / e) ** batch)
    return (
        wb["other"] + cfg.num_hidden_layers * touched * wb["per_expert"] + batch * (wb["embed_row"] + kv_row)
    )


def decode_bytes(cfg, wb, batch: int, ctx: int, entry: int | None = None) -> float:
    return step_bytes(cfg, wb, batch, kv_bytes_per_row(cfg, ctx, entry=entry))


def prefill_flops(cfg, tokens: int) -> float:
    """2 x multiply-adds: weights active per token, attention over window + selected / all entries, indexer."""
    h, d, hid = cfg.num_attention_heads, cfg.head_dim, cfg.hidden_size
    attn_w = (
        hid * cfg.q_lora_rank
        + cfg.q_lora_rank * h * d
        + hid * d
        + cfg.o_groups * cfg.o_lora_rank * (h * d // cfg.o_groups)
        + hid * cfg.o_groups * cfg.o_lora_rank
    )
    ffn_w = 3 * hid * cfg.moe_intermediate_size * (cfg.num_experts_per_tok + cfg.n_shared_experts)
    per_layer = 2 * tokens * (attn_w + ffn_w)
    total = 0.0
    for r in cfg.compress_ratios[: cfg.num_hidden_layers]:
        total += per_layer + 4 * tokens * h * d * cfg.sliding_window
        if r == 4:
            total += 2 * tokens * cfg.q_lora_rank * cfg.index_n_heads * cfg.index_head_dim
            total += 2 * tokens * (tokens // 4) / 2 * cfg.index_n_heads * cfg.index_head_dim
            total += 4 * tokens * h * d * cfg.index_topk
        elif r:
            total += 4 * tokens * h * d * (tokens // r) / 2
    return total  # (the logits of the last row only: negligible)


class SliceRunner:
    """The engine's ModelRunner over the slice, with KV pools for ``max_batch`` rows of ``max_ctx`` tokens;
    decode batches are built by hand (block tables as the KV manager would hand them out)."""

    def __init__(self, model, backends, max_batch: int, max_ctx: int, graphs: bool, prefill: int = 0):
        """Pools for ``max_batch`` sequences of ``max_ctx`` tokens, and for one ``prefill``-token prompt
        (:meth:`prefill_batch` gives it a window and a compressed block per column)."""
        from deepinfer_core.engine.model_runner import ModelRunner
        from deepinfer_core.kv.budget import KVLayout, choose_block_size, group_block_bytes

        specs = model.cache_specs()
        self.bs = choose_block_size(specs, 128)
        self.win_blocks = 3
        self.cmp_blocks = -(-max_ctx // self.bs)
        cols = -(-prefill // self.bs)
        num = {
            "window": max(max_batch * self.win_blocks, cols),
            "compressed": max(max_batch * self.cmp_blocks, cols),
        }
        self.num_blocks = num
        layout = KVLayout(self.bs, num, group_block_bytes(specs, self.bs))
        self.runner = ModelRunner(model, backends, layout, max(max_ctx, prefill))
        if graphs:  # static decode steps, captured where the platform captures graphs
            self.runner.static_decode(max_batch, capture=backends.memory.supports_graphs)
        self.model, self.device = model, backends.memory.device

    def batch(self, batch: int, ctx: int, graph: bool):
        from deepinfer_core.models.batch import ForwardBatch

        p = ctx - 1
        ncol = p // self.bs + 1
        win = torch.full((batch, ncol), -1, dtype=torch.int64)
        for c in range(max(0, ncol - self.win_blocks), ncol):
            win[:, c] = torch.arange(batch) * self.win_blocks + (c % self.win_blocks)
        cmp = torch.arange(batch)[:, None] * self.cmp_blocks + torch.arange(ncol)[None, :]
        key = self.runner.graph_key(batch, p) if graph else None
        rows = key[0] if key else batch
        pad = rows - batch
        win = torch.cat([win, torch.full((pad, ncol), -1, dtype=torch.int64)])
        cmp = torch.cat([cmp, torch.full((pad, ncol), -1, dtype=torch.int64)])
        pos = torch.tensor([p] * batch + [-1] * (rows - batch))
        fb = ForwardBatch(
            input_ids=torch.randint(2, self.model.vocab_size, (rows,)),
            positions=pos,
            query_start_loc=torch.arange(rows + 1),
            context_lens=pos + 1,
            block_tables={"window": win, "compressed": cmp},
            block_size=self.bs,
            logits_indices=torch.arange(rows),
        )
        if key is not None:
            fb.graph_key, fb.num_real_rows = key, batch
        fb.plan = self.model.plan(fb, key[1] if key else None)
        return fb

    def prefill_batch(self, tokens: int):
        from deepinfer_core.models.batch import ForwardBatch

        ncol = -(-tokens // self.bs)
        if min(self.num_blocks.values()) < ncol:
            raise ValueError(f"a {tokens}-token prefill needs {ncol} blocks a pool; the pools have {self.num_blocks}: "
                             "build the SliceRunner with prefill=tokens")  # fmt: skip
        # the whole prompt's window state is written in one step: it needs a window block per column
        win = torch.arange(ncol)[None, :]
        cmp = torch.arange(ncol)[None, :]
        fb = ForwardBatch(
            input_ids=torch.randint(2, self.model.vocab_size, (tokens,)),
            positions=torch.arange(tokens),
            query_start_loc=torch.tensor([0, tokens]),
            context_lens=torch.tensor([tokens]),
            block_tables={"window": win, "compressed": cmp},
            block_size=self.bs,
            logits_indices=torch.tensor([tokens - 1]),
        )
        fb.plan = self.model.plan(fb, None)
        return fb
