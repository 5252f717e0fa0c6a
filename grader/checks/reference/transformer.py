"""References of notebook 09, transformer (torch, the learner's signatures).

The layers are torch's own ``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer``
(post-norm, ReLU, batch first): notebooks 07 and 08 match the learner's layers to them and
the exercise loads its weights under their parameter names. Masks follow the course
convention (True = may attend / real token); torch's are the reverse, hence the ``~``.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import masking
from .encoder import sinusoidal_encoding


def causal_mask(size: int) -> torch.Tensor:
    """(size, size) bool: notebook 03's causal mask (its reference), as a tensor."""
    return torch.from_numpy(masking.causal_mask(size))


class Transformer(nn.Module):
    """The encoder-decoder of the exercise: ids in, logits out (no softmax)."""

    def __init__(self, src_vocab, tgt_vocab, d_model, heads, d_ff, layers, max_len, pad_id, dropout=0.0):
        super().__init__()
        self.d_model, self.pad_id = d_model, pad_id
        self.src_embed = nn.Embedding(src_vocab, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.encoder_layers = nn.ModuleList([nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout, batch_first=True)
                                             for _ in range(layers)])
        self.decoder_layers = nn.ModuleList([nn.TransformerDecoderLayer(d_model, heads, d_ff, dropout, batch_first=True)
                                             for _ in range(layers)])
        self.generator = nn.Linear(d_model, tgt_vocab)

    def encode(self, src, src_mask):
        x = self.dropout(self.src_embed(src) * math.sqrt(self.d_model) + self.pe[: src.shape[1]])
        for layer in self.encoder_layers:
            x = layer(x, src_key_padding_mask=~src_mask)
        return x

    def decode(self, memory, src_mask, tgt_in):
        y = self.dropout(self.tgt_embed(tgt_in) * math.sqrt(self.d_model) + self.pe[: tgt_in.shape[1]])
        future = ~causal_mask(tgt_in.shape[1])
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_mask=future, memory_key_padding_mask=~src_mask)
        return self.generator(y)

    def forward(self, src, tgt_in):
        src_mask = src != self.pad_id
        return self.decode(self.encode(src, src_mask), src_mask, tgt_in)


def label_smoothed_loss(logits, target, pad_id, smoothing):
    """Mean over the non-pad targets of -sum_c q_c log_softmax(logits)_c, with q[pad] = 0,
    smoothing / (V - 1) on every other class and 1 - smoothing on top of that for the true one."""
    V = logits.shape[-1]
    log_probs = F.log_softmax(logits, dim=-1).reshape(-1, V)
    target = target.reshape(-1)
    q = torch.full_like(log_probs, smoothing / (V - 1))
    q[:, pad_id] = 0.0
    q.scatter_(1, target[:, None], 1 - smoothing + smoothing / (V - 1))
    keep = target != pad_id
    return -(q * log_probs).sum(dim=-1)[keep].mean()


def noam_lr(step, d_model, warmup, factor=1.0):
    """factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5) (Sec. 5.3).

    Raises:
        ValueError: step < 1.
    """
    if step < 1:
        raise ValueError(f"steps start at 1, got step={step}")
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


@torch.no_grad()
def greedy_decode(model, src, bos_id, eos_id, pad_id, max_len):
    """Encode once; append the argmax at the last position until every sentence has its EOS
    or max_len steps ran; pad_id after a sentence's EOS; no BOS in the result."""
    src_mask = src != pad_id
    memory = model.encode(src, src_mask)
    ys = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    finished = torch.zeros(src.shape[0], dtype=torch.bool)
    for _ in range(max_len):
        next_token = model.decode(memory, src_mask, ys)[:, -1].argmax(dim=-1).masked_fill(finished, pad_id)
        ys = torch.cat([ys, next_token[:, None]], dim=1)
        finished |= next_token == eos_id
        if finished.all():
            break
    return ys[:, 1:]


def train_step(model, src, tgt, optimizer, scheduler, loss_fn):
    """One teacher-forced step: train mode, shift, loss, zero_grad, backward, step, schedule."""
    model.train()
    loss = loss_fn(model(src, tgt[:, :-1]), tgt[:, 1:])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()
