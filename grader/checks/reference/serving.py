"""References of notebook 16, serving: how the models of notebook 15 are served.

``LatentAttention`` is the computation of Hugging Face transformers' ``DeepseekV2Attention``
(transformers 5.23.0) without a low-rank query (``q_lora_rank=None``, DeepSeek-V2-Lite's layout):
DeepSeek-AI (2024), DeepSeek-V2, section 2.1, equations 9-19. Linear weights are in nn.Linear's
layout, (out_features, in_features).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .modern_decoder import RMSNorm


# ---------------------------------------------------------------- multi-head latent attention (DeepSeek-V2)

def rotate_pairs(x):
    """(..., d) -> (..., d): each pair (x_2i, x_2i+1) -> (-x_2i+1, x_2i), RoPE's interleaved layout (RoFormer's,
    and DeepSeek's: transformers' apply_rotary_emb multiplies the pairs as complex numbers)."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)


class LatentAttention(nn.Module):
    """(batch, new_len, d_model), cache -> ((batch, new_len, d_model), (latents, rope_keys)): DeepSeek-V2's
    multi-head latent attention (DeepseekV2Attention, q_lora_rank None). Each token's keys and values are
    compressed to one latent c_kv = kv_norm(W_dkv(x)[:kv_rank]) and one RoPE key k_rope = W_dkv(x)[kv_rank:],
    rotated in the interleaved layout and shared by all heads; head h's key is [k_nope_h, k_rope] and its value
    v_h, with [k_nope_h, v_h] the h-th block of W_ukv(c_kv); its query [q_nope_h, q_rope_h] is the h-th block of
    W_q(x), q_rope_h rotated. Scores divided by sqrt(nope_dim + rope_dim), causal (bottom-right). The cache holds
    only the latents (batch, positions, kv_rank) and the rotated rope keys (batch, positions, rope_dim)."""

    def __init__(self, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta=10000.0, eps=1e-6):
        super().__init__()
        if rope_dim % 2:
            raise ValueError(f"rope_dim ({rope_dim}) must be even: RoPE rotates pairs of features")
        self.heads, self.kv_rank, self.nope_dim, self.rope_dim, self.v_dim = heads, kv_rank, nope_dim, rope_dim, v_dim
        self.rope_theta = rope_theta
        self.W_q = nn.Linear(d_model, heads * (nope_dim + rope_dim), bias=False)
        self.W_dkv = nn.Linear(d_model, kv_rank + rope_dim, bias=False)
        self.kv_norm = RMSNorm(kv_rank, eps)
        self.W_ukv = nn.Linear(kv_rank, heads * (nope_dim + v_dim), bias=False)
        self.W_o = nn.Linear(heads * v_dim, d_model, bias=False)

    def forward(self, x, cache=None):
        batch, new, _ = x.shape
        past = 0 if cache is None else cache[0].shape[1]
        q = self.W_q(x).view(batch, new, self.heads, self.nope_dim + self.rope_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_rope = self.W_dkv(x).split([self.kv_rank, self.rope_dim], dim=-1)
        c_kv = self.kv_norm(c_kv)
        inv_freq = self.rope_theta ** (-torch.arange(0, self.rope_dim, 2, dtype=torch.float32) / self.rope_dim)
        angles = torch.arange(past, past + new, dtype=torch.float32)[:, None] * inv_freq
        angles = angles.repeat_interleave(2, dim=-1)                 # (new_len, rope_dim), pairs (2i, 2i + 1)
        q_rope = q_rope * angles.cos() + rotate_pairs(q_rope) * angles.sin()
        k_rope = k_rope * angles.cos() + rotate_pairs(k_rope) * angles.sin()
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], dim=1), torch.cat([cache[1], k_rope], dim=1)
        kv = self.W_ukv(c_kv).view(batch, past + new, self.heads, self.nope_dim + self.v_dim).transpose(1, 2)
        k_nope, v = kv.split([self.nope_dim, self.v_dim], dim=-1)
        keys = torch.cat([k_nope, k_rope[:, None].expand(-1, self.heads, -1, -1)], dim=-1)
        queries = torch.cat([q_nope, q_rope], dim=-1)
        scores = queries @ keys.transpose(2, 3) / math.sqrt(self.nope_dim + self.rope_dim)
        allowed = torch.ones(new, past + new, dtype=torch.bool).tril(diagonal=past)
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(batch, new, self.heads * self.v_dim)
        return self.W_o(out), (c_kv, k_rope)
