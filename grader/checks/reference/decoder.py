"""References of notebook 08, decoder (PyTorch, as the notebook is), built on the encoder's.

The layer and the stack are split into methods as in ``reference/encoder.py``, for the
same reason; wrong shapes raise torch's own RuntimeError.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .encoder import Encoder, sublayer_connection


def shift_right(target, bos_id):
    """(batch, tgt_len) ids -> BOS, then the target without its last token (the target's dtype)."""
    bos = torch.full((target.shape[0], 1), bos_id, dtype=target.dtype)
    return torch.cat([bos, target[:, :-1]], dim=1)


def decoder_self_mask(tgt_in, pad_id):
    """(batch, tgt_len) ids -> (batch, tgt_len, tgt_len) bool: key j <= query i and not padding."""
    length = tgt_in.shape[1]
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool))
    return causal & (tgt_in != pad_id)[:, None, :]


def future_influence(decoder, tgt_in, memory, position, new_token):
    """(batch, tgt_len): the largest absolute change of each output when the token at
    ``position`` becomes ``new_token`` (tgt_in itself unchanged)."""
    changed = tgt_in.clone()
    changed[:, position] = new_token
    with torch.no_grad():
        return (decoder(changed, memory) - decoder(tgt_in, memory)).abs().amax(dim=-1)


def torch_attn_mask(mask, heads):
    """A course mask (True = may attend), None, (q, k) or (batch, q, k), as nn.MultiheadAttention's
    attn_mask (True = ignore), 3-D masks repeated once per head."""
    if mask is None:
        return None
    ignore = ~mask
    return ignore.repeat_interleave(heads, dim=0) if ignore.dim() == 3 else ignore


class DecoderLayer(nn.Module):
    """torch.nn.TransformerDecoderLayer(batch_first=True) with the course's masks; the same
    parameter names. Split into methods so that a catalogued mistake overrides one."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.heads, self.norm_first = heads, norm_first
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.multihead_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def self_mask(self, tgt_mask):
        return torch_attn_mask(tgt_mask, self.heads)

    def memory_ignored(self, memory_padding_mask):
        return None if memory_padding_mask is None else ~memory_padding_mask

    def attend(self, x, mask):
        return self.dropout(self.self_attn(x, x, x, attn_mask=mask, need_weights=False)[0])

    def cross(self, x, memory, ignored):
        return self.dropout(self.multihead_attn(x, memory, memory, key_padding_mask=ignored, need_weights=False)[0])

    def ffn(self, x):
        return self.dropout(self.linear2(self.dropout(torch.relu(self.linear1(x)))))

    def connect(self, x, sublayer, norm):
        return sublayer_connection(x, sublayer, norm, self.norm_first)

    def norms(self):
        return self.norm1, self.norm2, self.norm3

    def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
        mask, ignored = self.self_mask(tgt_mask), self.memory_ignored(memory_padding_mask)
        sublayers = (lambda x: self.attend(x, mask), lambda x: self.cross(x, memory, ignored), self.ffn)
        x = y
        for sublayer, norm in zip(sublayers, self.norms()):
            x = self.connect(x, sublayer, norm)
        return x


class Decoder(Encoder):
    """The encoder's inputs (embeddings * sqrt(d_model) + sinusoidal positions, dropout), then
    decoder layers, each with decoder_self_mask(tgt_in, pad_id) and the memory's padding mask."""

    layer = DecoderLayer

    def mask(self, tgt_in):
        return decoder_self_mask(tgt_in, self.pad_id)

    def forward(self, tgt_in, memory, memory_padding_mask=None):
        x, mask = self.dropout(self.inputs(tgt_in)), self.mask(tgt_in)
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=mask, memory_padding_mask=memory_padding_mask)
        return x
