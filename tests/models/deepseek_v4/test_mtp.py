"""MTP (``mtp.0.*``): DeepSeek's draft module, checked against a reference assembled from transformers'
own V4 modules (a sliding-window decoder layer, RMSNorms, HyperHead) with the semantics of DeepSeek's
inference code: embed the next token and ``enorm`` it, ``hnorm`` the previous streams, ``e_proj + h_proj``,
one block, then ``hc_head``, ``norm`` and the shared head."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers.models.deepseek_v4.modeling_deepseek_v4 import (
    DeepseekV4DecoderLayer,
    DeepseekV4HyperHead,
    DeepseekV4RMSNorm,
    DeepseekV4RotaryEmbedding,
)

from deepinfer_core.models.deepseek_v4 import DeepseekV4ForCausalLM
from deepinfer_core.testing.kv_harness import PagedKVHarness

from .conftest import SCHEDULES
from .tiny import build_hf, deepseek_name, peaky_init, save_deepseek, tokens

SCHEDULE = SCHEDULES["swa_csa_hca_hc2"]


class MTPReference(torch.nn.Module):
    def __init__(self, hf, seed: int = 5):
        super().__init__()
        cfg = copy.deepcopy(hf.config)
        n = cfg.num_hidden_layers
        cfg.num_hidden_layers = n + 1
        cfg.layer_types = list(cfg.layer_types) + ["sliding_attention"]
        cfg.mlp_layer_types = list(cfg.mlp_layer_types) + ["moe"]
        self.cfg, self.n, self._hf = cfg, n, [hf]  # a list: not a submodule
        d = cfg.hidden_size
        self.block = DeepseekV4DecoderLayer(cfg, n)
        self.e_proj, self.h_proj = torch.nn.Linear(d, d, bias=False), torch.nn.Linear(d, d, bias=False)
        self.enorm, self.hnorm, self.norm = (DeepseekV4RMSNorm(d, cfg.rms_norm_eps) for _ in range(3))
        self.hc_head = DeepseekV4HyperHead(cfg)
        self.rotary = DeepseekV4RotaryEmbedding(cfg)
        peaky_init(self, seed, cfg)
        self.eval()

    def deepseek_tensors(self) -> dict[str, torch.Tensor]:
        out = {}
        for k, v in self.state_dict().items():
            if k.startswith("block."):
                name = deepseek_name(f"model.layers.{self.n}.{k[len('block.') :]}").replace(
                    f"layers.{self.n}.", "mtp.0."
                )
                if name.endswith(".ffn.experts.gate_up_proj"):
                    i = v.shape[1] // 2
                    out.update(
                        {
                            name.replace("gate_up_proj", f"{e}.w1.weight"): v[e, :i].clone()
                            for e in range(v.shape[0])
                        }
                    )
                    out.update(
                        {
                            name.replace("gate_up_proj", f"{e}.w3.weight"): v[e, i:].clone()
                            for e in range(v.shape[0])
                        }
                    )
                elif name.endswith(".ffn.experts.down_proj"):
                    out.update(
                        {name.replace("down_proj", f"{e}.w2.weight"): v[e].clone() for e in range(v.shape[0])}
                    )
                else:
                    out[name] = v.clone()
            elif k.startswith(("e_proj", "h_proj", "enorm", "hnorm", "norm")):
                out[f"mtp.0.{k}"] = v.clone()
            elif k.startswith("hc_head."):
                out[f"mtp.0.hc_head_{k.split('.hc_')[1]}"] = v.clone()
        return out

    @torch.no_grad()
    def forward(self, prev: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """``prev [S, N, D]`` main streams at positions 0..S-1, ``next_ids [S]`` tokens at 1..S -> logits."""
        s, w = prev.shape[0], self.cfg.sliding_window
        e = self.enorm(self._hf[0].model.embed_tokens(next_ids[None]))
        x = self.e_proj(e).unsqueeze(2) + self.h_proj(self.hnorm(prev[None]))
        pos = torch.arange(s)[None]
        pe = {k: self.rotary(x, position_ids=pos, layer_type=k) for k in ("main", "compress")}
        q, k = torch.arange(s)[:, None], torch.arange(s)[None, :]
        mask = torch.where((k <= q) & (k > q - w), 0.0, float("-inf"))[None, None]
        h = self.block(
            x, position_embeddings=pe, position_ids=pos, attention_mask=mask, input_ids=next_ids[None]
        )
        return self._hf[0].lm_head(self.norm(self.hc_head(h)))[0]


@pytest.fixture(scope="module")
def mtp_setup(tmp_path_factory, backends):
    hf = build_hf(SCHEDULE, seed=21)
    ref = MTPReference(hf)
    path = save_deepseek(hf, tmp_path_factory.mktemp("mtp"), extra=ref.deepseek_tensors())
    return DeepseekV4ForCausalLM.from_checkpoint(path, backends, torch.float32), ref


def _fresh(model) -> tuple[PagedKVHarness, int]:
    h = PagedKVHarness(model.cache_specs(), block_size=16, num_blocks=32)
    return h, h.add_sequence()


def _main_then_mtp(model, h, s, ids, start, stop):
    """Main forward over ``ids[start:stop]``, then the MTP step over the positions whose next token is known."""
    streams = model.forward(h.step({s: ids[start:stop]}), h.pools)
    known = min(stop, len(ids) - 1) - start
    batch = h.step({s: ids[start + 1 : start + 1 + known]}, positions_from={s: start})
    out = model.mtp_forward(0, batch, streams[:known], h.pools)
    return out, model.mtp_compute_logits(0, out)


def test_mtp_shapes_specs_and_reference_logits(mtp_setup):
    model, ref = mtp_setup
    assert model.num_mtp_layers == 1
    mtp_specs = [s for s in model.cache_specs() if s.name.startswith("mtp.")]
    assert [s.name for s in mtp_specs] == ["mtp.0.attn.swa_kv"] and mtp_specs[
        0
    ].window == SCHEDULE.sliding_window - 1
    ids = tokens(60, seed=8)
    h, s = _fresh(model)
    streams = model.forward(h.step({s: ids}), h.pools)
    out, logits = _main_then_mtp(model, *_fresh(model), ids, 0, 60)
    assert (
        out.shape == (59, SCHEDULE.hc_mult, 64)
        and logits.shape == (59, 320)
        and logits.dtype == torch.float32
    )
    expected = ref(streams[:59], torch.tensor(ids[1:]))
    assert expected.std() > 1.0
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)


def test_mtp_state_is_incremental(mtp_setup):
    """Interleaved main / MTP steps over chunks and single tokens give the MTP logits of one full pass."""
    model, _ = mtp_setup
    ids = tokens(45, seed=9)
    _, full = _main_then_mtp(model, *_fresh(model), ids, 0, 45)
    h = PagedKVHarness(model.cache_specs(), block_size=32, num_blocks=32, seed=2)
    s = h.add_sequence()
    parts, bounds = [], [0, 11, 12, 30, 31, 32, 45]
    for a, b in zip(bounds, bounds[1:]):
        parts.append(_main_then_mtp(model, h, s, ids, a, b)[1])
    assert torch.equal(torch.cat(parts), full)


def test_checkpoint_without_mtp_tensors_has_no_mtp(checkpoints, backends):
    model = DeepseekV4ForCausalLM.from_checkpoint(
        checkpoints.path("swa_csa_hca_hc2", "transformers"), backends, torch.float32
    )
    assert model.num_mtp_layers == 0 and not any(s.name.startswith("mtp.") for s in model.cache_specs())
    with pytest.raises(IndexError, match="MTP module 0 does not exist"):
        model.mtp_compute_logits(0, torch.zeros(1, 2, 64))
