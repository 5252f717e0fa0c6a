"""References of notebook 07, encoder (PyTorch, as the notebook is).

The layer and the stack are split into small methods (the padding mask, one sublayer,
one connection, the inputs of the stack) so that a catalogued mistake is this module's
class with one method overridden: the rest of it stays the reference. On inputs of the
wrong shape they raise torch's own RuntimeError (the grader calls them on drawn inputs only).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from . import positional_encoding


def layer_norm(x, gamma, beta, eps=1e-5):
    """(..., d) -> (..., d): (x - mean) / sqrt(var + eps) * gamma + beta over the last axis,
    with the biased variance (nn.LayerNorm's)."""
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True, correction=0)
    return (x - mean) / torch.sqrt(var + eps) * gamma + beta


def feed_forward(x, W1, b1, W2, b2):
    """(..., d_model) -> (..., d_model): relu(x W1^T + b1) W2^T + b2 (nn.Linear's layout)."""
    return torch.relu(x @ W1.T + b1) @ W2.T + b2


def sublayer_connection(x, sublayer, norm, norm_first=False):
    """Post-norm norm(x + sublayer(x)), or pre-norm x + sublayer(norm(x))."""
    if norm_first:
        return x + sublayer(norm(x))
    return norm(x + sublayer(x))


def sinusoidal_encoding(max_len, d_model):
    """(max_len, d_model) float32: notebook 05's table (its reference), as a tensor."""
    return torch.from_numpy(positional_encoding.sinusoidal_encoding(max_len, d_model)).float()


class EncoderLayer(nn.Module):
    """torch.nn.TransformerEncoderLayer(batch_first=True) with the course's padding mask
    (True = a real token); the same parameter names."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def ignored(self, padding_mask):
        """PyTorch's key_padding_mask (True = ignore) of the course's padding mask."""
        return None if padding_mask is None else ~padding_mask

    def attend(self, t, ignore):
        return self.dropout(self.self_attn(t, t, t, key_padding_mask=ignore, need_weights=False)[0])

    def ffn(self, t):
        return self.dropout(self.linear2(self.dropout(torch.relu(self.linear1(t)))))

    def connect(self, x, sublayer, norm):
        return sublayer_connection(x, sublayer, norm, self.norm_first)

    def norms(self):
        return self.norm1, self.norm2

    def forward(self, x, padding_mask=None):
        ignore = self.ignored(padding_mask)
        first, second = self.norms()
        x = self.connect(x, lambda t: self.attend(t, ignore), first)
        return self.connect(x, self.ffn, second)


class Encoder(nn.Module):
    """Embeddings * sqrt(d_model) + sinusoidal positions, dropout, then the layers with the
    padding mask src != pad_id."""

    layer = EncoderLayer

    def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len, pad_id=0, dropout=0.0):
        super().__init__()
        self.d_model, self.pad_id = d_model, pad_id
        self.embed = nn.Embedding(vocab_size, d_model)
        # one row more than asked: a mistake shifting the positions by one must not index past the end
        self.register_buffer("pe", sinusoidal_encoding(max_len + 1, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.layers = nn.ModuleList([self.layer(d_model, heads, d_ff, dropout) for _ in range(layers)])

    def inputs(self, src):
        return self.embed(src) * math.sqrt(self.d_model) + self.pe[:src.shape[1]]

    def padding(self, src):
        return src != self.pad_id

    def stack(self):
        return list(self.layers)

    def forward(self, src):
        keep = self.padding(src)
        x = self.dropout(self.inputs(src))
        for layer in self.stack():
            x = layer(x, keep)
        return x
