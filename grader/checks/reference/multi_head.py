"""References of notebook 06, multi_head (PyTorch, as the notebook)."""
from __future__ import annotations

import math

import torch
from torch import nn


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(batch, seq_len, d_model) -> (batch, heads, seq_len, d_k).

    Raises:
        ValueError: heads does not divide d_model.
    """
    batch, seq_len, d_model = x.shape
    if d_model % heads:
        raise ValueError(f"heads = {heads} does not divide d_model = {d_model}")
    return x.reshape(batch, seq_len, heads, d_model // heads).transpose(1, 2)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(batch, heads, seq_len, d_k) -> (batch, seq_len, heads * d_k), head j in columns j*d_k ..."""
    batch, heads, seq_len, d_k = x.shape
    return x.transpose(1, 2).reshape(batch, seq_len, heads * d_k)


def scaled_dot_product_attention(query, key, value, mask=None):
    """The notebook's read-only helper: softmax(Q K^T / sqrt(d_k)) V; mask True = may attend."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


class MultiHeadAttention(nn.Module):
    """Concat(head_1, ..., head_h) W_O with head_j = Attention(Q W_j^Q, K W_j^K, V W_j^V).

    Raises:
        ValueError: heads does not divide d_model (in __init__).
    """

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"heads = {heads} does not divide d_model = {d_model}")
        self.d_model, self.heads, self.d_k = d_model, heads, d_model // heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, query, key, value, mask=None):
        """(batch, q_len, d_model), (batch, k_len, d_model) x 2, mask broadcasting to (batch, q_len, k_len)
        or None -> (output (batch, q_len, d_model), weights (batch, heads, q_len, k_len))."""
        q, k, v = (split_heads(layer(x), self.heads) for layer, x in
                   [(self.W_q, query), (self.W_k, key), (self.W_v, value)])
        if mask is not None:
            mask = mask.unsqueeze(-3)  # a heads axis: (q_len, k_len) and (batch, 1 or q_len, k_len) alike
        out, weights = scaled_dot_product_attention(q, k, v, mask)
        return self.W_o(merge_heads(out)), weights


def load_torch_weights(module: MultiHeadAttention, torch_mha: nn.MultiheadAttention) -> MultiHeadAttention:
    """Copy torch_mha's packed in_proj (rows query, key, value) and out_proj into module's W_q .. W_o."""
    weights = torch_mha.in_proj_weight.chunk(3)
    biases = torch_mha.in_proj_bias.chunk(3)
    with torch.no_grad():
        for layer, weight, bias in zip((module.W_q, module.W_k, module.W_v), weights, biases):
            layer.weight.copy_(weight)
            layer.bias.copy_(bias)
        module.W_o.weight.copy_(torch_mha.out_proj.weight)
        module.W_o.bias.copy_(torch_mha.out_proj.bias)
    return module
