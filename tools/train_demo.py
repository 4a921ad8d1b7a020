"""Train the demo model: a small DeepSeek-V4-architecture model on the CPython standard library.

Reproducible recipe (every number below is recorded in the output's ``training.json``):

1. ``prepare`` (CPU, here): the ``.py`` files of this interpreter's standard library (CPython 3.11.7),
   excluding ``site-packages``, sorted by path; a file is held out for evaluation when
   ``sha1(relative path) % 20 == 0`` (~5%). A byte-level BPE tokenizer (``tokenizers``, vocab 8192) is
   trained on the training files; every file becomes ``BOS + tokens + EOS``.
2. ``train`` (GPU): transformers' ``DeepseekV4ForCausalLM`` with every V4 feature the engine supports
   (mHC, sliding / CSA with indexer / HCA layers with YaRN, hash-MoE and routed MoE with a shared expert)
   plus one MTP module (DeepSeek's layout: ``e_proj``, ``h_proj``, ``enorm``, ``hnorm``, a sliding-window
   block, ``norm``, ``hc_head``, shared head) trained with the MTP objective (weight 0.3). Routed-expert
   correction biases follow aux-loss-free balancing (bias += 1e-3 * sign(mean load - load) each step).
   The lightning indexer's selection is not differentiable, so its weights keep their initialisation.
3. Export in DeepSeek's published layout (BF16 matrices, float32 norms / mHC / sinks), with the tokenizer.

    python tools/train_demo.py prepare --out /tmp/demo-data
    python tools/train_demo.py train --data /tmp/demo-data --out /tmp/demo-ckpt   # on the GPU
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import math
import os
import shutil
import sysconfig
import time
from pathlib import Path

import torch

SEED = 1234
VOCAB = 8192
MODEL = dict(
    vocab_size=VOCAB,
    hidden_size=192,
    moe_intermediate_size=192,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    qk_rope_head_dim=16,
    q_lora_rank=96,
    o_groups=2,
    o_lora_rank=64,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    layer_types=[
        "sliding_attention",
        "compressed_sparse_attention",
        "heavily_compressed_attention",
        "compressed_sparse_attention",
    ],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    hc_mult=4,
    sliding_window=64,
    index_n_heads=8,
    index_head_dim=32,
    index_topk=16,
    max_position_embeddings=4096,
    rope_parameters={
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 1024,
        "beta_fast": 32,
        "beta_slow": 1,
    },
    num_nextn_predict_layers=1,
    bos_token_id=0,
    eos_token_id=1,
)
TRAIN = dict(seq_len=512, batch=64, steps=1800, lr=2.5e-3, min_lr_ratio=0.1, warmup=100, weight_decay=0.1, mtp_weight=0.3,
             bias_update=1e-3, grad_clip=1.0, time_cap_s=330)  # fmt: skip


# ---------------------------------------------------------------------------------------------- prepare


def corpus_files() -> list[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "__pycache__"}
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if not skip.intersection(rel.parts):
            out.append((rel.as_posix(), p))
    return out


def is_heldout(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % 20 == 0


def prepare(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    from deepinfer_core.demo import train_tokenizer

    out.mkdir(parents=True, exist_ok=True)
    files = corpus_files()
    texts = {rel: p.read_text(encoding="utf-8", errors="replace") for rel, p in files}
    train = [r for r in texts if not is_heldout(r)]
    held = [r for r in texts if is_heldout(r)]
    train_tokenizer(out / "tokenizer", VOCAB, (texts[r] for r in train))
    tok = PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    for name, rels in (("train", train), ("heldout", held)):
        ids = []
        for r in rels:
            ids += [tok.bos_token_id, *tok(texts[r], add_special_tokens=False).input_ids, tok.eos_token_id]
        torch.save(torch.tensor(ids, dtype=torch.int16), out / f"{name}.pt")
        (out / f"{name}_files.txt").write_text("\n".join(rels))
    meta = {"python": sysconfig.get_python_version(), "files": {"train": len(train), "heldout": len(held)},
            "bytes": {"train": sum(len(texts[r].encode()) for r in train), "heldout": sum(len(texts[r].encode()) for r in held)},
            "tokens": {n: int(torch.load(out / f"{n}.pt").numel()) for n in ("train", "heldout")}}  # fmt: skip
    (out / "data.json").write_text(json.dumps(meta, indent=1))
    print(json.dumps(meta))


# ---------------------------------------------------------------------------------------------- model


class MTPModule(torch.nn.Module):
    """One MTP module: ``block(e_proj(enorm(embed(t[p+1]))) + h_proj(hnorm(streams[p])))`` -> hc_head -> norm."""

    def __init__(self, config):
        from transformers.models.deepseek_v4 import modeling_deepseek_v4 as m

        super().__init__()
        cfg = copy.deepcopy(config)
        cfg.num_hidden_layers, cfg.layer_types, cfg.mlp_layer_types = 1, ["sliding_attention"], ["moe"]
        d = cfg.hidden_size
        self.cfg = cfg
        self.layer = m.DeepseekV4DecoderLayer(cfg, 0)
        self.e_proj = torch.nn.Linear(d, d, bias=False)
        self.h_proj = torch.nn.Linear(d, d, bias=False)
        self.enorm, self.hnorm, self.norm = (m.DeepseekV4RMSNorm(d, cfg.rms_norm_eps) for _ in range(3))
        self.hc_head = m.DeepseekV4HyperHead(cfg)
        self.rotary = m.DeepseekV4RotaryEmbedding(cfg)

    def forward(self, streams, next_emb, position_ids, mask):
        h = self.e_proj(self.enorm(next_emb)).unsqueeze(2) + self.h_proj(self.hnorm(streams))
        pe = {k: self.rotary(h, position_ids=position_ids, layer_type=k) for k in ("main", "compress")}
        out = self.layer(
            h, position_embeddings=pe, position_ids=position_ids, attention_mask=mask, past_key_values=None
        )
        return self.norm(self.hc_head(out))

    def deepseek_state(self) -> dict[str, torch.Tensor]:
        from deepinfer_core.models.deepseek_v4.export import mtp_state

        extra = {"e_proj.weight": self.e_proj.weight, "h_proj.weight": self.h_proj.weight, "enorm.weight": self.enorm.weight,
                 "hnorm.weight": self.hnorm.weight, "norm.weight": self.norm.weight, "hc_head_fn": self.hc_head.hc_fn,
                 "hc_head_base": self.hc_head.hc_base, "hc_head_scale": self.hc_head.hc_scale}  # fmt: skip
        return mtp_state(
            0,
            {k: v.detach() for k, v in self.layer.state_dict().items()},
            {k: v.detach() for k, v in extra.items()},
        )


def sliding_mask(seq: int, window: int, device, dtype) -> torch.Tensor:
    i = torch.arange(seq, device=device)
    ok = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)
    return torch.zeros(seq, seq, device=device, dtype=dtype).masked_fill(~ok, float("-inf"))[None, None]


def build(device):
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(SEED)
    config = DeepseekV4Config(**MODEL)
    model = DeepseekV4ForCausalLM(config)
    mtp = MTPModule(config)
    for mod in mtp.modules():
        model._init_weights(mod)
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp.gate, "tid2eid"):  # frozen hash table: distinct experts per token
                perm = torch.stack(
                    [torch.randperm(config.n_routed_experts, generator=g) for _ in range(VOCAB)]
                )
                layer.mlp.gate.tid2eid.copy_(perm[:, : config.num_experts_per_tok])
    return config, model.to(device), mtp.to(device)


# ---------------------------------------------------------------------------------------------- train


def lr_at(step: int) -> float:
    t = TRAIN
    if step < t["warmup"]:
        return t["lr"] * (step + 1) / t["warmup"]
    frac = (step - t["warmup"]) / max(1, t["steps"] - t["warmup"])
    return t["lr"] * (
        t["min_lr_ratio"] + (1 - t["min_lr_ratio"]) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))
    )


def batches(tokens: torch.Tensor, g: torch.Generator, device):
    span = TRAIN["seq_len"] + 2
    while True:
        starts = torch.randint(0, tokens.numel() - span, (TRAIN["batch"],), generator=g)
        yield (
            torch.stack([tokens[s : s + span] for s in starts.tolist()]).long().to(device, non_blocking=True)
        )


def losses(model, mtp, w, mask):
    S = TRAIN["seq_len"]
    captured = {}

    def capture(m, args, out) -> None:
        captured["h"] = out

    hook = model.model.layers[-1].register_forward_hook(capture)
    pos = torch.arange(S, device=w.device)[None]
    logits = model(input_ids=w[:, :S], position_ids=pos, use_cache=False).logits
    hook.remove()
    ce = torch.nn.functional.cross_entropy
    main = ce(logits.float().flatten(0, 1), w[:, 1 : S + 1].flatten())
    next_emb = model.model.embed_tokens(w[:, 1 : S + 1])
    mtp_logits = model.lm_head(mtp(captured["h"], next_emb, pos, mask))
    return main, ce(mtp_logits.float().flatten(0, 1), w[:, 2 : S + 2].flatten())


def train(data: Path, out: Path, device: str = "cuda") -> None:
    from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4TopKRouter

    device = torch.device(device)
    torch.backends.cuda.matmul.allow_tf32 = True
    config, model, mtp = build(device)
    params = [p for p in list(model.parameters()) + list(mtp.parameters()) if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": TRAIN["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
                            lr=TRAIN["lr"], betas=(0.9, 0.95), fused=device.type == "cuda")  # fmt: skip
    routers = [m for m in list(model.modules()) + list(mtp.modules()) if isinstance(m, DeepseekV4TopKRouter)]
    counts = {id(r): torch.zeros(r.num_experts, device=device) for r in routers}

    def count_load(m, args, out) -> None:  # must return None: a hook's return value replaces the output
        counts[id(m)].add_(torch.bincount(out[2].flatten(), minlength=m.num_experts))

    for r in routers:
        r.register_forward_hook(count_load)
    tokens = torch.load(data / "train.pt")
    g = torch.Generator().manual_seed(SEED)
    mask = sliding_mask(TRAIN["seq_len"], config.sliding_window, device, torch.bfloat16)
    log, t0, step = [], time.time(), 0
    for step, w in zip(range(TRAIN["steps"]), batches(tokens, g, device)):
        for group in opt.param_groups:
            group["lr"] = lr_at(step)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            main, aux = losses(model, mtp, w, mask)
        (main + TRAIN["mtp_weight"] * aux).backward()
        torch.nn.utils.clip_grad_norm_(params, TRAIN["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for r in routers:
                c = counts[id(r)]
                r.e_score_correction_bias.add_(TRAIN["bias_update"] * torch.sign(c.mean() - c))
                c.zero_()
        if step % 50 == 0 or step == TRAIN["steps"] - 1:
            rec = {
                "step": step,
                "loss": main.item(),
                "mtp_loss": aux.item(),
                "lr": lr_at(step),
                "s": round(time.time() - t0, 1),
            }
            log.append(rec)
            print(json.dumps(rec), flush=True)
        if time.time() - t0 > TRAIN["time_cap_s"]:
            break
    elapsed = time.time() - t0
    heldout = evaluate(model, mtp, torch.load(data / "heldout.pt"), mask, device)
    record = {
        "steps_done": step + 1,
        "train_seconds": elapsed,
        "log": log,
        "heldout_gpu": heldout,
        "train": dict(TRAIN),
    }
    save_raw(model, mtp, out, record)
    if os.environ.get("DEEPINFER_RAW_ONLY") != "1":
        export(model, mtp, data, out, record)


def save_raw(model, mtp, out: Path, record: dict) -> None:
    """Trained tensors as plain safetensors files under 16 MB each (transformers names; small tensors stay
    float32), so a machine without the engine's dependencies can hand them back for :func:`export`."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = {f"main.{k}": v for k, v in model.state_dict().items()} | {
        f"mtp.{k}": v for k, v in mtp.state_dict().items()
    }
    state = {k: (v.detach().bfloat16() if v.is_floating_point() and v.numel() > 100_000 else v.detach()).cpu().contiguous()
             for k, v in state.items()}  # fmt: skip
    embed = {k: v for k, v in state.items() if "embed_tokens" in k or "lm_head" in k}
    save_file(embed, str(out / "raw-embed.safetensors"))
    save_file({k: v for k, v in state.items() if k not in embed}, str(out / "raw-rest.safetensors"))
    (out / "raw-record.json").write_text(json.dumps(record))


@torch.no_grad()
def evaluate(model, mtp, tokens, mask, device, windows: int = 64) -> dict:
    g = torch.Generator().manual_seed(SEED + 1)
    tot = {"loss": 0.0, "mtp_loss": 0.0}
    it = batches(tokens, g, device)
    n = max(1, windows // TRAIN["batch"])
    for _ in range(n):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            main, aux = losses(model, mtp, next(it), mask)
        tot["loss"] += main.item() / n
        tot["mtp_loss"] += aux.item() / n
    return tot


def export(model, mtp, data: Path, out: Path, record: dict) -> None:
    from deepinfer_core.models.deepseek_v4.export import save_deepseek

    model = model.float().cpu()
    extra = {k: v.cpu() for k, v in mtp.float().cpu().deepseek_state().items()}
    save_deepseek(model, out, shards=2, extra=extra)
    from safetensors.torch import load_file, save_file

    keep_fp32 = ("norm", "hc_", "attn_sink", "ape", "gate.bias", "tid2eid", "weights_proj")
    for shard in out.glob("*.safetensors"):
        state = load_file(str(shard))
        state = {k: (v.bfloat16() if v.is_floating_point() and v.ndim >= 2 and not any(s in k for s in keep_fp32) else v)
                 for k, v in state.items()}  # fmt: skip
        save_file(state, str(shard))
    for f in (data / "tokenizer").iterdir():
        shutil.copy(f, out / f.name)
    record.setdefault("train", dict(TRAIN))
    record.update({"model": MODEL, "seed": SEED, "data": json.loads((data / "data.json").read_text())})
    (out / "training.json").write_text(json.dumps(record, indent=1))


def export_raw(raw: Path, data: Path, out: Path) -> None:
    """Rebuild the model from :func:`save_raw`'s files (on the CPU) and :func:`export` it."""
    from safetensors.torch import load_file

    _, model, mtp = build(torch.device("cpu"))
    state = load_file(str(raw / "raw-embed.safetensors")) | load_file(str(raw / "raw-rest.safetensors"))
    for prefix, module in (("main.", model), ("mtp.", mtp)):
        own = {
            k[len(prefix) :]: v.float() if v.is_floating_point() else v
            for k, v in state.items()
            if k.startswith(prefix)
        }
        missing, unexpected = module.load_state_dict(own, strict=False)
        if missing or unexpected:
            raise SystemExit(
                f"raw checkpoint does not fit the model: missing {missing}, unexpected {unexpected}"
            )
    export(model, mtp, data, out, json.loads((raw / "raw-record.json").read_text()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("train")
    t.add_argument("--data", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--steps", type=int, default=None, help="override the step count (smoke runs)")
    t.add_argument("--batch", type=int, default=None, help="override the batch size (smoke runs)")
    t.add_argument("--device", default="cuda")
    t.add_argument("--time-cap", type=float, default=None, help="stop after this many seconds of training")
    x = sub.add_parser("export-raw", help="export the raw tensors a GPU run handed back")
    x.add_argument("--raw", type=Path, required=True)
    x.add_argument("--data", type=Path, required=True)
    x.add_argument("--out", type=Path, required=True)
    ns = ap.parse_args()
    if ns.cmd == "export-raw":
        export_raw(ns.raw, ns.data, ns.out)
    elif ns.cmd == "prepare":
        prepare(ns.out)
    else:
        TRAIN.update(
            {k: v for k, v in (("steps", ns.steps), ("batch", ns.batch), ("time_cap_s", ns.time_cap)) if v}
        )
        train(ns.data, ns.out, ns.device)


if __name__ == "__main__":
    main()
