"""FP8 KV cache: how one attention KV entry is packed into bytes, and back.

``kv_cache_dtype="fp8"`` stores the attention pools (sliding-window KV and compressed KV) as byte rows
instead of rows of the model dtype. One entry of ``head_dim`` channels, whose trailing ``rope_dim``
channels carry RoPE, becomes::

    [ codes: nope x e4m3 | pad to 16 | rope: rope_dim x model dtype | scales: ceil(nope / 64) x float32 | pad to 16 ]

- the ``nope = head_dim - rope_dim`` channels are e4m3 codes, one scale per group of :data:`GROUP`
  channels (the last group may be shorter);
- the RoPE channels stay in the model dtype: positions are not quantized;
- every scale is a power of two, the smallest with ``448 * scale >= amax(|group|)``. Dividing by it is
  exact, so the codes are the round-to-nearest-even e4m3 of ``x / scale`` in any implementation, and
  ``code * scale`` is exact in bf16 and float32: a kernel that decodes in-register reproduces
  :meth:`Fp8KVFormat.unpack` bit for bit.

V4-Flash (head_dim 512, rope 64, bf16): 448 + 128 + 28 bytes, padded to 608 per entry against 1,024.
The indexer's keys are not packed (they are a quarter of the entry width and feed a top-k).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

GROUP = 64  # channels per scale
E4M3_MAX = 448.0
#: "fp8" is an alias of "fp8_e4m3", as in vLLM; "unquantized": every pool in the model dtype (V4's "auto";
#: V4.1's "auto" is its trained FP8 / FP4 cache)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "unquantized")
_MIN_AMAX = 2.0**-100  # an all-zero group still gets a normal scale


def _round16(n: int) -> int:
    return (n + 15) // 16 * 16


def is_fp8(kv_cache_dtype: str) -> bool:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is invalid; allowed: {list(KV_CACHE_DTYPES)}")
    return kv_cache_dtype in ("fp8", "fp8_e4m3")


def power_of_two_scale(amax: torch.Tensor) -> torch.Tensor:
    """The smallest ``2**e`` with ``448 * 2**e >= amax`` (float32, exact): with ``amax = m * 2**k``,
    ``m`` in [0.5, 1), and ``448 = 0.875 * 2**9``, ``e = k - 9`` when ``m <= 0.875``, else ``k - 8``."""
    m, k = torch.frexp(amax.float().clamp_min(_MIN_AMAX))
    e = k - 9 + (m > 0.875).to(k.dtype)
    # 2**e from its bits: torch.ldexp multiplies by pow(2, e), which CUDA's powf need not give exactly
    return ((e.to(torch.int32) + 127) << 23).view(torch.float32)


@dataclass(frozen=True)
class Fp8KVFormat:
    head_dim: int
    rope_dim: int
    rope_dtype: torch.dtype  # the model dtype: the RoPE channels and what unpack returns

    def __post_init__(self) -> None:
        if not 0 <= self.rope_dim < self.head_dim or self.rope_dim % 2:
            raise ValueError(
                f"rope_dim={self.rope_dim} must be even and in [0, head_dim={self.head_dim}) for an FP8 KV cache"
            )

    @property
    def nope(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def num_scales(self) -> int:
        return -(-self.nope // GROUP)

    @property
    def rope_offset(self) -> int:
        return _round16(self.nope)

    @property
    def scale_offset(self) -> int:
        return _round16(self.rope_offset + self.rope_dim * self._rope_size)

    @property
    def row_bytes(self) -> int:
        return _round16(self.scale_offset + 4 * self.num_scales)

    @property
    def _rope_size(self) -> int:
        return torch.empty((), dtype=self.rope_dtype).element_size()

    def pack(self, values: torch.Tensor) -> torch.Tensor:
        """``[N, head_dim]`` (any float dtype) -> ``[N, row_bytes]`` uint8."""
        n = values.shape[0]
        nope = values[:, : self.nope].float()
        padded = torch.nn.functional.pad(nope, (0, self.num_scales * GROUP - self.nope))
        groups = padded.view(n, self.num_scales, GROUP)
        scale = power_of_two_scale(groups.abs().amax(dim=-1))  # [N, G]
        codes = (groups / scale[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        out = torch.zeros(n, self.row_bytes, dtype=torch.uint8, device=values.device)
        out[:, : self.nope] = codes.view(n, -1)[:, : self.nope].view(torch.uint8)
        rope = values[:, self.nope :].to(self.rope_dtype).contiguous()
        out[:, self.rope_offset : self.rope_offset + rope.shape[1] * self._rope_size] = rope.view(torch.uint8)
        out[:, self.scale_offset : self.scale_offset + 4 * self.num_scales] = scale.contiguous().view(
            torch.uint8
        )
        return out

    def unpack(self, rows: torch.Tensor) -> torch.Tensor:
        """``[N, row_bytes]`` uint8 -> ``[N, head_dim]`` in ``rope_dtype`` (exact: see the module doc)."""
        n = rows.shape[0]
        codes = rows[:, : self.nope].contiguous().view(torch.float8_e4m3fn).float()
        s0 = self.scale_offset
        scale = rows[:, s0 : s0 + 4 * self.num_scales].contiguous().view(torch.float32)
        nope = codes * scale.repeat_interleave(GROUP, dim=1)[:, : self.nope]
        r0 = self.rope_offset
        rope = rows[:, r0 : r0 + self.rope_dim * self._rope_size].contiguous().view(self.rope_dtype)
        return torch.cat([nope.to(self.rope_dtype), rope], dim=1).view(n, self.head_dim)
