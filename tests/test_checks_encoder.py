"""Mistake and variant cases of notebook 07's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6). The sublayer connection, the layer and
the encoder go through the drivers of coursekit/drivers/encoder.py, as they do while
grading. The module checks build small torch modules, so the many-seeds test runs 6 seeds.
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


@pytest.fixture(scope="module")
def encoder_notebook() -> dict:
    """The reference solutions of notebook 07 (layer_norm, ..., EncoderLayer, Encoder)."""
    return solution_namespace("07_encoder")


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- layer_norm

def _ln(x, gamma, beta, eps=1e-5, *, dim=-1, unbiased=False, eps_outside=False, affine="right", sqrt=True,
        fixed_eps=False):
    eps = 1e-5 if fixed_eps else eps
    mean = x.mean(dim=dim, keepdim=True)
    var = x.var(dim=dim, keepdim=True, unbiased=unbiased)
    if eps_outside:
        x_hat = (x - mean) / (var.sqrt() + eps)
    else:
        x_hat = (x - mean) / (torch.sqrt(var + eps) if sqrt else var + eps)
    return {"right": x_hat * gamma + beta, "swapped": x_hat * beta + gamma, "no_gamma": x_hat + beta,
            "no_beta": x_hat * gamma}[affine]


def _ln_float32_var(x, gamma, beta, eps=1e-5):
    x, gamma, beta = x.float(), gamma.float(), beta.float()
    mu = x.mean(-1, keepdim=True)
    return (x - mu) * torch.rsqrt(x.var(-1, correction=0, keepdim=True) + eps) * gamma + beta


def _ln_functional(x, gamma, beta, eps=1e-5):
    return F.layer_norm(x, x.shape[-1:], gamma, beta, eps)


def _ln_std_squared(x, gamma, beta, eps=1e-5):
    centred = x - x.mean(dim=-1, keepdim=True)
    std = centred.pow(2).mean(-1, keepdim=True).add(eps).sqrt()
    return gamma * (centred / std) + beta


def _ln_no_keepdim(x, gamma, beta, eps=1e-5):
    mu, var = x.mean(dim=-1), ((x - x.mean(dim=-1, keepdim=True)) ** 2).mean(dim=-1)
    return gamma * (x - mu) / (var + eps).sqrt() + beta


def _ln_global(x, gamma, beta, eps=1e-5):
    return (x - x.mean()) / torch.sqrt(x.var(unbiased=False) + eps) * gamma + beta


def _ln_uncentred(x, gamma, beta, eps=1e-5):
    return gamma * x / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + eps) + beta


def _ln_no_eps(x, gamma, beta, eps=1e-5):
    centred = x - x.mean(-1, keepdim=True)
    return gamma * centred / centred.pow(2).mean(-1, keepdim=True).sqrt() + beta


def _ln_numpy(x, gamma, beta, eps=1e-5):
    x = np.asarray(x)
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps) * np.asarray(gamma) \
        + np.asarray(beta)


# ---------------------------------------------------------------- feed_forward

def _ffn(x, W1, b1, W2, b2, *, relu="hidden", bias1=True, bias2=True, transposed=False):
    h = (x @ W1 if transposed else x @ W1.T) + (b1 if bias1 else 0)
    if relu in ("hidden", "both"):
        h = torch.relu(h)
    out = h @ W2.T + (b2 if bias2 else 0)
    return torch.relu(out) if relu in ("output", "both") else out


def _ffn_functional(x, W1, b1, W2, b2):
    return F.linear(F.relu(F.linear(x, W1, b1)), W2, b2)


def _ffn_einsum_float32(x, W1, b1, W2, b2):
    x, W1, b1, W2, b2 = (t.float() for t in (x, W1, b1, W2, b2))
    hidden = torch.einsum("...d,fd->...f", x, W1).add(b1).clamp(min=0)
    return torch.einsum("...f,df->...d", hidden, W2) + b2


def _ffn_modules(x, W1, b1, W2, b2):
    first, second = nn.Linear(W1.shape[1], W1.shape[0]).to(x.dtype), nn.Linear(W2.shape[1], W2.shape[0]).to(x.dtype)
    with torch.no_grad():
        first.weight.copy_(W1), first.bias.copy_(b1), second.weight.copy_(W2), second.bias.copy_(b2)
        return nn.Sequential(first, nn.ReLU(), second)(x)


# ---------------------------------------------------------------- sublayer_connection

def _connection(kind="right", default=False):
    def connect(x, sublayer, norm, norm_first=default):
        pre = norm_first
        if kind == "swapped":
            pre = not norm_first
        if kind == "no_norm":
            return x + sublayer(x)
        if kind == "alone":
            return sublayer(x)
        if kind == "identity":
            return x
        if pre:
            if kind == "normed":
                x = norm(x)
                return x + sublayer(x)
            if kind == "no_residual":
                return sublayer(norm(x))
            return x + sublayer(norm(x))
        if kind == "outside":
            return x + norm(sublayer(x))
        if kind == "no_residual":
            return norm(sublayer(x))
        return norm(x + sublayer(x))
    return connect


def _connection_no_default(x, sublayer, norm, norm_first):
    return x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))


def _connection_residual_variable(x, sublayer, norm, norm_first=False):
    residual = x
    if norm_first:
        x = norm(x)
    x = residual + sublayer(x)
    if not norm_first:
        x = norm(x)
    return x


def _connection_float64(x, sublayer, norm, norm_first=False):
    if not norm_first:
        return norm((x.double() + sublayer(x).double()).float()).double()
    return x.double() + sublayer(norm(x)).double()


# ---------------------------------------------------------------- EncoderLayer

def make_layer(*, order="right", mask="right", dropout_mode="module", relu=True, norms="right", take_output=True,
               names="right", residual="right", extra=False, signature=True):
    """A learner-style encoder layer with knobs for the mistakes learners make."""

    class Layer(nn.Module):
        def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
            super().__init__()
            attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
            if names == "right":
                self.self_attn = attn
            else:
                self.attn = attn
            self.linear1 = nn.Linear(d_model, d_ff)
            self.linear2 = nn.Linear(d_ff, d_model)
            self.norm1 = nn.LayerNorm(d_model)
            self.norm2 = nn.LayerNorm(d_model)
            if extra:
                self.W_o = nn.Linear(d_model, d_model)
            self.dropout = nn.Dropout(dropout)
            self.p = dropout
            self.norm_first = norm_first if order == "right" else not norm_first

        def drop(self, t):
            if dropout_mode == "functional_always":
                return F.dropout(t, self.p)
            return self.dropout(t)

        def forward(self, x, padding_mask=None):
            ignore = None
            if padding_mask is not None and mask != "ignored":
                ignore = padding_mask if mask == "inverted" else ~padding_mask
            attn = self.self_attn if names == "right" else self.attn

            def attend(t):
                out = attn(t, t, t, key_padding_mask=ignore)
                return self.drop(out[0] if take_output else out)

            def ffn(t):
                h = self.linear1(t)
                if relu is None:  # a feed_forward helper that forgot its return
                    return self.drop(None)
                return self.drop(self.linear2(torch.relu(h) if relu else h))

            first, second = (self.norm1, self.norm2) if norms == "right" else (self.norm2, self.norm1)
            for sub, norm in [(attend, first), (ffn, second)]:
                if residual == "normed" and self.norm_first:
                    x = norm(x)
                    x = x + sub(x)
                elif residual == "none":
                    x = sub(norm(x)) if self.norm_first else norm(sub(x))
                elif self.norm_first:
                    x = x + sub(norm(x))
                else:
                    x = norm(x + sub(x))
            return x

    if not signature:
        class OldLayer(Layer):
            def __init__(self, d_model, heads, d_ff, dropout=0.0):
                super().__init__(d_model, heads, d_ff, dropout)
        return OldLayer
    return Layer


class TorchLayer(nn.TransformerEncoderLayer):
    """Valid: PyTorch's own layer, adapted to the course's signature and mask convention."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, heads, d_ff, dropout, batch_first=True, norm_first=norm_first)

    def forward(self, x, padding_mask=None):
        return super().forward(x, src_key_padding_mask=None if padding_mask is None else ~padding_mask)


class ExplicitLayer(nn.Module):
    """Valid: written out without helpers, float -inf key mask, F.dropout with training=self.training,
    the FFN through layer_norm-free functional calls, float64 inside the FFN."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.rate, self.norm_first = dropout, norm_first

    def _sa(self, t, padding_mask):
        float_mask = None
        if padding_mask is not None:
            float_mask = torch.zeros(padding_mask.shape).masked_fill(~padding_mask, float("-inf"))
        out, _ = self.self_attn(t, t, t, key_padding_mask=float_mask, need_weights=False)
        return F.dropout(out, self.rate, training=self.training)

    def _ff(self, t):
        h = F.relu(F.linear(t.double(), self.linear1.weight.double(), self.linear1.bias.double()))
        out = F.linear(h, self.linear2.weight.double(), self.linear2.bias.double()).float()
        return F.dropout(out, self.rate, training=self.training)

    def forward(self, x, padding_mask=None):
        if self.norm_first:
            x = x + self._sa(self.norm1(x), padding_mask)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._sa(x, padding_mask))
        return self.norm2(x + self._ff(x))


def make_unrolled(wire: str):
    """A learner's written-out layer (ExplicitLayer's sublayers) with one wire crossed: a norm used
    for both sublayers, the FFN's residual or input taken from the layer's input, or a norm on
    both sides of each sublayer."""

    class Unrolled(ExplicitLayer):
        def forward(self, x, padding_mask=None):
            n1, n2 = (self.norm1, self.norm1) if wire == "norm1_twice" else (self.norm1, self.norm2)
            if wire == "sandwich":
                h = n1(x + self._sa(n1(x), padding_mask))
                return n2(h + self._ff(n2(h)))
            if self.norm_first:
                h = x + self._sa(n1(x), padding_mask)
                if wire == "residual_from_x":
                    return x + self._ff(n2(h))
                if wire == "ffn_on_x":
                    return h + self._ff(n2(x))
                return h + self._ff(n2(h))
            h = n1(x + self._sa(x, padding_mask))
            if wire == "residual_from_x":
                return n2(x + self._ff(h))
            if wire == "ffn_on_x":
                return n2(h + self._ff(x))
            return n2(h + self._ff(h))

    return Unrolled


class SequenceFirstLayer(ExplicitLayer):
    """A learner who leaves nn.MultiheadAttention's default layout, (seq_len, batch, d_model)."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, heads, d_ff, dropout, norm_first)
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout)


class SharedNorm(ExplicitLayer):
    """A learner who builds one LayerNorm and uses it twice (norm2 is built but never used)."""

    def forward(self, x, padding_mask=None):
        norm = self.norm2
        if self.norm_first:
            x = x + self._sa(norm(x), padding_mask)
            return x + self._ff(norm(x))
        x = norm(x + self._sa(x, padding_mask))
        return norm(x + self._ff(x))


class NotAModule:
    def __init__(self, *args, **kwargs):
        pass


# ---------------------------------------------------------------- Encoder

def _table(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    i = torch.arange(d_model) // 2
    angles = pos / 10000 ** (2 * i / d_model)
    return torch.where(torch.arange(d_model) % 2 == 0, angles.sin(), angles.cos()).float()


def make_encoder(*, scale="sqrt", pe="right", mask="right", layers_mode="right", buffer="nonpersistent",
                 layer=TorchLayer):
    class Enc(nn.Module):
        def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len, pad_id=0, dropout=0.0):
            super().__init__()
            self.d_model, self.pad_id = d_model, pad_id
            self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
            if buffer == "persistent":
                self.register_buffer("pe", _table(max_len + 1, d_model))
            elif buffer == "nonpersistent":
                self.register_buffer("pe", _table(max_len + 1, d_model), persistent=False)
            else:
                self.pe = None
            if layers_mode == "shared":
                one = layer(d_model, heads, d_ff, dropout)
                self.layers = nn.ModuleList([one] * layers)
            else:
                self.layers = nn.ModuleList([layer(d_model, heads, d_ff, dropout) for _ in range(layers)])
            self.dropout = nn.Dropout(dropout)

        def forward(self, src):
            n = src.shape[1]
            table = self.pe if self.pe is not None else _table(n + 1, self.d_model)
            factor = {"sqrt": math.sqrt(self.d_model), "none": 1.0, "d_model": self.d_model,
                      "pow": self.d_model ** 0.5}[scale]
            x = self.embed(src) * factor
            if pe == "right":
                x = x + table[:n]
            elif pe == "twice":
                x = x + table[:n] + table[:n]
            elif pe == "shifted":
                x = x + table[1:n + 1]
            elif pe == "scaled":
                x = (self.embed(src) + table[:n]) * math.sqrt(self.d_model)
            keep = src != self.pad_id
            if mask == "inverted":
                keep = src == self.pad_id
            x = self.dropout(x)
            for i in range(len(self.layers)):
                chosen = self.layers[0] if layers_mode == "first" else self.layers[i]
                out = chosen(x) if mask == "ignored" else chosen(x, keep)
                x = x if layers_mode == "unassigned" else out
            return x

    return Enc


MISTAKES = {
    "encoder-layer_norm": [
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, unbiased=True), "unbiased standard deviation"),
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, eps_outside=True), "eps is added outside the square root"),
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, sqrt=False), "divides by the variance, not by its square root"),
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, dim=1), "normalizes over the sequence axis"),
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, dim=0), "normalizes over the batch axis"),
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, affine="swapped"), "gamma and beta are swapped"),
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, affine="no_gamma"), "gamma is missing"),
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, affine="no_beta"), "beta is missing"),
        (lambda x, g, b, eps=1e-5: _ln(x, g, b, eps, fixed_eps=True), "it ignores the eps argument"),
        (lambda x, g, b: _ln(x, g, b), "the signature is layer_norm(x, gamma, beta, eps=1e-5)"),
        (_ln_numpy, "returns a numpy array for torch tensor inputs"),
        (_ln_no_keepdim, "the mean and the variance lose their last axis"),
        (_ln_global, "it takes the mean and the variance of the whole tensor"),
        (_ln_uncentred, "the mean is not subtracted"),
        (_ln_no_eps, "eps is missing: it divides by sqrt(var)"),
        (stub, "not answered yet"),
    ],
    "encoder-feed_forward": [
        (lambda *a: _ffn(*a, relu="none"), "the ReLU is missing"),
        (lambda *a: _ffn(*a, relu="output"), "the ReLU is applied after the second layer instead"),
        (lambda *a: _ffn(*a, relu="both"), "the ReLU is applied after the second layer too"),
        (lambda *a: _ffn(*a, transposed=True), "W1 is (d_ff, d_model), so the first layer is x @ W1.T"),
        (lambda *a: _ffn(*a, bias1=False), "the bias b1 of the first layer is missing"),
        (lambda *a: _ffn(*a, bias2=False), "the bias b2 of the second layer is missing"),
        (lambda *a: _ffn(*a, bias1=False, bias2=False), "both biases are missing"),
        (stub, "not answered yet"),
    ],
    "encoder-sublayer_connection": [
        (_connection("swapped"), "are the two branches swapped?"),
        (_connection("normed"), "the residual is added to the normalized input, norm(x) + sublayer(norm(x))"),
        (_connection("no_residual"), "there is no residual"),
        (_connection("outside"), "x + norm(sublayer(x)); post-norm normalizes the sum"),
        (_connection("no_norm"), "the norm is skipped"),
        (_connection("alone"), "it returns sublayer(x) alone"),
        (_connection("identity"), "the sublayer is never applied"),
        (lambda x, sublayer, norm, norm_first=False: norm(x + sublayer(norm(x))),
         "each sublayer is normalized twice, before the sublayer and after the residual"),
        (_connection(default=True), "norm_first defaults to False"),
        (_connection_no_default, "norm_first has a default, False"),
        (stub, "not answered yet"),
    ],
    "encoder-EncoderLayer": [
        (make_layer(order="swapped"), "it computes the pre-norm arrangement; with norm_first=False"),
        (make_layer(mask="inverted"), "the padding mask is inverted"),
        (make_layer(mask="ignored"), "the padding mask is ignored"),
        (make_layer(dropout_mode="functional_always"), "dropout is still on after .eval()"),
        (make_layer(relu=False), "the ReLU of the feed-forward sublayer is missing"),
        (make_layer(norms="swapped"), "norm1 and norm2 are swapped"),
        (make_layer(residual="normed"), "the residual is added to the normalized input"),
        (make_layer(residual="none"), "there is no residual connection around the sublayers"),
        (make_unrolled("norm1_twice"), "norm1 is used for the self-attention sublayer and the feed-forward "
                                       "sublayer (norm2 never)"),
        (SharedNorm, "norm2 is used for the self-attention sublayer and the feed-forward sublayer (norm1 never)"),
        (SequenceFirstLayer, "the self-attention reads x as (seq_len, batch, d_model)"),
        (make_unrolled("residual_from_x"), "the feed-forward sublayer's residual adds back the layer's input x"),
        (make_unrolled("ffn_on_x"), "the feed-forward sublayer is given the layer's input x"),
        (make_unrolled("sandwich"), "each sublayer is normalized twice, before the sublayer and after the residual"),
        (make_layer(take_output=False), "take the output, self.self_attn(x, x, x, ...)[0]"),
        (make_layer(relu=None), "miss a `return`? Fix that one first"),
        (make_layer(names="attn"), "has no parameter self_attn.in_proj_weight: create it in __init__ as "
                                   "self.self_attn = nn.MultiheadAttention"),
        (make_layer(extra=True), "has parameters that torch's layer does not have: W_o.weight"),
        (make_layer(signature=False), "keep the constructor's signature"),
        (NotAModule, "is not a torch.nn.Module"),
        (stub, "it should be a class"),
        (type("Stub", (nn.Module,), {"__init__": lambda self, *a, **k: stub()}), "not answered yet"),
    ],
    "encoder-Encoder": [
        (make_encoder(scale="none"), "the embeddings are not scaled"),
        (make_encoder(scale="d_model"), "the embeddings are multiplied by d_model"),
        (make_encoder(pe="none"), "the positional encoding is missing"),
        (make_encoder(pe="twice"), "the positional encoding is added twice"),
        (make_encoder(pe="shifted"), "the positional encodings start at position 1"),
        (make_encoder(pe="scaled"), "the positional encoding is scaled by sqrt(d_model) too"),
        (make_encoder(mask="ignored"), "the padding mask is ignored"),
        (make_encoder(mask="inverted"), "the padding mask is inverted"),
        (make_encoder(layers_mode="shared"), "some layers share their parameters"),
        (make_encoder(layers_mode="first"), "the first layer is applied every time"),
        (make_encoder(layers_mode="unassigned"), "the layers' outputs are not kept"),
        (make_encoder(layer=make_layer(dropout_mode="functional_always")), "dropout is still on after .eval()"),
        (make_encoder(layer=make_layer(names="attn")), "has no parameter layers.0.self_attn.in_proj_weight"),
        (stub, "it should be a class"),
    ],
}

VARIANTS = {
    "encoder-layer_norm": [lambda x, g, b, eps=1e-5: _ln(x, g, b, eps), _ln_float32_var, _ln_functional,
                           _ln_std_squared],
    "encoder-feed_forward": [_ffn, _ffn_functional, _ffn_einsum_float32, _ffn_modules],
    "encoder-sublayer_connection": [_connection(), _connection_residual_variable, _connection_float64],
    "encoder-EncoderLayer": [make_layer(), TorchLayer, ExplicitLayer, make_unrolled("right")],
    "encoder-Encoder": [make_encoder(), make_encoder(buffer="persistent", scale="pow"),
                        make_encoder(buffer="none", layer=ExplicitLayer),
                        make_encoder(layer=make_layer())],
}


globals().update(shared_tests("encoder", MISTAKES, VARIANTS, solutions="encoder_notebook", seeds=6))


def test_reference_layer_matches_torch(encoder_notebook):
    """The notebook's claim: loaded with torch's weights, the reference layer matches
    torch.nn.TransformerEncoderLayer, post-norm and pre-norm, with and without padding."""
    ns = encoder_notebook
    torch.manual_seed(3)
    x = torch.randn(3, 6, 12)
    keep = torch.arange(6) < torch.tensor([[6], [2], [4]])
    for norm_first in (False, True):
        theirs = nn.TransformerEncoderLayer(12, 3, 20, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
        mine = ns["EncoderLayer"](12, 3, 20, norm_first=norm_first).eval()
        mine.load_state_dict(theirs.state_dict())
        with torch.no_grad():
            torch.testing.assert_close(mine(x), theirs(x), rtol=0, atol=1e-5)
            torch.testing.assert_close(mine(x, keep), theirs(x, src_key_padding_mask=~keep), rtol=0, atol=1e-5)
