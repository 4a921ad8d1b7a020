"""Plan a DeepSeek-V4-Flash cluster: all-to-all bytes, expert memory and load imbalance at EP 8..256.

Analytic model (no hardware needed), with the EPLB placement of deepinfer_core.distributed.eplb applied
to a skewed synthetic expert load. Run:  python tools/scaling_sim.py [--json]
"""

from __future__ import annotations

import argparse
import json

import torch

from deepinfer_core.distributed.eplb import gpu_loads, imbalance, rebalance, static_placement

# V4-Flash (DeepSeek's config.json as read by transformers' DeepseekV4Config defaults)
HIDDEN, EXPERTS, TOPK, INTER, MOE_LAYERS = 4096, 256, 6, 2048, 43
FP4_EXPERT_BYTES = 3 * HIDDEN * INTER // 2 + 3 * HIDDEN * INTER // 32  # e2m1 codes + one ue8m0 byte per 32
DISPATCH_BYTES = HIDDEN + HIDDEN // 128 * 4  # FP8 activations + one float32 scale per 128
COMBINE_BYTES = HIDDEN * 2  # BF16 expert outputs


def zipf_load(layers: int, experts: int, tokens: int, alpha: float, seed: int = 0) -> torch.Tensor:
    """Token-expert assignments per expert with Zipf(alpha) popularity, shuffled per layer."""
    g = torch.Generator().manual_seed(seed)
    p = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** alpha
    p = p / p.sum()
    return torch.stack([torch.multinomial(p[torch.randperm(experts, generator=g)], tokens * TOPK, True, generator=g)
                        .bincount(minlength=experts).double() for _ in range(layers)])  # fmt: skip


def scenario(ep: int, tokens_per_rank: int, redundant: int, alpha: float, gpus_per_node: int = 8) -> dict:
    slots = EXPERTS + redundant
    slots += (-slots) % ep  # round up so every rank holds the same number of slots
    load = zipf_load(4, EXPERTS, tokens_per_rank * ep, alpha)
    nodes = max(1, ep // gpus_per_node)
    groups = 8 if 8 % nodes == 0 else 1
    before = (
        imbalance(gpu_loads(load, static_placement(4, EXPERTS, ep), ep))
        if EXPERTS % ep == 0
        else float("nan")
    )
    after = imbalance(gpu_loads(load, rebalance(load, slots, groups, nodes, ep), ep))
    remote = (ep - 1) / ep
    a2a = tokens_per_rank * TOPK * remote * (DISPATCH_BYTES + COMBINE_BYTES)
    return {
        "ep": ep,
        "tokens_per_rank": tokens_per_rank,
        "slots_per_rank": slots // ep,
        "expert_GB_per_rank": slots // ep * FP4_EXPERT_BYTES * MOE_LAYERS / 1e9,
        "a2a_MB_per_layer_per_rank": a2a / 1e6,
        "a2a_GB_per_step_per_rank": a2a * MOE_LAYERS / 1e9,
        "imbalance_static": before,
        "imbalance_eplb": after,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--alpha", type=float, default=1.0, help="Zipf skew of expert popularity")
    ns = ap.parse_args()
    rows = [scenario(ep, 128, 32, ns.alpha) for ep in (8, 16, 32, 64, 128, 144, 256)]  # decode
    rows += [scenario(ep, 4096, 32, ns.alpha) for ep in (8, 16, 32)]  # prefill
    if ns.json:
        print(json.dumps(rows, indent=2))
        return
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys))


if __name__ == "__main__":
    main()
