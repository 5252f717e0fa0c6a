"""References of notebook 13, rope: rotary position embeddings (Su et al. 2021, RoFormer).

Feature pairs are rotated by an angle that grows with the position: pair i of the vector at
position m turns by m * theta_i, theta_i = base^(-2i/d). Two layouts of the pairs are in use:
``"interleaved"`` pairs features (2i, 2i + 1), as the RoFormer paper writes it (eq. 15);
``"halves"`` pairs (i, i + d/2), as GPT-NeoX and transformers implement it (``rotate_half``). The
functions take numpy arrays or torch tensors and compute in float64; ``apply_rope`` returns
a tensor of x's dtype, so that the attention module can call it on its float32 heads.
"""
from __future__ import annotations

import torch

from .multi_head import MultiHeadAttention, merge_heads, scaled_dot_product_attention, split_heads

PAIRINGS = ("interleaved", "halves")


def rope_angles(seq_len, d_k, base=10000.0):
    """(seq_len, d_k // 2) float64: angles[m, i] = m * base ** (-2 i / d_k), positions m = 0 ...

    Raises:
        ValueError: d_k is odd (one feature would have no partner).
    """
    if d_k % 2:
        raise ValueError(f"d_k must be even to form pairs, got {d_k}")
    i = torch.arange(d_k // 2, dtype=torch.float64)
    return torch.arange(seq_len, dtype=torch.float64)[:, None] * base ** (-2 * i / d_k)


def pair_halves(x, pairing):
    """The two members of every pair, (first, second), each (..., d_k / 2), in pair order."""
    half = x.shape[-1] // 2
    if pairing == "interleaved":
        return x[..., 0::2], x[..., 1::2]
    return x[..., :half], x[..., half:]


def unpair(first, second, pairing):
    """The inverse of ``pair_halves``: the features back in the layout of ``pairing``."""
    if pairing == "interleaved":
        return torch.stack([first, second], dim=-1).flatten(-2)
    return torch.cat([first, second], dim=-1)


def apply_rope(x, angles, pairing="interleaved"):
    """x (..., seq_len, d_k), angles (seq_len, d_k // 2) -> x rotated, (..., seq_len, d_k), x's dtype:
    (a, b) of pair i at position m -> (a cos - b sin, a sin + b cos) of angles[m, i].

    Raises:
        ValueError: pairing is neither "interleaved" nor "halves".
    """
    if pairing not in PAIRINGS:
        raise ValueError(f"pairing must be 'interleaved' or 'halves', got {pairing!r}")
    x = torch.as_tensor(x)
    angles = torch.as_tensor(angles, dtype=torch.float64)
    cos, sin = angles.cos(), angles.sin()
    a, b = pair_halves(x.double(), pairing)
    return unpair(a * cos - b * sin, a * sin + b * cos, pairing).to(x.dtype if x.is_floating_point() else torch.float64)


class RotaryMultiHeadAttention(MultiHeadAttention):
    """Notebook 06's MultiHeadAttention with the queries and keys of every head rotated,
    interleaved pairs, d_k frequencies: query position t, key position s, both from 0."""

    def rotate(self, q, k, v):
        return (apply_rope(q, rope_angles(q.shape[-2], self.d_k)),
                apply_rope(k, rope_angles(k.shape[-2], self.d_k)), v)

    def forward(self, query, key, value, mask=None):
        q, k, v = self.rotate(*(split_heads(layer(x), self.heads) for layer, x in
                                [(self.W_q, query), (self.W_k, key), (self.W_v, value)]))
        if mask is not None:
            mask = mask.unsqueeze(-3)
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        return self.W_o(merge_heads(out)), weights
