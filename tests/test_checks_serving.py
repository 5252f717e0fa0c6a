"""Mistake and variant cases of notebook 16's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must score
full marks (exercise-standard.md, item 6). Small modules: 6 seeds.
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.check_cases import shared_tests
from tests.conftest import solution_namespace


@pytest.fixture(scope="module")
def serving_notebook() -> dict:
    """The reference solutions of notebook 16."""
    return solution_namespace("16_serving")


# ---------------------------------------------------------------- LatentAttention (DeepSeek-V2's MLA)

class _Latent(nn.Module):
    """A learner's LatentAttention: the layers, written out; the cases below write forward(x, cache)."""

    def __init__(self, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta=10000.0, eps=1e-6,
                 rope_width=None):
        super().__init__()
        if rope_dim % 2:
            raise ValueError("rope_dim must be even")
        self.heads, self.kv_rank, self.nope, self.rope, self.v_dim = heads, kv_rank, nope_dim, rope_dim, v_dim
        self.theta = rope_theta
        self.W_q = nn.Linear(d_model, heads * (nope_dim + rope_dim), bias=False)
        self.W_dkv = nn.Linear(d_model, kv_rank + (rope_width or rope_dim), bias=False)
        self.kv_norm = nn.RMSNorm(kv_rank, eps=eps)
        self.W_ukv = nn.Linear(kv_rank, heads * (nope_dim + v_dim), bias=False)
        self.W_o = nn.Linear(heads * v_dim, d_model, bias=False)

    def queries(self, x):
        b, n, _ = x.shape
        return self.W_q(x).view(b, n, self.heads, -1).transpose(1, 2).split([self.nope, self.rope], dim=-1)

    def latents(self, x):
        c_kv, k_rope = self.W_dkv(x).split([self.kv_rank, self.W_dkv.out_features - self.kv_rank], dim=-1)
        return self.kv_norm(c_kv), k_rope

    def cos_sin(self, start, new, width=None):
        width = width or self.rope
        inv = 1.0 / self.theta ** (torch.arange(0, width, 2).float() / width)
        freqs = torch.outer(torch.arange(start, start + new).float(), inv).repeat_interleave(2, dim=-1)
        return freqs.cos(), freqs.sin()

    @staticmethod
    def pairs(t):
        even, odd = t[..., 0::2], t[..., 1::2]
        return torch.stack((-odd, even), dim=-1).flatten(-2)

    def rotate(self, t, start, width=None):
        cos, sin = self.cos_sin(start, t.shape[-2], width)
        return t * cos + self.pairs(t) * sin

    def heads_of(self, c_kv):
        b, n, _ = c_kv.shape
        return self.W_ukv(c_kv).view(b, n, self.heads, -1).transpose(1, 2).split([self.nope, self.v_dim], dim=-1)

    def attend(self, q, k, v, scale=None):
        new, total = q.shape[-2], k.shape[-2]
        mask = torch.ones(new, total, dtype=torch.bool).tril(diagonal=total - new)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        return self.W_o(out.transpose(1, 2).flatten(2))

    def step(self, x, cache, scale=None, start=None, rope_first=False):
        past = 0 if cache is None else cache[0].shape[1]
        q_nope, q_rope = self.queries(x)
        c_kv, k_rope = self.latents(x)
        first = past if start is None else start
        q_rope, k_rope = self.rotate(q_rope, first), self.rotate(k_rope, first)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], 1), torch.cat([cache[1], k_rope], 1)
        k_nope, v = self.heads_of(c_kv)
        shared = k_rope[:, None].expand(-1, self.heads, -1, -1)
        k = torch.cat([shared, k_nope] if rope_first else [k_nope, shared], -1)
        return self.attend(torch.cat([q_nope, q_rope], -1), k, v, scale), (c_kv, k_rope)


class SdpaLatent(_Latent):
    """torch's RMSNorm and scaled_dot_product_attention, the pairs rotated by even/odd slices."""

    def forward(self, x, cache=None):
        return self.step(x, cache)


class TransformersLatent(_Latent):
    """transformers' way: the pairs as complex numbers times e^(i m theta), the cache (batch, 1, positions, d)."""

    def forward(self, x, cache=None):
        b, n, _ = x.shape
        past = 0 if cache is None else cache[0].shape[2]
        q_nope, q_pe = self.queries(x)
        c_kv, k_pe = self.latents(x)
        inv = 1.0 / self.theta ** (torch.arange(0, self.rope, 2).float() / self.rope)
        freqs = torch.polar(torch.ones(n, self.rope // 2), torch.outer(torch.arange(past, past + n).float(), inv))

        def rotate(t):
            pairs = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
            return torch.view_as_real(pairs * freqs).flatten(-2)
        q_pe, k_pe = rotate(q_pe.contiguous()), rotate(k_pe.view(b, 1, n, self.rope).contiguous())
        c_kv = c_kv.view(b, 1, n, self.kv_rank)
        if cache is not None:
            c_kv, k_pe = torch.cat([cache[0], c_kv], 2), torch.cat([cache[1], k_pe], 2)
        k_nope, v = self.heads_of(c_kv[:, 0])
        k = torch.cat([k_nope, k_pe.expand(-1, self.heads, -1, -1)], -1)
        q = torch.cat([q_nope, q_pe], -1)
        weights = (q @ k.transpose(-1, -2) * (self.nope + self.rope) ** -0.5)
        total = k.shape[-2]
        weights = weights + torch.full((n, total), float("-inf")).triu(total - n + 1)
        out = weights.softmax(-1) @ v
        return self.W_o(out.transpose(1, 2).reshape(b, n, -1)), (c_kv, k_pe)


class AbsorbedLatent(_Latent):
    """The absorbed form (DeepSeek-V2, section 2.1.2): W_UK folded into the query, W_UV after the weights; the
    heads' keys and values are never built."""

    def forward(self, x, cache=None):
        b, n, _ = x.shape
        past = 0 if cache is None else cache[0].shape[1]
        q_nope, q_rope = self.queries(x)
        c_kv, k_rope = self.latents(x)
        q_rope, k_rope = self.rotate(q_rope, past), self.rotate(k_rope, past)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], 1), torch.cat([cache[1], k_rope], 1)
        W = self.W_ukv.weight.view(self.heads, self.nope + self.v_dim, self.kv_rank)
        W_uk, W_uv = W[:, :self.nope], W[:, self.nope:]                       # (heads, nope, kv_rank), ...
        q_latent = torch.einsum("bhnd,hdr->bhnr", q_nope, W_uk)              # the query in the latent space
        scores = (torch.einsum("bhnr,btr->bhnt", q_latent, c_kv)
                  + torch.einsum("bhnd,btd->bhnt", q_rope, k_rope)) / math.sqrt(self.nope + self.rope)
        total = c_kv.shape[1]
        scores = scores.masked_fill(torch.ones(n, total, dtype=torch.bool).triu(total - n + 1), float("-inf"))
        mixed = torch.einsum("bhnt,btr->bhnr", scores.softmax(-1), c_kv)     # weights over the latents
        out = torch.einsum("bhnr,hvr->bnhv", mixed, W_uv).reshape(b, n, -1)
        return self.W_o(out), (c_kv, k_rope)


class LlamaHalves(_Latent):
    """notebook 15's RoPE reused: rotate_half."""

    def rotate(self, t, start, width=None):
        inv = 1.0 / self.theta ** (torch.arange(0, self.rope, 2).float() / self.rope)
        freqs = torch.outer(torch.arange(start, start + t.shape[-2]).float(), inv)
        emb = torch.cat([freqs, freqs], -1)
        x1, x2 = t.chunk(2, dim=-1)
        return t * emb.cos() + torch.cat([-x2, x1], -1) * emb.sin()

    def forward(self, x, cache=None):
        return self.step(x, cache)


class FullCache(_Latent):
    """Caches every head's keys and values, as notebook 15's Attention did."""

    def forward(self, x, cache=None):
        past = 0 if cache is None else cache[0].shape[2]
        q_nope, q_rope = self.queries(x)
        c_kv, k_rope = self.latents(x)
        q_rope, k_rope = self.rotate(q_rope, past), self.rotate(k_rope, past)
        k_nope, v = self.heads_of(c_kv)
        k = torch.cat([k_nope, k_rope[:, None].expand(-1, self.heads, -1, -1)], -1)
        if cache is not None:
            k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)
        return self.attend(torch.cat([q_nope, q_rope], -1), k, v), (k, v)


class RopeKeyPerHead(_Latent):
    """A RoPE key for each head: W_dkv of kv_rank + heads * rope_dim rows."""

    def __init__(self, d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta=10000.0, eps=1e-6):
        super().__init__(d_model, heads, kv_rank, nope_dim, rope_dim, v_dim, rope_theta, eps,
                         rope_width=heads * rope_dim)

    def forward(self, x, cache=None):
        return self.step(x, cache)


class ScaledByNope(_Latent):
    def forward(self, x, cache=None):
        return self.step(x, cache, scale=1 / math.sqrt(self.nope))


class NoLatentNorm(_Latent):
    def latents(self, x):
        return self.W_dkv(x).split([self.kv_rank, self.rope], dim=-1)

    def forward(self, x, cache=None):
        return self.step(x, cache)


class PositionsFromZero(_Latent):
    def forward(self, x, cache=None):
        return self.step(x, cache, start=0)


class RopeFirstKeys(_Latent):
    def forward(self, x, cache=None):
        return self.step(x, cache, rope_first=True)


class RopeOnWholeHead(_Latent):
    """RoPE on the whole head, the keys rotated when read from the cache."""

    def forward(self, x, cache=None):
        past = 0 if cache is None else cache[0].shape[1]
        q_nope, q_rope = self.queries(x)
        c_kv, k_rope = self.latents(x)
        if cache is not None:
            c_kv, k_rope = torch.cat([cache[0], c_kv], 1), torch.cat([cache[1], k_rope], 1)
        k_nope, v = self.heads_of(c_kv)
        width = self.nope + self.rope
        k = self.rotate(torch.cat([k_nope, k_rope[:, None].expand(-1, self.heads, -1, -1)], -1), 0, width)
        q = self.rotate(torch.cat([q_nope, q_rope], -1), past, width)
        return self.attend(q, k, v), (c_kv, k_rope)


MISTAKES = {
    "serving-LatentAttention": [
        (LlamaHalves, "RoPE rotates the halves"),
        (FullCache, "multi-head latent attention caches kv_rank + rope_dim"),
        (RopeKeyPerHead, "one RoPE key shared by all heads (not one per head)"),
        (ScaledByNope, "divided by sqrt(nope_dim)"),
        (NoLatentNorm, "the latent is not normalized"),
        (PositionsFromZero, "rotated from position 0 again"),
        (RopeFirstKeys, "the keys are [k_rope, k_nope]"),
        (RopeOnWholeHead, "RoPE rotates each whole head"),
    ],
}

VARIANTS = {
    "serving-LatentAttention": [SdpaLatent, TransformersLatent, AbsorbedLatent],
}

globals().update(shared_tests("serving", MISTAKES, VARIANTS, solutions="serving_notebook", seeds=6))
