"""References of notebook 10, seq2seq_rnn (torch for the model and its attention, numpy for
the accuracy by length; the learner's signatures)."""
from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn


def additive_attention(query, keys, W_q, W_k, v, mask=None, projected_keys=None):
    """Bahdanau's score v . tanh(W_q q + W_k k_j), softmax over the source positions (mask True =
    may attend) -> (context (batch, d_key), weights (batch, src_len)). ``projected_keys``: W_k k_j
    already computed by the caller, (batch, src_len, d_attn), or None."""
    projected_keys = keys @ W_k.T if projected_keys is None else projected_keys
    scores = torch.tanh((query @ W_q.T)[:, None, :] + projected_keys) @ v
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return (weights[:, :, None] * keys).sum(1), weights


def gru_step(x, h, W_ih, W_hh, b_ih, b_hh):
    """One step of torch's GRU (gates r, z, n in that order), for numpy arrays or torch tensors."""
    exp, tanh = (torch.exp, torch.tanh) if isinstance(x, torch.Tensor) else (np.exp, np.tanh)
    H = h.shape[-1]
    gi, gh = x @ W_ih.T + b_ih, h @ W_hh.T + b_hh
    r = 1 / (1 + exp(-(gi[:, :H] + gh[:, :H])))
    z = 1 / (1 + exp(-(gi[:, H:2 * H] + gh[:, H:2 * H])))
    n = tanh(gi[:, 2 * H:] + r * gh[:, 2 * H:])
    return (1 - z) * n + z * h


class Seq2SeqGRU(nn.Module):
    """A GRU encoder; a GRU-cell decoder that starts from the encoder state at each sentence's last
    real token and, with attention, reads cat([embedding, context]) and predicts from cat([s_t, c_t])."""

    def __init__(self, src_vocab, tgt_vocab, d_emb, d_hidden, attention=True, pad_id=0):
        super().__init__()
        self.attention, self.pad_id = attention, pad_id
        self.src_embed = nn.Embedding(src_vocab, d_emb, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_emb, padding_idx=pad_id)
        self.encoder = nn.GRU(d_emb, d_hidden, batch_first=True)
        self.decoder = nn.GRUCell(d_emb + (d_hidden if attention else 0), d_hidden)
        if attention:
            self.attn_W_q = nn.Linear(d_hidden, d_hidden, bias=False)
            self.attn_W_k = nn.Linear(d_hidden, d_hidden, bias=False)
            self.attn_v = nn.Linear(d_hidden, 1, bias=False)
        self.out = nn.Linear(2 * d_hidden if attention else d_hidden, tgt_vocab)

    def attend(self, s, H, mask):
        return additive_attention(s, H, self.attn_W_q.weight, self.attn_W_k.weight, self.attn_v.weight[0], mask)

    def step(self, x, s):
        d = self.decoder
        return gru_step(x, s, d.weight_ih, d.weight_hh, d.bias_ih, d.bias_hh)

    def forward(self, src, tgt_in):
        mask = src != self.pad_id
        H, _ = self.encoder(self.src_embed(src))
        s = H[torch.arange(len(src)), mask.sum(1) - 1]
        logits, maps = [], []
        for t in range(tgt_in.shape[1]):
            e = self.tgt_embed(tgt_in[:, t])
            if self.attention:
                c, w = self.attend(s, H, mask)
                s = self.step(torch.cat([e, c], -1), s)
                logits.append(self.out(torch.cat([s, c], -1)))
                maps.append(w)
            else:
                s = self.step(e, s)
                logits.append(self.out(s))
        if self.attention:
            self.attention_weights = torch.stack(maps, 1)
        return torch.stack(logits, 1)


def _exact(prediction, reference, eos_id) -> bool:
    """Right when the tokens up to and including the first EOS are the reference's (EOS required)."""
    p, r = list(prediction), list(reference)
    r = r[:r.index(eos_id)] if eos_id in r else r
    return eos_id in p and p[:p.index(eos_id)] == r


def accuracy_by_length(predictions, targets, lengths, bins, eos_id):
    """(accuracy (B,), counts (B,)): exact match per half-open bin bins[b] <= length < bins[b + 1];
    NaN and 0 for a bin without sentences."""
    correct = np.array([_exact(p, r, eos_id) for p, r in zip(predictions, targets)], dtype=np.float64)
    lengths = np.asarray(lengths)
    accuracy, counts = [], []
    for lo, hi in zip(bins[:-1], bins[1:]):
        inside = (lengths >= lo) & (lengths < hi)
        counts.append(int(inside.sum()))
        accuracy.append(correct[inside].mean() if inside.any() else np.nan)
    return np.array(accuracy), np.array(counts, dtype=np.int64)
