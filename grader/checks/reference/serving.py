"""References of notebook 16, serving (learner-style; the hidden checks compare with these).

The paged KV cache (section 1): Kwon et al. (2023), "Efficient Memory Management for Large Language
Model Serving with PagedAttention", Sec. 4.1-4.2.

Speculative decoding (section 2): one step of speculative sampling, Leviathan, Kalman and Matias
(2023), "Fast Inference from Transformers via Speculative Decoding", Algorithm 1; Chen et al. (2023),
"Accelerating Large Language Model Decoding with Speculative Sampling", Algorithm 2.

``LatentAttention`` is the computation of Hugging Face transformers' ``DeepseekV2Attention``
(transformers 5.23.0) without a low-rank query (``q_lora_rank=None``, DeepSeek-V2-Lite's layout):
DeepSeek-AI (2024), DeepSeek-V2, section 2.1, equations 9-19. Linear weights are in nn.Linear's
layout, (out_features, in_features).

``SinkCache`` (section 4) is StreamingLLM's rolling KV cache: Xiao, Tian, Chen, Han and Lewis (2023),
"Efficient Streaming Language Models with Attention Sinks", Sec. 3.2 (Fig. 1d, and "positional encoding
within the cache").
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from .modern_decoder import RMSNorm, rotate_half

class PagedKVCache:
    """A KV cache in fixed-size blocks of one preallocated pool (vLLM's PagedAttention).

    key_blocks, value_blocks: (num_blocks, heads, block_size, d_k); free_blocks: the ids of the
    free blocks; block_tables: seq -> its blocks in order; lengths: seq -> its tokens.
    """

    def __init__(self, num_blocks, block_size, heads, d_k):
        self.block_size = block_size
        self.key_blocks = torch.zeros(num_blocks, heads, block_size, d_k)
        self.value_blocks = torch.zeros(num_blocks, heads, block_size, d_k)
        self.free_blocks = list(range(num_blocks))
        self.block_tables = {}
        self.lengths = {}

    def append(self, seq, k, v):
        length = self.lengths.get(seq, 0)
        table = self.block_tables.get(seq, [])
        needed = -(-(length + k.shape[1]) // self.block_size) - len(table)
        if needed > len(self.free_blocks):
            raise RuntimeError(f"out of blocks: {needed} more needed, {len(self.free_blocks)} free")
        for _ in range(needed):
            table.append(self.free_blocks.pop())
        for i in range(k.shape[1]):
            block, offset = table[(length + i) // self.block_size], (length + i) % self.block_size
            self.key_blocks[block, :, offset] = k[:, i]
            self.value_blocks[block, :, offset] = v[:, i]
        self.block_tables[seq] = table
        self.lengths[seq] = length + k.shape[1]

    def gather(self, seq):
        table, length = self.block_tables[seq], self.lengths[seq]
        heads, d_k = self.key_blocks.shape[1], self.key_blocks.shape[3]
        keys = self.key_blocks[table].transpose(0, 1).reshape(heads, -1, d_k)[:, :length]
        values = self.value_blocks[table].transpose(0, 1).reshape(heads, -1, d_k)[:, :length]
        return keys, values

    def free(self, seq):
        self.free_blocks.extend(self.block_tables.pop(seq))
        del self.lengths[seq]


def speculative_step(draft_tokens, q, p, generator):
    """One step of speculative sampling: the accepted draft tokens, then one token more.

    draft_tokens (k,) int64: x_1 .. x_k, x_i drawn from q[i - 1]. q (k, V) float64: the draft's
    distributions. p (k + 1, V) float64: the target's, from one forward over the prompt and the k
    drafts (p[i - 1] judges x_i; p[k] follows all k). The only draws: u = torch.rand(k + 1,
    generator=generator, dtype=torch.float64), first and all at once. x_i is accepted while
    u[i - 1] < p_i(x_i) / q_i(x_i) (probability min(1, p_i(x_i) / q_i(x_i))); at the first rejection
    the last token is drawn from norm(max(0, p_i - q_i)), after k acceptances from p[k], by the
    inverse CDF: the first token j with u[k] < cumsum(w)[j] / sum(w) (torch.searchsorted(...,
    right=True), clamped to V - 1). Returns (n + 1,) int64: x_1 .. x_n accepted, then that token.
    Raises ValueError when the shapes do not fit.
    """
    k, V = q.shape
    if tuple(draft_tokens.shape) != (k,) or tuple(p.shape) != (k + 1, V):
        raise ValueError(f"draft_tokens should be (k,), q (k, V) and p (k + 1, V); got {tuple(draft_tokens.shape)}, "
                         f"{tuple(q.shape)} and {tuple(p.shape)}")
    u = torch.rand(k + 1, generator=generator, dtype=torch.float64)
    x = draft_tokens.long()
    for i in range(k):
        if not u[i] < p[i, x[i]] / q[i, x[i]]:
            return torch.cat([x[:i], _inverse_cdf(torch.clamp(p[i] - q[i], min=0), u[k])])
    return torch.cat([x, _inverse_cdf(p[k], u[k])])


def _inverse_cdf(w, u):
    """(1,) int64: the first j with u < cumsum(w)[j] / sum(w)."""
    cdf = (torch.cumsum(w, 0) / w.sum()).to(torch.float64)
    return torch.searchsorted(cdf, u.reshape(1), right=True).clamp(max=len(w) - 1)


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


# ---------------------------------------------------------------- attention sinks (StreamingLLM)

def rope_at(x, positions, theta):
    """RoPE in the halves layout (notebook 15's Attention): x (..., length, head_dim) rotated at ``positions``."""
    inv_freq = theta ** (-torch.arange(0, x.shape[-1], 2, dtype=torch.float32) / x.shape[-1])
    angles = positions.float()[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)
    return x * angles.cos() + rotate_half(x) * angles.sin()


class SinkCache:
    """StreamingLLM's rolling KV cache of one attention layer: the first n_sink tokens of the stream (the
    attention sinks) and the last window tokens, the ones between evicted. keys and values (batch, kv_heads,
    length, head_dim), the keys before RoPE; attend(q, k, v) appends one token, evicts, rotates the cached keys
    at their positions in the cache 0 ... length - 1 and the query at length - 1, and returns the attention's
    output (batch, heads, 1, head_dim) (grouped heads, scores over sqrt(head_dim))."""

    def __init__(self, n_sink, window, rope_theta=10000.0):
        if n_sink < 0 or window < 1:
            raise ValueError(f"n_sink ({n_sink}) must be >= 0 and window ({window}) >= 1")
        self.n_sink, self.window, self.rope_theta = n_sink, window, rope_theta
        self.keys = self.values = None

    def attend(self, q, k, v):
        batch, heads, new, head_dim = q.shape
        kv_heads = k.shape[1]
        if new != 1 or tuple(k.shape) != (batch, kv_heads, 1, head_dim) or v.shape != k.shape or heads % kv_heads:
            raise ValueError(f"q should be (batch, heads, 1, head_dim), k and v (batch, kv_heads, 1, head_dim) with "
                             f"kv_heads dividing heads; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if self.keys is not None:
            k, v = torch.cat([self.keys, k], dim=2), torch.cat([self.values, v], dim=2)
        if k.shape[2] > self.n_sink + self.window:
            k = torch.cat([k[:, :, :self.n_sink], k[:, :, -self.window:]], dim=2)
            v = torch.cat([v[:, :, :self.n_sink], v[:, :, -self.window:]], dim=2)
        self.keys, self.values = k, v
        positions = torch.arange(k.shape[2])
        keys = rope_at(k, positions, self.rope_theta).repeat_interleave(heads // kv_heads, dim=1)
        query = rope_at(q, positions[-1:], self.rope_theta)
        weights = torch.softmax(query @ keys.transpose(2, 3) / math.sqrt(head_dim), dim=-1)
        return weights @ v.repeat_interleave(heads // kv_heads, dim=1)
