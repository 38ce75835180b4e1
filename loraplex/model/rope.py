"""Rotary position embeddings: inverse frequencies for each scaling type, and cos/sin per token.

The frequency formulas follow the published methods as transformers implements them (float32
math, same order of operations) so logits match a transformers model of the same checkpoint:

- default: ``theta ** (-2i/d)``;  linear: divided by ``factor``;
- dynamic (NTK): theta grows with the sequence length once it exceeds the trained context;
- llama3: low frequencies divided by ``factor``, high ones kept, a smooth ramp in between;
- yarn: per-dimension blend of interpolated and extrapolated frequencies, plus a cos/sin scale.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from loraplex.model.config import RopeConfig


@dataclass(frozen=True)
class RopeTables:
    """cos and sin for the tokens of one forward, shared by every layer."""

    cos: torch.Tensor  # [num_tokens, head_dim] in the model dtype
    sin: torch.Tensor  # [num_tokens, head_dim] in the model dtype


def _base_inv_freq(theta: float | torch.Tensor, dim: int, device: torch.device) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=device).float() / dim
    if isinstance(theta, torch.Tensor):
        return 1.0 / (theta[:, None] ** exponents[None, :])
    return 1.0 / (theta**exponents)


def _llama3(rope: RopeConfig, dim: int, device: torch.device) -> torch.Tensor:
    inv_freq = _base_inv_freq(rope.theta, dim, device)
    context = rope.original_max_position_embeddings
    low_wavelen = context / rope.low_freq_factor
    high_wavelen = context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def yarn_attention_factor(rope: RopeConfig) -> float:
    """The cos/sin scale yarn applies: the paper's ``0.1 ln(s) + 1``, or a ratio of mscales."""
    if rope.attention_factor is not None:
        return rope.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)


def _yarn(rope: RopeConfig, dim: int, device: torch.device) -> torch.Tensor:
    context = rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(context / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # a zero-width ramp would divide by zero
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation_weight = 1 - ramp.to(device)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).to(device=device, dtype=torch.float) / dim)
    extrapolated = 1.0 / pos_freqs
    interpolated = 1.0 / (rope.factor * pos_freqs)
    return interpolated * (1 - extrapolation_weight) + extrapolated * extrapolation_weight


class RotaryEmbedding:
    """Produces RopeTables for token positions. Stateless after construction.

    NOTE: dynamic NTK scaling depends on the sequence length; it is computed per token from its
    own sequence's length in this forward (``seq_lens``), which is what transformers computes for
    one sequence decoded with a cache, and keeps results independent of batch composition.
    """

    def __init__(
        self, rope: RopeConfig, head_dim: int, max_position_embeddings: int, device: torch.device
    ) -> None:
        self.rope = rope
        self.head_dim = head_dim
        self.max_position_embeddings = max_position_embeddings
        self.scale = yarn_attention_factor(rope) if rope.rope_type == "yarn" else 1.0
        if rope.rope_type == "linear":
            self.inv_freq = _base_inv_freq(rope.theta, head_dim, device) / rope.factor
        elif rope.rope_type == "llama3":
            self.inv_freq = _llama3(rope, head_dim, device)
        elif rope.rope_type == "yarn":
            self.inv_freq = _yarn(rope, head_dim, device)
        else:
            self.inv_freq = _base_inv_freq(rope.theta, head_dim, device)

    def tables(
        self, positions: torch.Tensor, seq_lens: torch.Tensor | None, dtype: torch.dtype
    ) -> RopeTables:
        """cos/sin for ``positions`` [num_tokens]; ``seq_lens`` [num_tokens] is each token's
        sequence length in this forward (used by dynamic scaling only)."""
        inv_freq = self._inv_freq_for(positions, seq_lens)
        freqs = positions.float()[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.scale != 1.0:
            cos, sin = cos * self.scale, sin * self.scale
        return RopeTables(cos=cos.to(dtype), sin=sin.to(dtype))

    def _inv_freq_for(self, positions: torch.Tensor, seq_lens: torch.Tensor | None) -> torch.Tensor:
        if self.rope.rope_type != "dynamic" or seq_lens is None:
            return self.inv_freq
        if int(seq_lens.max()) <= self.max_position_embeddings:
            return self.inv_freq
        dim, factor = self.head_dim, self.rope.factor
        lengths = seq_lens.to(torch.float32).clamp(min=self.max_position_embeddings)
        grown = (factor * lengths / self.max_position_embeddings) - (factor - 1)
        theta = self.rope.theta * grown ** (dim / (dim - 2))
        return _base_inv_freq(theta, dim, positions.device)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """Rotate ``x`` [num_tokens, heads, head_dim] by its tokens' positions."""
    cos, sin = tables.cos[:, None, :], tables.sin[:, None, :]
    return (x * cos) + (rotate_half(x) * sin)
