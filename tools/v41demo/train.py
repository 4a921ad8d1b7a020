"""Train, evaluate and export the V4.1 demo model with the engine's own V4.1 modules.

The model *is* :class:`~deepinfer_core.models.deepseek_v41.model.DeepseekV41ForCausalLM`: every slot holds a
trainable float32 tensor instead of a stored FP8 / FP4 one, the Engram tables are trainable float tables, and
the ops are the batched, differentiable twins of the reference ops (:mod:`v41demo.ops`). A training step is one
prefill of ``batch`` sequences through a fresh :class:`~deepinfer_core.testing.kv_harness.PagedKVHarness`,
unquantized KV, so the function trained is the function the engine runs (up to the FP8 / FP4 rounding of the
export and of the KV cache). What does not get gradients: the indexers (their top-k selection is not
differentiable; they keep their initialisation, as in the V4 demo) and the routers' correction biases
(aux-loss-free balancing: ``bias += bias_update * sign(mean load - load)`` after every step).

DSpark is trained on the target's taps (detached: the draft head does not change the target). For ``anchors``
random positions ``p`` of each sequence, the block ``[x[p+1], noise, ...]`` runs through the stages against the
stages' window KV of positions ``<= p`` (written from the taps of every position, as the proposer writes it);
slot ``i`` predicts ``x[p+2+i]`` from its base logits plus the Markov bias of the true previous token (teacher
forcing), and the confidence head learns whether slot ``i``'s argmax is right (binary cross-entropy).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from v41golden import configs, engram_rows, hf_config, layout, stored
from v41golden.checkpoint_files import write_shards
from v41golden.configs import NOISE_TOKEN, TinySpec
from v41golden.files import write_json

from deepinfer_core.models.batch import ForwardBatch
from deepinfer_core.models.deepseek_v41.config import DeepseekV41Config
from deepinfer_core.models.deepseek_v41.engram import EngramHasher, compressed_token_map
from deepinfer_core.models.deepseek_v41.model import DeepseekV41ForCausalLM
from deepinfer_core.testing.kv_harness import PagedKVHarness

from .ops import train_backends

SPEC = TinySpec(
    name="demo_v41",
    covers="the V4.1 demo model: V4.1-Flash's layer pattern scaled down (SWA first layer, a ratio-2 Full / Reuse / "
    "Reindex group, the ratio-1 Full candidate source, decoder layers with a Reindex layer in the pool), Engram "
    "at an SWA and a Full layer, 3 DSpark stages of block 5, mHC x4",
    seed=4141,
    n_layers=8,
    compress_ratios=(0, 2, 2, 2, 1, 1, 1, 1),
    kv_source_layers=(1, 4),
    index_source_layers=(1, 3, 4, 6),
    dim=192,
    n_heads=4,
    head_dim=64,
    rope_head_dim=16,
    q_lora_rank=96,
    o_groups=2,
    o_lora_rank=64,
    window_size=64,
    index_n_heads=16,
    index_head_dim=32,
    index_topk=32,
    candidate=(4, 8, 8),
    n_routed_experts=8,
    n_activated_experts=2,
    moe_inter_dim=192,
    rope=dict(rope_factor=4.0, original_seq_len=1024),
    engram=dict(layer_ids=(0, 4), max_ngram_size=3, n_heads=2, head_dim=32, vocab_size=10007),
    dspark=dict(
        n_mtp_layers=3,
        block_size=5,
        target_layer_ids=(5, 6, 7),
        markov_rank=32,
        n_routed_experts=4,
        n_activated_experts=2,
    ),
)
MAX_LEN = 4096
TRAIN = dict(seq_len=512, batch=32, anchors=48, steps=630, lr=2.5e-3, min_lr_ratio=0.1, warmup=100,
             weight_decay=0.1, dspark_weight=0.5, confidence_weight=0.1, bias_update=1e-3, grad_clip=1.0,
             time_cap_s=480, seed=1234)  # fmt: skip
#: the loss weights of :data:`TRAIN`
WEIGHTS = {"loss": 1.0, "dspark": 0.5, "confidence": 0.1}
#: the second stage (``finetune-dspark``): only the DSpark stages train, on more anchors, the target frozen
DRAFT = dict(seq_len=512, batch=32, anchors=160, steps=560, lr=1e-3, min_lr_ratio=0.1, warmup=30,
             weight_decay=0.1, bias_update=1e-3, grad_clip=1.0, time_cap_s=400, seed=4242)  # fmt: skip
DRAFT_WEIGHTS = {"dspark": 1.0, "confidence": 0.1}


class _Ready:
    def __init__(self, rows: torch.Tensor):
        self.rows = rows

    def wait(self, dtype: torch.dtype) -> torch.Tensor:
        return self.rows.to(dtype)


class TrainTable:
    """An Engram table as a trainable float tensor (the engine's is an FP8 memory map)."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    def fetch(self, ids: torch.Tensor) -> _Ready:
        return _Ready(self.weight[ids])


@dataclass
class Trainee:
    model: DeepseekV41ForCausalLM
    params: dict[str, torch.nn.Parameter]  # checkpoint name -> float tensor
    specs: dict[str, layout.TensorSpec]
    args: dict  # inference/config.json
    tokenizer: object  # tokenizers.Tokenizer with the noise token

    def refresh(self) -> None:
        """Recompute what ``post_load`` derives from the slots (fresh autograd nodes every step)."""
        for m in self.model.modules():
            m.post_load()


def load_tokenizer(file: Path):
    """The V4 demo's tokenizer (``train_demo.py prepare``'s ``tokenizer/tokenizer.json``) plus DSpark's noise
    token, appended last."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(file))
    tok.add_special_tokens([NOISE_TOKEN])
    return tok


def write_tokenizer(tok, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": tok.id_to_token(0),
        "eos_token": tok.id_to_token(1), "model_max_length": MAX_LEN, "clean_up_tokenization_spaces": False,
    })  # fmt: skip


def build(tokenizer: Path, work: Path, device: torch.device, spec: TinySpec = SPEC) -> Trainee:
    """The model of ``spec`` with random float32 weights on ``device``; ``work`` receives the tokenizer (the
    Engram hash reads it from a checkpoint folder)."""
    configs.check(spec)
    tok = load_tokenizer(tokenizer)
    write_tokenizer(tok, work)
    _, compressed = compressed_token_map(work / "tokenizer.json")
    vocab = tok.get_vocab_size()
    rows = engram_rows.table_rows(spec.engram)
    args = configs.model_args(spec, vocab, rows, compressed, tok.token_to_id(NOISE_TOKEN))
    cfg = DeepseekV41Config.from_dict(hf_config.render(args, MAX_LEN))
    model = DeepseekV41ForCausalLM(cfg, train_backends(), torch.float32, with_dspark=True)
    model.hasher = EngramHasher.build(cfg.engram, work).to(device)
    model.use_kv_cache_dtype("unquantized")
    model.enable_dspark()
    specs = {t.name: t for t in layout.tensors(spec, vocab, rows)}
    slots = dict(model.named_slots())
    if set(slots) != set(specs):
        raise AssertionError(f"model slots and checkpoint layout differ: {sorted(set(slots) ^ set(specs))}")
    params = {}
    for name, t in specs.items():
        p = torch.nn.Parameter(stored.draw(t, spec.seed).to(device))
        p.requires_grad_(not name.endswith("gate.bias"))  # balanced by load, not by gradient
        params[name] = p
        slots[name].value = TrainTable(p) if slots[name].stored == "rows8" else p
    out = Trainee(model, params, specs, args, tok)
    out.refresh()
    return out


def prefill(model: DeepseekV41ForCausalLM, ids: torch.Tensor) -> tuple[ForwardBatch, torch.Tensor, dict]:
    """One prefill of every sequence of ``ids [B, L]`` through fresh paged pools -> ``(batch, hidden rows [B*L,
    D + taps], pools)``."""
    b, n = ids.shape
    h = PagedKVHarness(model.cache_specs(), block_size=16, num_blocks=b * (n // 16 + 1))
    h.pools = {k: v.to(ids.device) for k, v in h.pools.items()}
    sids = [h.add_sequence() for _ in range(b)]
    host = ids.cpu()
    batch = h.step({s: host[i].tolist() for i, s in enumerate(sids)}, logits="all").to(ids.device)
    return batch, model.forward(batch, h.pools), h.pools


def draft_rows(model, ids, batch, hidden, pools, seq: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """DSpark's block rows ``[N, block, D]`` for anchors ``(seq[j], p[j])``: every stage's window KV written from
    ``hidden``'s taps at every position (as the proposer writes it), then the blocks ``[ids[seq, p + 1], noise,
    ...]`` at positions ``p + 1 ..``, each against its sequence's window of positions ``<= p``."""
    ctx = ForwardBatch(batch.input_ids, batch.positions, batch.query_start_loc, batch.context_lens,
                       batch.block_tables, batch.block_size)  # fmt: skip
    model.dspark_context(ctx, hidden, pools)
    dev = ids.device
    tables = {k: v[seq] for k, v in batch.block_tables.items()}
    blk = ForwardBatch(ids[seq, p + 1], p, torch.arange(p.shape[0] + 1, device=dev), p + 1, tables,
                       batch.block_size)  # fmt: skip
    return model.dspark_block(blk, pools)


def step_losses(
    t: Trainee, ids: torch.Tensor, anchors: int, g: torch.Generator, frozen_target: bool = False
) -> dict[str, torch.Tensor]:
    """``ids [B, L]``: next-token loss of the target and the DSpark losses, one prefill of every sequence
    (without gradients with ``frozen_target``)."""
    model = t.model
    b, n = ids.shape
    t.refresh()
    with torch.set_grad_enabled(torch.is_grad_enabled() and not frozen_target):
        batch, hidden, pools = prefill(model, ids)
    d = model.cfg.hidden_size
    logits = model.compute_logits(hidden[:, :d]).view(b, n, -1)
    out = {"loss": F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())}
    if anchors:
        bs = model.dspark_block_size
        anchors = min(anchors, n - bs - 1)
        p = torch.stack([torch.randperm(n - bs - 1, generator=g)[:anchors] for _ in range(b)]).flatten()
        seq = torch.arange(b).repeat_interleave(anchors)
        x = draft_rows(model, ids, batch, hidden.detach(), pools, seq.to(ids.device), p.to(ids.device))
        out.update(dspark_losses(model, ids, x, seq.to(ids.device), p.to(ids.device)))
    return out


def dspark_losses(model, ids, x, seq, p) -> dict[str, torch.Tensor]:
    """Slot ``i`` of the block at ``p`` drafts ``ids[seq, p + 2 + i]``; its Markov bias is that of the true token
    before it (teacher forcing)."""
    bs = x.shape[1]
    base = model.dspark_logits(x.flatten(0, 1))
    offs = torch.arange(bs, device=ids.device)
    prev = ids[seq[:, None], p[:, None] + 1 + offs].flatten()
    target = ids[seq[:, None], p[:, None] + 2 + offs].flatten()
    bias, embed = model.dspark_markov(prev)
    logits = base + bias
    draft = F.cross_entropy(logits, target, reduction="none").view(-1, bs)
    right = (logits.argmax(-1) == target).float()
    conf = model.dspark_confidence(x.flatten(0, 1), embed)
    return {
        "dspark": draft.mean(),
        "dspark_by_slot": draft.detach().mean(0),
        "confidence": F.binary_cross_entropy_with_logits(conf, right),
        "draft_right_by_slot": right.view(-1, bs).mean(0),
    }


def lr_at(step: int, tr: dict) -> float:
    if step < tr["warmup"]:
        return tr["lr"] * (step + 1) / tr["warmup"]
    frac = min(1.0, (step - tr["warmup"]) / max(1, tr["steps"] - tr["warmup"]))
    return tr["lr"] * (tr["min_lr_ratio"] + (1 - tr["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * frac)))


def windows(tokens: torch.Tensor, batch: int, span: int, g: torch.Generator, device) -> torch.Tensor:
    starts = torch.randint(0, tokens.numel() - span, (batch,), generator=g)
    return torch.stack([tokens[s : s + span] for s in starts.tolist()]).long().to(device)


def balance(t: Trainee, rate: float) -> None:
    """Aux-loss-free balancing of every router's correction bias from the step's loads."""
    loads = t.model.backends.moe.loads
    with torch.no_grad():
        for name, p in t.params.items():
            c = loads.get(id(p)) if name.endswith("gate.bias") else None
            if c is not None:
                p.add_(rate * torch.sign(c.mean() - c))
    loads.clear()


def train(
    t: Trainee, data: Path, device: torch.device, tr: dict = TRAIN, weights: dict = WEIGHTS, log=print
) -> dict:
    """AdamW on ``t.params`` (the trainable ones), cosine schedule, the loss ``sum(weights[k] * losses[k])``; the
    target's prefill runs without gradients when the loss has no ``"loss"`` term."""
    params = [p for p in t.params.values() if p.requires_grad]
    decay = [p for n, p in t.params.items() if p.requires_grad and p.ndim >= 2]
    rest = [p for n, p in t.params.items() if p.requires_grad and p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": tr["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                            lr=tr["lr"], betas=(0.9, 0.95), fused=device.type == "cuda")  # fmt: skip
    tokens = torch.load(data / "train.pt")
    g = torch.Generator().manual_seed(tr["seed"])
    history, t0, step = [], time.time(), 0
    for step in range(tr["steps"]):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tr)
        ids = windows(tokens, tr["batch"], tr["seq_len"], g, device)
        got = step_losses(t, ids, tr["anchors"], g, frozen_target="loss" not in weights)
        sum(w * got[k] for k, w in weights.items()).backward()
        torch.nn.utils.clip_grad_norm_(params, tr["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        balance(t, tr["bias_update"])
        if step % 50 == 0 or step == tr["steps"] - 1:
            rec = {"step": step, "s": round(time.time() - t0, 1), "lr": lr_at(step, tr),
                   **{k: _num(v) for k, v in got.items()}}  # fmt: skip
            history.append(rec)
            log(json.dumps(rec))
        if time.time() - t0 > tr["time_cap_s"]:
            break
    return {"steps_done": step + 1, "train_seconds": round(time.time() - t0, 1), "log": history}


def _num(v: torch.Tensor):
    return round(v.item(), 4) if v.numel() == 1 else [round(x, 4) for x in v.tolist()]


@torch.no_grad()
def evaluate(
    t: Trainee, tokens: torch.Tensor, bytes_per_token: float, device, n: int = 8, batch: int = 8
) -> dict:
    """Held-out next-token loss (nats), bits per byte, and the DSpark losses on ``n * batch`` windows."""
    g = torch.Generator().manual_seed(7)
    acc: dict[str, torch.Tensor] = {}
    for _ in range(n):
        got = step_losses(t, windows(tokens, batch, TRAIN["seq_len"], g, device), 64, g)
        for k, v in got.items():
            acc[k] = acc.get(k, 0) + v.detach().float() / n
    out = {k: _num(v) for k, v in acc.items()}
    out["bits_per_byte"] = round(acc["loss"].item() / math.log(2) / bytes_per_token, 4)
    return out


def load_exported(path: Path, args: dict, tokenizer, device: torch.device) -> Trainee:
    """The exported checkpoint read by the engine's loader (on the CPU), every stored value dequantised to a
    float32 tensor on ``device``: what the engine computes with, on the training ops."""
    from deepinfer_core.ops.quant_formats import dequant
    from deepinfer_core.ops.weights import QuantizedWeight

    model = DeepseekV41ForCausalLM.from_checkpoint(path, train_backends(), torch.float32)
    model.hasher = model.hasher.to(device)
    model.use_kv_cache_dtype("unquantized")
    model.enable_dspark()
    for _, slot in model.named_slots():
        v = slot.value
        if isinstance(v, QuantizedWeight):
            slot.value = dequant(v).to(device)
        elif isinstance(v, torch.Tensor):
            slot.value = v.to(device)
        else:  # an Engram table: FP8 rows times a ue8m0 scale per 32 channels
            rows = v.codes.float() * v.scales.float().repeat_interleave(32, dim=-1)
            slot.value = TrainTable(rows.to(device))
    out = Trainee(model, {}, {}, args, tokenizer)
    out.refresh()
    return out


def warm_start(t: Trainee, path: Path) -> None:
    """Every parameter of ``t`` from the exported checkpoint at ``path`` (its stored values, dequantised)."""
    src = load_exported(path, t.args, t.tokenizer, next(iter(t.params.values())).device)
    slots = dict(src.model.named_slots())
    with torch.no_grad():
        for name, p in t.params.items():
            v = slots[name].value
            p.copy_(v.weight if isinstance(v, TrainTable) else v)


def draft_trainee(path: Path, device: torch.device, spec: TinySpec = SPEC) -> Trainee:
    """The exported checkpoint at ``path`` (:func:`load_exported`) with its DSpark stages trainable: their
    dequantised values become float32 parameters, everything else stays as stored."""
    from tokenizers import Tokenizer

    args = json.loads((path / "inference" / "config.json").read_text())
    t = load_exported(path, args, Tokenizer.from_file(str(path / "tokenizer.json")), device)
    rows = tuple(args.get("engram_num_embeddings", ()))
    specs = {s.name: s for s in layout.tensors(spec, args["vocab_size"], rows) if s.name.startswith("mtp.")}
    slots = dict(t.model.named_slots())
    for name in specs:
        p = torch.nn.Parameter(slots[name].value.detach().clone())
        p.requires_grad_(not name.endswith("gate.bias"))
        slots[name].value = t.params[name] = p
    t.specs = specs
    t.refresh()
    return t


def stored_tensors(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def export(t: Trainee, out: Path, base: dict[str, torch.Tensor] | None = None) -> int:
    """The published layout (FP8 32x32 blocks, FP4 experts, FP8 Engram rows) -> ``out``; returns bytes. With
    ``base`` (a checkpoint's stored tensors), only ``t.specs``' tensors are stored anew, the rest copied."""
    from v41golden.checkpoint_files import INDEX

    state: dict[str, torch.Tensor] = dict(base or {})
    for name, spec in t.specs.items():
        state.update(stored.store(spec, t.params[name].detach().float().cpu()))
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.safetensors"):
        old.unlink()
    write_json(out / "config.json", hf_config.render(t.args, MAX_LEN))
    write_json(out / "inference" / "config.json", t.args)
    write_tokenizer(t.tokenizer, out)
    write_shards(state, out)
    return sum(p.stat().st_size for p in out.rglob("*") if p.is_file() and p.name != INDEX)
