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


def rotary_attention_step(q, k, v, cache=None, base=10000.0):
    """Causal rotary self-attention of new tokens after `past` cached ones (a decoder's step).

    q, k, v (batch, heads, new_len, d_k), not rotated; cache None or (keys, values), each
    (batch, heads, past, d_k), the keys rotated at positions 0 ... past - 1 -> (out (batch, heads,
    new_len, d_k), (keys, values) of (batch, heads, past + new_len, d_k)): new token j sits at
    position past + j and attends to keys 0 ... past + j (the causal mask aligned bottom-right).

    Raises:
        ValueError: q, k and v do not hold the same number of new tokens.
    """
    past = 0 if cache is None else cache[0].shape[-2]
    new = q.shape[-2]
    if k.shape[-2] != new or v.shape[-2] != new:
        raise ValueError("q, k and v must hold the same number of new tokens")
    angles = rope_angles(past + new, q.shape[-1], base)[past:]
    q, k = apply_rope(q, angles), apply_rope(k, angles)
    if cache is not None:
        k, v = torch.cat([cache[0], k], dim=-2), torch.cat([cache[1], v], dim=-2)
    mask = torch.ones(new, past + new, dtype=torch.bool).tril(diagonal=past)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    return out, (k, v)
