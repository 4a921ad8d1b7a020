"""``AttentionOps.encoder_attention``: the base class's torch default and the reference agree with
per-image ``scaled_dot_product_attention``, and no image sees another."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from deepinfer_core.ops.attention import AttentionOps
from deepinfer_core.ops.reference import ReferenceAttentionOps


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(12, 3, 8, generator=g) for _ in range(3))
    return q, k, v, torch.tensor([0, 4, 5, 12])


def _sdpa_per_image(q, k, v, cu):
    parts = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        o = F.scaled_dot_product_attention(*(t[a:b].transpose(0, 1) for t in (q, k, v)))
        parts.append(o.transpose(0, 1))
    return torch.cat(parts)


def test_default_and_reference_equal_sdpa_per_image():
    q, k, v, cu = _inputs()
    want = _sdpa_per_image(q, k, v, cu)
    default = AttentionOps.encoder_attention(ReferenceAttentionOps(), q, k, v, cu, 8**-0.5)
    reference = ReferenceAttentionOps().encoder_attention(q, k, v, cu, 8**-0.5)
    torch.testing.assert_close(default, want, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(reference, want, atol=1e-6, rtol=1e-5)


def test_an_image_is_blind_to_the_others():
    q, k, v, cu = _inputs()
    out = ReferenceAttentionOps().encoder_attention(q, k, v, cu, 8**-0.5)
    k2, v2 = k.clone(), v.clone()
    k2[5:] += 1.0
    v2[:4] -= 2.0
    out2 = ReferenceAttentionOps().encoder_attention(q, k2, v2, cu, 8**-0.5)
    assert torch.equal(out[4], out2[4])  # the one-patch image attends to itself alone
    assert not torch.equal(out[:4], out2[:4]) and not torch.equal(out[5:], out2[5:])
