"""References of notebook 15, modern_decoder: the parts of the decoder of today's open models
(Llama 3, Qwen 3, Mistral), each the computation of Hugging Face transformers' module of the
same part: ``RMSNorm`` is ``LlamaRMSNorm``'s, ``SwiGLU`` is ``LlamaMLP``'s (no biases,
``hidden_act="silu"``). Linear weights are in nn.Linear's layout, (out_features, in_features).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    """(..., d_model) -> (..., d_model): x / sqrt(mean(x^2) + eps) * weight over the last axis
    (Zhang and Sennrich 2019; LlamaRMSNorm). No mean is subtracted and there is no bias."""

    def __init__(self, d_model, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d_model))
        self.eps = eps

    def forward(self, x):
        return x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


class SwiGLU(nn.Module):
    """(..., d_model) -> (..., d_model): W_down(silu(W_gate(x)) * W_up(x)) (Shazeer 2020, FFN_SwiGLU
    without biases; LlamaMLP's gate_proj, up_proj and down_proj)."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.W_gate = nn.Linear(d_model, d_ff, bias=False)
        self.W_up = nn.Linear(d_model, d_ff, bias=False)
        self.W_down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x):
        return self.W_down(F.silu(self.W_gate(x)) * self.W_up(x))


def rotate_half(x):
    """(..., head_dim) -> (..., head_dim): (x1, x2) -> (-x2, x1), the halves x1 = x[..., :head_dim // 2] and
    x2 = x[..., head_dim // 2:] (transformers' rotate_half: RoPE in the halves layout, pairs (i, i + head_dim/2))."""
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    """(batch, new_len, d_model), cache -> ((batch, new_len, d_model), (keys, values)): Llama's and Qwen3's
    attention (LlamaAttention, Qwen3Attention): projections without bias, heads query heads over kv_heads
    key/value heads (query head h reads key/value head h // (heads // kv_heads)), QK-norm (an RMSNorm over
    head_dim on each head's queries and keys, before RoPE) when qk_norm, RoPE in the halves layout at the
    true positions past ... past + new_len - 1, causal (the mask aligned bottom-right), scale 1/sqrt(head_dim).
    The cache holds the rotated keys and the values, (batch, kv_heads, positions, head_dim) each."""

    def __init__(self, d_model, heads, kv_heads, head_dim, rope_theta=10000.0, qk_norm=False, eps=1e-6):
        super().__init__()
        if heads % kv_heads:
            raise ValueError(f"kv_heads ({kv_heads}) must divide heads ({heads})")
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.rope_theta, self.qk_norm = rope_theta, qk_norm
        self.W_q = nn.Linear(d_model, heads * head_dim, bias=False)
        self.W_k = nn.Linear(d_model, kv_heads * head_dim, bias=False)
        self.W_v = nn.Linear(d_model, kv_heads * head_dim, bias=False)
        self.W_o = nn.Linear(heads * head_dim, d_model, bias=False)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, eps)
            self.k_norm = RMSNorm(head_dim, eps)

    def forward(self, x, cache=None):
        batch, new, _ = x.shape
        past = 0 if cache is None else cache[0].shape[2]
        q = self.W_q(x).view(batch, new, self.heads, self.head_dim).transpose(1, 2)
        k = self.W_k(x).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.W_v(x).view(batch, new, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        inv_freq = self.rope_theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        angles = torch.arange(past, past + new, dtype=torch.float32)[:, None] * inv_freq
        angles = torch.cat([angles, angles], dim=-1)                    # (new_len, head_dim), halves layout
        q = q * angles.cos() + rotate_half(q) * angles.sin()
        k = k * angles.cos() + rotate_half(k) * angles.sin()
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        group = self.heads // self.kv_heads
        keys, values = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        scores = q @ keys.transpose(2, 3) / math.sqrt(self.head_dim)
        allowed = torch.ones(new, past + new, dtype=torch.bool).tril(diagonal=past)
        weights = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        out = (weights @ values).transpose(1, 2).reshape(batch, new, self.heads * self.head_dim)
        return self.W_o(out), (k, v)


class DecoderLayer(nn.Module):
    """(batch, new_len, d_model), cache -> ((batch, new_len, d_model), (keys, values)): the block of Llama and
    Qwen 3 (LlamaDecoderLayer, Qwen3DecoderLayer), pre-norm with two residuals:
    h = x + attention(input_norm(x), cache); out = h + mlp(post_attention_norm(h))."""

    def __init__(self, d_model, heads, kv_heads, head_dim, d_ff, rope_theta=10000.0, qk_norm=False, eps=1e-6):
        super().__init__()
        self.input_norm = RMSNorm(d_model, eps)
        self.attention = Attention(d_model, heads, kv_heads, head_dim, rope_theta, qk_norm, eps)
        self.post_attention_norm = RMSNorm(d_model, eps)
        self.mlp = SwiGLU(d_model, d_ff)

    def forward(self, x, cache=None):
        attended, cache = self.attention(self.input_norm(x), cache)
        h = x + attended
        return h + self.mlp(self.post_attention_norm(h)), cache


class Model(nn.Module):
    """(batch, new_len) token ids, caches -> ((batch, new_len, vocab_size) logits, caches): the decoder-only
    model of Llama 3 and Qwen 3 (LlamaForCausalLM, Qwen3ForCausalLM): the token embedding (no scale, no
    positions: RoPE is in the attention), ``layers`` DecoderLayers, a final RMSNorm, an output layer without
    bias, tied to the embedding when tie_embeddings. The caches are one (keys, values) per layer."""

    def __init__(self, vocab_size, d_model, layers, heads, kv_heads, head_dim, d_ff, rope_theta=10000.0,
                 qk_norm=False, eps=1e-6, tie_embeddings=False):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList([DecoderLayer(d_model, heads, kv_heads, head_dim, d_ff, rope_theta, qk_norm, eps)
                                     for _ in range(layers)])
        self.norm = RMSNorm(d_model, eps)
        self.output = nn.Linear(d_model, vocab_size, bias=False)
        if tie_embeddings:
            self.output.weight = self.embedding.weight

    def forward(self, ids, cache=None):
        x = self.embedding(ids)
        caches = []
        for i, layer in enumerate(self.layers):
            x, layer_cache = layer(x, None if cache is None else cache[i])
            caches.append(layer_cache)
        return self.output(self.norm(x)), caches
