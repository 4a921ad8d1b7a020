"""The V4.1 vision tower on the reference ops against the oracle (``tests/data/v41_vision/tower*``): a tiny
random checkpoint in the published layout, five images through our preprocessing and tower, compared with
the oracle's ViT output, aligner rows and whole span. Float32; tolerance ``|ours - oracle| <= 1e-5 + 2e-5 *
|oracle|``. Measured: the ViT output (values up to ~4) differs by at most 1.2e-5, the spans by at most 2.9e-6;
the GEMMs and the softmax sum in another order. The two oracle ports differ from each other by up to 2.5e-6."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from deepinfer_core.models.deepseek_v41.vision import VisionConfig, VisionTower, process_image
from deepinfer_core.testing.kit import reference_backends

DATA = Path(__file__).resolve().parents[2] / "data" / "v41_vision"
sys.path.insert(0, str(DATA.parents[2] / "tools"))
from v41visiongolden import cases  # noqa: E402

META = json.loads((DATA / "tower.json").read_text())["cases"]
TOL = {"atol": 1e-5, "rtol": 2e-5}


@pytest.fixture(scope="module")
def setup():
    cfg = VisionConfig.from_dict(json.loads((DATA / "tower" / "config.json").read_text()))
    tower = VisionTower(cfg, load_file(DATA / "tower" / "model.safetensors"), torch.float32)
    gold = load_file(DATA / "tower.safetensors")
    images = {}
    for name, src, final in cases.TOWER_CASES:
        case = (name, "tiny", src, final, "RGB", "png")
        image = cases.build_image(case, {f"source.{name}": gold[f"source.{name}"]})
        images[name] = process_image(cases.encode(image, "png"), cfg)
    return cfg, tower, gold, images


def test_the_config_reads_the_checkpoints_vision_settings(setup):
    cfg = setup[0]
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.inter_dim, cfg.out_dim) == (2, 64, 4, 96, 48)
    assert (cfg.max_n_token, cfg.min_pixels, cfg.max_wh_ratio, cfg.downsample_ratio) == (40, 3000, 6, 3)


@pytest.mark.parametrize("name", [c[0] for c in cases.TOWER_CASES])
def test_one_image_matches_the_oracle(setup, name):
    cfg, tower, gold, images = setup
    image, backends = images[name], reference_backends()
    digest = hashlib.sha256(image.patches.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
    assert digest == META[name]["patches_sha256"]  # the same input as the oracle's
    grid = (image.plan.n_vit_h, image.plan.n_vit_w)
    feats = tower.vit(backends, [grid], image.patches)
    torch.testing.assert_close(feats, gold[f"{name}.features"], **TOL)
    torch.testing.assert_close(tower.aligner(backends, feats, grid), gold[f"{name}.rows"], **TOL)
    assert torch.equal(image.types, gold[f"{name}.types"])
    (span,) = tower.encode(backends, [image])
    torch.testing.assert_close(span, gold[f"{name}.span"], **TOL)


def test_images_packed_in_one_call_each_match_the_oracle(setup):
    _, tower, gold, images = setup
    names = list(images)
    spans = tower.encode(reference_backends(), [images[n] for n in names])
    for name, span in zip(names, spans):
        torch.testing.assert_close(span, gold[f"{name}.span"], **TOL)


def test_a_wrong_checkpoint_is_refused_with_the_names(setup):
    cfg = setup[0]
    tensors = load_file(DATA / "tower" / "model.safetensors")
    del tensors["vision.blocks.1.attn.wo.bias"]
    with pytest.raises(ValueError, match=r"missing \['vision.blocks.1.attn.wo.bias'\]"):
        VisionTower(cfg, tensors, torch.float32)
    tensors = load_file(DATA / "tower" / "model.safetensors")
    tensors["aligner.w2.weight"] = tensors["aligner.w2.weight"][:, :-1]
    with pytest.raises(ValueError, match=r"aligner.w2.weight \(48, 47\) != \(48, 48\)"):
        VisionTower(cfg, tensors, torch.float32)
