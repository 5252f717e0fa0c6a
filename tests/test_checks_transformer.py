"""Mistake and variant cases of notebook 09's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must score
full marks (exercise-standard.md, item 6). The model, greedy decoding and the training step
go through the drivers of coursekit/drivers/transformer.py, as they do while grading.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tests.check_cases import shared_tests
from tests.conftest import solution_namespace

# The variants call float(loss) on a tensor that requires grad, and one mistake steps the
# scheduler first: torch warns about both, as it should.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

NS = solution_namespace("09_transformer")
EncoderLayer, DecoderLayer = NS["EncoderLayer"], NS["DecoderLayer"]
sinusoidal_encoding, causal_mask = NS["sinusoidal_encoding"], NS["causal_mask"]


@pytest.fixture(scope="module")
def transformer_notebook() -> dict:
    """The reference solutions of notebook 09 (Transformer, label_smoothed_loss, ...)."""
    return NS


def stub(*args, **kwargs):
    raise NotImplementedError()


class StubTransformer(nn.Module):
    """The release notebook's Transformer: every method body raises NotImplementedError."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        raise NotImplementedError()


# ---------------------------------------------------------------- Transformer

def make_transformer(scale="sqrt", pe=True, causal=0, memory_mask=True, swap=False, functional_dropout=False,
                     shared=False, softmax=False, tgt_padding=False, wiring="final", name="Transformer"):
    """A Transformer class with one of the known mistakes switched on (defaults: right)."""

    class Model(nn.Module):
        def __init__(self, src_vocab, tgt_vocab, d_model, heads, d_ff, layers, max_len, pad_id, dropout=0.0):
            super().__init__()
            self.d_model, self.pad_id, self.p = d_model, pad_id, dropout
            self.src_embed = nn.Embedding(src_vocab, d_model)
            self.tgt_embed = nn.Embedding(tgt_vocab, d_model)
            self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)
            self.dropout = nn.Dropout(dropout)
            if shared:
                self.encoder_layers = nn.ModuleList([EncoderLayer(d_model, heads, d_ff, dropout)] * layers)
            else:
                self.encoder_layers = nn.ModuleList([EncoderLayer(d_model, heads, d_ff, dropout) for _ in range(layers)])
            self.decoder_layers = nn.ModuleList([DecoderLayer(d_model, heads, d_ff, dropout) for _ in range(layers)])
            self.generator = nn.Linear(d_model, tgt_vocab)

        def _embed(self, table, ids):
            factor = {"sqrt": math.sqrt(self.d_model), "none": 1.0, "d_model": self.d_model}[scale]
            x = table(ids) * factor + (self.pe[: ids.shape[1]] if pe else 0)
            return F.dropout(x, self.p) if functional_dropout else self.dropout(x)

        def encode(self, src, src_mask):
            x = embedded = self._embed(self.tgt_embed if swap else self.src_embed, src)
            outputs = []
            for layer in self.encoder_layers:
                out = layer(embedded if wiring == "unchained" else x, src_mask)
                x = x if wiring == "unassigned" else out
                outputs.append(x)
            return outputs if wiring == "per_layer" else x

        def decode(self, memory, src_mask, tgt_in):  # (memory: a list of one per layer, as the mistake has it)
            y = self._embed(self.src_embed if swap else self.tgt_embed, tgt_in)
            T = tgt_in.shape[1]
            mask = torch.tril(torch.ones(T, T, dtype=torch.bool), diagonal=causal) if causal is not None else None
            if tgt_padding:  # valid too: (batch, T, T), causal AND the key is not padding
                mask = mask[None] & (tgt_in != self.pad_id)[:, None, :]
            for i, layer in enumerate(self.decoder_layers):
                m = memory[i] if isinstance(memory, list) else memory
                out = layer(y, m, tgt_mask=mask, memory_padding_mask=src_mask if memory_mask else None)
                y = y if wiring == "unassigned" else out
            logits = self.generator(y)
            return logits.softmax(-1) if softmax else logits

        def forward(self, src, tgt_in):
            src_mask = src != self.pad_id
            return self.decode(self.encode(src, src_mask), src_mask, tgt_in)

    Model.__name__ = name
    return Model


class TorchLayersTransformer(nn.Module):
    """Valid: torch.nn.TransformerEncoderLayer / DecoderLayer as the layers (the same parameter
    names), torch's masks (True = ignore), a target padding mask too, PE computed in forward."""

    def __init__(self, src_vocab, tgt_vocab, d_model, heads, d_ff, layers, max_len, pad_id, dropout=0.0):
        super().__init__()
        self.d_model, self.pad_id = d_model, pad_id
        self.src_embed = nn.Embedding(src_vocab, d_model, padding_idx=pad_id)
        self.tgt_embed = nn.Embedding(tgt_vocab, d_model, padding_idx=pad_id)
        self.encoder_layers = nn.ModuleList([nn.TransformerEncoderLayer(d_model, heads, d_ff, dropout, batch_first=True)
                                             for _ in range(layers)])
        self.decoder_layers = nn.ModuleList([nn.TransformerDecoderLayer(d_model, heads, d_ff, dropout, batch_first=True)
                                             for _ in range(layers)])
        self.generator = nn.Linear(d_model, tgt_vocab)
        self.drop = nn.Dropout(dropout)

    def encode(self, src, src_mask):
        x = self.drop(self.src_embed(src) * self.d_model ** 0.5 + sinusoidal_encoding(src.shape[1], self.d_model))
        for layer in self.encoder_layers:
            x = layer(x, src_key_padding_mask=~src_mask)
        return x

    def decode(self, memory, src_mask, tgt_in):
        T = tgt_in.shape[1]
        y = self.drop(self.tgt_embed(tgt_in) * self.d_model ** 0.5 + sinusoidal_encoding(T, self.d_model))
        future = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        for layer in self.decoder_layers:
            y = layer(y, memory, tgt_mask=future, memory_key_padding_mask=~src_mask)
        return self.generator(y)

    def forward(self, src, tgt_in):
        src_mask = src != self.pad_id
        return self.decode(self.encode(src, src_mask), src_mask, tgt_in)


class FloatMaskTransformer(make_transformer(name="Transformer")):
    """Valid: the PE table a plain attribute rebuilt per call, functional dropout that respects
    self.training, and float64 arithmetic for the embedding sum cast back to float32."""

    def _embed(self, table, ids):
        pe = sinusoidal_encoding(ids.shape[1], self.d_model).double()
        x = (table(ids).double() * math.sqrt(self.d_model) + pe).float()
        return F.dropout(x, self.p, training=self.training)


# ---------------------------------------------------------------- label_smoothed_loss

def ls_onehot(logits, target, pad_id, smoothing):
    """Valid: one-hot construction in float64."""
    V = logits.shape[-1]
    logp = torch.log_softmax(logits.double(), -1).reshape(-1, V)
    t = target.reshape(-1)
    q = F.one_hot(t, V).double() * (1 - smoothing) + smoothing / (V - 1)
    q[:, pad_id] = 0
    keep = t != pad_id
    return (-(q * logp).sum(-1) * keep).sum() / keep.sum()


def ls_decomposed(logits, target, pad_id, smoothing):
    """Valid: (1 - eps) * NLL + eps * mean over the non-pad classes of -log p."""
    V = logits.shape[-1]
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    t = target.reshape(-1)
    keep = t != pad_id
    logp, t = logp[keep], t[keep]
    nll = -logp.gather(1, t[:, None]).squeeze(1)
    others = torch.cat([logp[:, :pad_id], logp[:, pad_id + 1:]], 1)
    return ((1 - smoothing) * nll - smoothing * others.mean(1)).mean()


def ls_soft_targets(logits, target, pad_id, smoothing):
    """Valid: torch's cross-entropy with class-probability targets."""
    V = logits.shape[-1]
    z, t = logits.reshape(-1, V), target.reshape(-1)
    keep = t != pad_id
    q = torch.full((int(keep.sum()), V), smoothing / (V - 1), dtype=z.dtype)
    q[:, pad_id] = 0
    q[torch.arange(len(q)), t[keep]] += 1 - smoothing
    return F.cross_entropy(z[keep], q)


def ls_torch_smoothing(logits, target, pad_id, smoothing):
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), target.reshape(-1), ignore_index=pad_id, label_smoothing=smoothing)


def _ls(logits, target, pad_id, smoothing, keep_pads=False, reduce="mean", over=None, log=True):
    V = logits.shape[-1]
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V) if log else logits.reshape(-1, V)
    t = target.reshape(-1)
    q = torch.full_like(logp, smoothing / (over or (V - 1)))
    q[:, pad_id] = 0
    q[torch.arange(len(t)), t] += 1 - smoothing
    per = -(q * logp).sum(-1)
    per = per if keep_pads else per[t != pad_id]
    return per.sum() if reduce == "sum" else per.mean()


def _smoothed_terms(logits, target, pad_id, smoothing, others=1):
    """q * log p per token and class, flattened, with the non-padding tokens' mask: eps spread over
    V - ``others`` classes, the true class's mass set (as scatter_ does) to 1 - eps plus its share
    (others=1, the stated convention) or to 1 - eps alone (others=2, the Annotated Transformer's)."""
    V = logits.shape[-1]
    logp = F.log_softmax(logits, dim=-1).reshape(-1, V)
    t = target.reshape(-1)
    q = torch.full_like(logp, smoothing / (V - others))
    q[:, pad_id] = 0
    q[torch.arange(len(t)), t] = 1 - smoothing + (smoothing / (V - 1) if others == 1 else 0)
    return q * logp, t != pad_id


def ls_keeps_pads(logits, target, pad_id, smoothing):
    return _ls(logits, target, pad_id, smoothing, keep_pads=True)


def ls_keeps_pads_scatter(logits, target, pad_id, smoothing):
    """The reference's construction (the true class's mass set, as scatter_ does), averaged over every
    position (pad targets too)."""
    return -_smoothed_terms(logits, target, pad_id, smoothing)[0].sum(-1).mean()


def ls_sum(logits, target, pad_id, smoothing):
    return _ls(logits, target, pad_id, smoothing, reduce="sum")


def ls_over_V(logits, target, pad_id, smoothing):
    return _ls(logits, target, pad_id, smoothing, over=logits.shape[-1])


def ls_no_log_softmax(logits, target, pad_id, smoothing):
    return _ls(logits, target, pad_id, smoothing, log=False)


def ls_sentence_mean(logits, target, pad_id, smoothing):
    """The mean of each sentence's mean: sentences with fewer real tokens weigh more."""
    V = logits.shape[-1]
    logp = F.log_softmax(logits, dim=-1).reshape(*target.shape, V)
    q = torch.full_like(logp, smoothing / (V - 1))
    q[..., pad_id] = 0
    q.scatter_(-1, target[..., None], 1 - smoothing + smoothing / (V - 1))
    per = -(q * logp).sum(-1)
    real = (target != pad_id).float()
    return ((per * real).sum(-1) / real.sum(-1)).mean()


def ls_divides_by_positions(logits, target, pad_id, smoothing):
    """Padding zeroed, but the sum divided by every position (padding counted)."""
    V = logits.shape[-1]
    t = target.reshape(-1)
    q = torch.full((len(t), V), smoothing / (V - 1))
    q[:, pad_id] = 0
    q.scatter_(1, t[:, None], 1 - smoothing + smoothing / (V - 1))
    per = -(q * F.log_softmax(logits.reshape(-1, V), -1)).sum(-1) * (t != pad_id)
    return per.sum() / per.numel()


def ls_implicit_dim(logits, target, pad_id, smoothing):
    """F.log_softmax without dim (torch warns: the implicit dim is the learner's mistake)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logp = F.log_softmax(logits)
    V = logits.shape[-1]
    q = torch.full_like(logp, smoothing / (V - 1))
    q[..., pad_id] = 0
    q.scatter_(-1, target.unsqueeze(-1), 1 - smoothing + smoothing / (V - 1))
    per = -(q * logp).sum(-1)
    return per[target != pad_id].mean()


def ls_positive_sum(logits, target, pad_id, smoothing):
    """The minus sign forgotten: sum q log p is the negative of the loss."""
    terms, real = _smoothed_terms(logits, target, pad_id, smoothing)
    return terms.sum(-1)[real].mean()


def ls_mean_over_classes(logits, target, pad_id, smoothing):
    terms, real = _smoothed_terms(logits, target, pad_id, smoothing)
    return -terms.mean(-1)[real].mean()


def ls_annotated(logits, target, pad_id, smoothing):
    """The Annotated Transformer's convention: true class 1 - eps, eps over the V - 2 others."""
    terms, real = _smoothed_terms(logits, target, pad_id, smoothing, others=2)
    return -terms.sum(-1)[real].mean()


# ---------------------------------------------------------------- noam_lr

def noam_sqrt(step, d_model, warmup, factor=1.0):
    if step < 1:
        raise ValueError("step must be >= 1")
    return factor / math.sqrt(d_model) * min(1 / math.sqrt(step), step / warmup ** 1.5)


def noam_numpy(step, d_model, warmup, factor=1.0):
    if step <= 0:
        raise ValueError("step must be >= 1")
    return np.float64(factor) * np.power(d_model, -0.5) * np.minimum(np.power(step, -0.5), step * np.power(warmup, -1.5))


def _noam(step, d_model, warmup, factor=1.0, how="right"):
    if step < 1:
        raise ValueError("step must be >= 1")
    if how == "half":
        return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -0.5)
    if how == "max":
        return factor * d_model ** -0.5 * max(step ** -0.5, step * warmup ** -1.5)
    if how == "d_pos":
        return factor * d_model ** 0.5 * min(step ** -0.5, step * warmup ** -1.5)
    if how == "plus_one":
        return factor * d_model ** -0.5 * min((step + 1) ** -0.5, (step + 1) * warmup ** -1.5)
    return None


def noam_no_check(step, d_model, warmup, factor=1.0):
    return factor * d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


# ---------------------------------------------------------------- greedy_decode

def greedy_lists(model, src, bos_id, eos_id, pad_id, max_len):
    """Valid: Python lists, one sentence's tokens at a time, converted at the end."""
    src_mask = src != pad_id
    memory = model.encode(src, src_mask)
    out = [[] for _ in range(len(src))]
    for _ in range(max_len):
        ys = torch.tensor([[bos_id] + row for row in out])
        best = model.decode(memory, src_mask, ys)[:, -1, :].max(dim=-1).indices.tolist()
        for row, token in zip(out, best):
            row.append(pad_id if eos_id in row else token)
        if all(eos_id in row for row in out):
            break
    return torch.tensor(out, dtype=torch.int64)


def greedy_whole_sequence(model, src, bos_id, eos_id, pad_id, max_len):
    """Feeds back the model's argmax at every position: the whole prefix re-predicted each step."""
    src_mask = src != pad_id
    memory = model.encode(src, src_mask)
    ys = torch.full((len(src), 1), bos_id)
    finished = torch.zeros(len(src), dtype=torch.bool)
    for _ in range(max_len):
        predicted = model.decode(memory, src_mask, ys).argmax(dim=-1)  # (batch, t)
        predicted[:, -1] = predicted[:, -1].masked_fill(finished, pad_id)
        finished = finished | (predicted[:, -1] == eos_id)
        ys = torch.cat([ys[:, :1], predicted], dim=1)
        if finished.all():
            break
    return ys[:, 1:]


def greedy_until_all_have_eos(model, src, bos_id, eos_id, pad_id, max_len):
    """Stops when every sentence has an EOS, but keeps writing the model's tokens after it."""
    src_mask = src != pad_id
    memory = model.encode(src, src_mask)
    ys = torch.full((len(src), 1), bos_id)
    for _ in range(max_len):
        ys = torch.cat([ys, model.decode(memory, src_mask, ys)[:, -1].argmax(-1, keepdim=True)], dim=1)
        if (ys == eos_id).any(dim=1).all():
            break
    return ys[:, 1:]


def greedy_replace_after(model, src, bos_id, eos_id, pad_id, max_len):
    """Valid: keeps feeding its own predictions and pads after the first EOS at the end."""
    src_mask = src != pad_id
    memory = model.encode(src, src_mask)
    ys = torch.full((len(src), 1), bos_id)
    for _ in range(max_len):
        ys = torch.cat([ys, model.decode(memory, src_mask, ys)[:, -1].argmax(-1, keepdim=True)], dim=1)
        out = ys[:, 1:]
        after = (out == eos_id).long().cumsum(1) - (out == eos_id).long() > 0
        if (out == eos_id).any(1).all():
            break
    return out.masked_fill(after, pad_id)


# ---------------------------------------------------------------- train_step

def make_train_step(shift="right", zero_grad=True, scheduler="after", train_mode=True, returns="item"):
    def train_step(model, src, tgt, optimizer, scheduler_, loss_fn):
        if train_mode:
            model.train()
        if shift == "right":
            tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
        elif shift == "none":
            tgt_in, tgt_out = tgt, tgt
        else:
            tgt_in, tgt_out = tgt[:, 1:], tgt[:, :-1]
        if scheduler == "before":
            scheduler_.step()
        loss = loss_fn(model(src, tgt_in), tgt_out)
        if zero_grad:
            optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if scheduler == "after":
            scheduler_.step()
        return loss.item() if returns == "item" else float(loss.detach())

    return train_step


def train_step_zero_first(model, src, tgt, optimizer, scheduler, loss_fn):
    """Valid: zero_grad(set_to_none=False) first, narrow() for the shift, float(loss)."""
    optimizer.zero_grad(set_to_none=False)
    model.train(True)
    T = tgt.shape[1]
    loss = loss_fn(model(src, tgt.narrow(1, 0, T - 1)), tgt.narrow(1, 1, T - 1))
    loss.backward()
    optimizer.step()
    scheduler.step()
    return float(loss)


MISTAKES = {
    "transformer-Transformer": [
        (StubTransformer, "not answered yet"),
        (make_transformer(scale="none"), "not multiplied by sqrt(d_model)"),
        (make_transformer(scale="d_model"), "multiplied by d_model"),
        (make_transformer(pe=False), "there is no positional encoding"),
        (make_transformer(causal=None), "has no causal mask"),
        (make_transformer(causal=1), "one token ahead"),
        (make_transformer(causal=-1), "hides the diagonal"),
        (make_transformer(memory_mask=False), "cross-attention ignores the source padding"),
        (make_transformer(swap=True), "swapped"),
        (make_transformer(functional_dropout=True), "dropout is still on in eval mode"),
        (make_transformer(shared=True), "one tensor"),
        (make_transformer(softmax=True), "returns probabilities"),
        (make_transformer(wiring="per_layer"), "decoder layer i reads the output of encoder layer i"),
        (make_transformer(wiring="unchained"), "each encoder layer is applied to the embeddings"),
        (make_transformer(wiring="unassigned"), "the layers' outputs are not kept"),
    ],
    "transformer-label_smoothed_loss": [
        (stub, "not answered yet"),
        (ls_torch_smoothing, "smoothing mass on the padding class"),
        (ls_keeps_pads, "padding positions are not ignored"),
        (ls_keeps_pads_scatter, "padding positions are not ignored"),
        (ls_sum, "it sums over the tokens"),
        (ls_over_V, "eps / V over the non-padding classes"),
        (ls_annotated, "V - 2 other non-padding classes"),
        (ls_no_log_softmax, "uses the logits as log-probabilities"),
        (ls_sentence_mean, "it averages per sentence, then over sentences"),
        (ls_implicit_dim, "F.log_softmax without a dim picks dim=0 for a 3-D tensor"),
        (ls_positive_sum, "the minus sign is missing"),
        (ls_mean_over_classes, "it averages over the V classes"),
        (ls_divides_by_positions, "divides the sum over the non-padding tokens by the number of all positions"),
    ],
    "transformer-noam_lr": [
        (stub, "not answered yet"),
        (lambda s, d, w, f=1.0: _noam(s, d, w, f, "half"), "warmup ** -0.5"),
        (lambda s, d, w, f=1.0: _noam(s, d, w, f, "max"), "takes the max"),
        (lambda s, d, w, f=1.0: _noam(s, d, w, f, "d_pos"), "d_model ** 0.5"),
        (lambda s, d, w, f=1.0: _noam(s, d, w, f, "plus_one"), "counts steps from 0"),
        (noam_no_check, "check step < 1 first"),
    ],
    "transformer-greedy_decode": [
        (stub, "not answered yet"),
        # (the learner-style mistakes of greedy decoding are in the spec's catalogue: tests/test_catalogue.py)
        (greedy_whole_sequence, "it feeds back the argmax at every position"),
        (greedy_until_all_have_eos, "it does not stop a sentence at its EOS"),
    ],
    "transformer-train_step": [
        (stub, "not answered yet"),
        (make_train_step(shift="none"), "targets are not shifted"),
        (make_train_step(shift="reversed"), "shift is reversed"),
        (make_train_step(zero_grad=False), "gradients are not reset"),
        (make_train_step(scheduler="before"), "before optimizer.step()"),
        (make_train_step(scheduler="never"), "scheduler is never stepped"),
        (make_train_step(train_mode=False), "call model.train() first"),
    ],
}

VARIANTS = {
    "transformer-Transformer": [TorchLayersTransformer, FloatMaskTransformer, make_transformer(tgt_padding=True)],
    "transformer-label_smoothed_loss": [ls_onehot, ls_decomposed, ls_soft_targets],
    "transformer-noam_lr": [noam_sqrt, noam_numpy],
    "transformer-greedy_decode": [greedy_lists, greedy_replace_after],
    "transformer-train_step": [train_step_zero_first, make_train_step(returns="float")],
}

globals().update(shared_tests("transformer", MISTAKES, VARIANTS, solutions="transformer_notebook", seeds=6))


def test_driver_reports_a_missing_name():
    """A model without `generator` gets a one-line diagnosis naming what to create."""
    from grader.checks import CheckFailed, check

    class NoGenerator(make_transformer()):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.out = self.generator
            del self.generator

        def decode(self, memory, src_mask, tgt_in):
            return self.out(torch.zeros(len(tgt_in), tgt_in.shape[1], self.d_model))

    with pytest.raises(CheckFailed) as failure:
        check("transformer-Transformer", NoGenerator)
    assert "self.generator = nn.Linear(d_model, tgt_vocab)" in str(failure.value)
