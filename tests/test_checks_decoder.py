"""Mistake and variant cases of notebook 08's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6). The layer, the stack and the causality
experiment go through the drivers of coursekit/drivers/decoder.py, as they do while grading.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from grader.checks._core import questions
from grader.checks.decoder import _layer_params
from grader.checks.reference import decoder as reference
from tests.check_cases import shared_tests
from tests.conftest import solution_namespace

NS = solution_namespace("08_decoder")  # the reference solutions; the learner-style classes below use its helpers
torch_attn_mask, sinusoidal_encoding = NS["torch_attn_mask"], NS["sinusoidal_encoding"]


@pytest.fixture(scope="module")
def decoder_notebook() -> dict:
    return NS


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- shift_right

def _shift(t, bos):
    return torch.cat([torch.full((t.shape[0], 1), bos, dtype=t.dtype), t[:, :-1]], dim=1)


def _shift_new_full(target, bos_id):
    out = target.new_full(target.shape, bos_id)
    out[:, 1:] = target[:, :-1]
    return out


def _shift_roll(target, bos_id):
    out = torch.roll(target, shifts=1, dims=1).clone()
    out[:, 0] = bos_id
    return out


def _shift_pad(target, bos_id):
    return F.pad(target[:, :-1], (1, 0), value=bos_id)


def _shift_flat_roll_fixed(target, bos_id):
    """torch.roll without dims rolls the flattened tensor; column 0 is then overwritten: valid."""
    out = torch.roll(target, 1)
    out[:, 0] = bos_id
    return out


def _shift_float(target, bos_id):
    return torch.cat([torch.ones(target.shape[0], 1) * bos_id, target[:, :-1]], dim=1)


def _shift_numpy(target, bos_id):
    t = np.asarray(target)
    return np.concatenate([np.full((t.shape[0], 1), bos_id), t[:, :-1]], axis=1)


# ---------------------------------------------------------------- decoder_self_mask

def _mask(tgt, pad, diagonal=0, keys=True, causal=True, query=False, upper=False, heads_axis=False):
    n = tgt.shape[1]
    ones = torch.ones(n, n, dtype=torch.bool)
    c = torch.triu(ones) if upper else torch.tril(ones, diagonal=diagonal)
    m = c[None].expand(tgt.shape[0], n, n) if causal else torch.ones(tgt.shape[0], n, n, dtype=torch.bool)
    if keys:
        m = m & ((tgt != pad)[:, :, None] if query else (tgt != pad)[:, None, :])
    return m[:, None] if heads_axis else m


def _mask_arange(tgt_in, pad_id):
    pos = torch.arange(tgt_in.shape[1])
    return (pos[None, :] <= pos[:, None]) & (tgt_in != pad_id).unsqueeze(1)


def _mask_expand_loop(tgt_in, pad_id):
    b, n = tgt_in.shape
    out = torch.zeros(b, n, n, dtype=torch.bool)
    for i in range(n):
        for j in range(i + 1):
            out[:, i, j] = tgt_in[:, j] != pad_id
    return out


def _mask_float_tril(tgt_in, pad_id):
    n = tgt_in.shape[1]
    causal = torch.ones(n, n).tril().bool()
    return causal.unsqueeze(0) & tgt_in.ne(pad_id).unsqueeze(-2)


# ---------------------------------------------------------------- DecoderLayer

def make_layer(*, cross="memory", order="right", residual="right", relu=True, self_mask="helper",
               memory_mask="invert", dropout="module", batch_first=True, transpose=True, returns="tensor",
               names=("self_attn", "multihead_attn"), norms=("norm1", "norm2", "norm3")):
    """A learner-style DecoderLayer with knobs for the mistakes learners make."""

    class Layer(nn.Module):
        def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
            super().__init__()
            self.heads, self.p = heads, dropout
            self.norm_first = (not norm_first) if order == "swapped" else norm_first
            for name in names:
                setattr(self, name, nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=batch_first))
            self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
            self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
            self.dropout = nn.Dropout(dropout)

        def drop(self, x):
            return F.dropout(x, self.p) if dropout == "functional" else self.dropout(x)

        def attend(self, layer, q, kv, **masks):
            flip = not batch_first and transpose       # batch_first=False is fine with the transposes
            if flip:
                q, kv = q.transpose(0, 1), kv.transpose(0, 1)
            out = layer(q, kv, kv, **masks)[0]
            return out.transpose(0, 1) if flip else out

        def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
            sa, ca = (getattr(self, n) for n in names)
            attn_mask = {"helper": torch_attn_mask(tgt_mask, self.heads), "none": None,
                         "raw": tgt_mask, "no_repeat": None if tgt_mask is None else ~tgt_mask}[self_mask]
            keys = None if memory_padding_mask is None else {
                "invert": ~memory_padding_mask, "raw": memory_padding_mask, "none": None}[memory_mask]
            blocks = [
                lambda x: self.drop(self.attend(sa, x, x, attn_mask=attn_mask)),
                lambda x: self.drop(self.attend(ca, x, memory if cross == "memory" else x,
                                                key_padding_mask=keys if cross == "memory" else None)),
                lambda x: self.drop(self.linear2(self.drop(torch.relu(self.linear1(x)) if relu else self.linear1(x)))),
            ]
            x = y
            for block, norm_name in zip(blocks, norms):
                norm = getattr(self, norm_name)
                if self.norm_first:
                    x = {"right": lambda: x + block(norm(x)), "none": lambda: block(norm(x))}[residual]()
                else:
                    x = {"right": lambda: norm(x + block(x)), "none": lambda: norm(block(x)),
                         "outside": lambda: x + norm(block(x))}[residual]()
            return (x, None) if returns == "tuple" else x

    Layer.__name__ = "DecoderLayer"
    return Layer


class FloatMaskLayer(nn.Module):
    """Valid: additive float masks (-inf) instead of bool ones, the sublayers written out."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__()
        self.heads, self.norm_first = heads, norm_first
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.multihead_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.norm3 = nn.LayerNorm(d_model)
        self.drop1, self.drop2, self.drop3 = nn.Dropout(dropout), nn.Dropout(dropout), nn.Dropout(dropout)

    def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
        attn = None
        if tgt_mask is not None:
            m = tgt_mask if tgt_mask.dim() == 2 else tgt_mask.repeat_interleave(self.heads, 0)
            attn = torch.zeros(m.shape).masked_fill(~m, float("-inf"))
        kpm = None
        if memory_padding_mask is not None:
            kpm = torch.zeros(memory_padding_mask.shape).masked_fill(~memory_padding_mask, float("-inf"))
        if self.norm_first:
            h = self.norm1(y)
            x = y + self.drop1(self.self_attn(h, h, h, attn_mask=attn)[0])
            h = self.norm2(x)
            x = x + self.drop2(self.multihead_attn(h, memory, memory, key_padding_mask=kpm)[0])
            return x + self.drop3(self.linear2(F.relu(self.linear1(self.norm3(x)))))
        x = self.norm1(y + self.drop1(self.self_attn(y, y, y, attn_mask=attn)[0]))
        x = self.norm2(x + self.drop2(self.multihead_attn(x, memory, memory, key_padding_mask=kpm)[0]))
        return self.norm3(x + self.drop3(self.linear2(F.relu(self.linear1(x)))))


def make_written(wire: str):
    """A learner's written-out layer (bool masks, FloatMaskLayer's modules) with one wire crossed:
    a norm reused, a residual or an input taken from the layer's input y, the memory normalized,
    each attention given the other's mask, a norm on both sides of each sublayer."""

    class Written(FloatMaskLayer):
        def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
            attn = None if tgt_mask is None else torch_attn_mask(tgt_mask, self.heads)
            kpm = None if memory_padding_mask is None else ~memory_padding_mask
            n1, n2, n3 = {"norm1_all": (self.norm1,) * 3, "norm2_for_ffn": (self.norm1, self.norm2, self.norm2)}.get(
                wire, (self.norm1, self.norm2, self.norm3))
            self_kw = {"attn_mask": attn, "key_padding_mask": kpm if wire == "self_gets_memory_mask" else None}
            cross_kw = {"key_padding_mask": kpm, "attn_mask": attn if wire == "cross_gets_tgt_mask" else None}

            def sa(h):
                return self.drop1(self.self_attn(h, h, h, **self_kw)[0])

            def ca(h):
                kv = n2(memory) if wire == "memory_normed" and self.norm_first else memory
                return self.drop2(self.multihead_attn(h, kv, kv, **cross_kw)[0])

            def ff(h):
                return self.drop3(self.linear2(F.relu(self.linear1(h))))

            if wire == "sandwich":
                x = n1(y + sa(n1(y)))
                x = n2(x + ca(n2(x)))
                return n3(x + ff(n3(x)))
            if self.norm_first:
                x = y + sa(n1(y))
                x = (y if wire == "residual_from_y" else x) + ca(n2(y if wire == "cross_on_y" else x))
                return (y if wire == "residual_from_y" else x) + ff(n3(x))
            x = n1(y + sa(y))
            x = n2((y if wire == "residual_from_y" else x) + ca(y if wire == "cross_on_y" else x))
            return n3((y if wire == "residual_from_y" else x) + ff(x))

    return Written


class SubclassLayer(nn.TransformerDecoderLayer):
    """Valid (if not in the spirit): PyTorch's own layer, with the course's masks converted."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False):
        super().__init__(d_model, heads, d_ff, dropout=dropout, batch_first=True, norm_first=norm_first)
        self.heads = heads

    def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
        return super().forward(y, memory, tgt_mask=torch_attn_mask(tgt_mask, self.heads),
                               memory_key_padding_mask=None if memory_padding_mask is None else ~memory_padding_mask)


class NotAModule:
    def __init__(self, *args, **kwargs):
        pass


# ---------------------------------------------------------------- Decoder

def make_decoder(*, scale="sqrt", pe="right", shared=False, mask="right", memory_mask=True, dropout="module",
                 layer=None, assigned=True):
    """A learner-style Decoder with knobs for the mistakes learners make."""

    class Dec(nn.Module):
        def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout=0.0):
            super().__init__()
            Layer = layer or NS["DecoderLayer"]
            self.d_model, self.pad_id, self.p = d_model, pad_id, dropout
            self.embed = nn.Embedding(vocab_size, d_model)
            self.pe = sinusoidal_encoding(max_len + 1, d_model)
            if shared:
                one = Layer(d_model, heads, d_ff, dropout)
                self.layers = nn.ModuleList([one] * layers)
            else:
                self.layers = nn.ModuleList([Layer(d_model, heads, d_ff, dropout) for _ in range(layers)])

        def forward(self, tgt_in, memory, memory_padding_mask=None):
            n = tgt_in.shape[1]
            e = self.embed(tgt_in)
            pos = {"right": self.pe[:n], "none": 0.0, "twice": 2 * self.pe[:n], "shifted": self.pe[1:n + 1]}[pe]
            if scale == "after":
                x = (e + pos) * math.sqrt(self.d_model)
            else:
                x = e * {"sqrt": math.sqrt(self.d_model), "none": 1.0, "d": self.d_model}[scale] + pos
            x = F.dropout(x, self.p) if dropout == "functional" else x
            m = {"right": NS["decoder_self_mask"](tgt_in, self.pad_id), "none": None,
                 "causal": NS["causal_mask"](n), "pad0": NS["decoder_self_mask"](tgt_in, 0)}[mask]
            for lay in self.layers:
                out = lay(x, memory, tgt_mask=m, memory_padding_mask=memory_padding_mask if memory_mask else None)
                x = out if assigned else x  # (a learner who never assigns a layer's output)
            return x

    Dec.__name__ = "Decoder"
    return Dec


class PlainDecoder(nn.Module):
    """Valid: the positional table computed in forward, embeddings scaled with ** 0.5, a loop over a list."""

    def __init__(self, vocab_size, d_model, heads, d_ff, layers, max_len, pad_id, dropout=0.0):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            self.layers.append(FloatMaskLayer(d_model, heads, d_ff, dropout))
        self.pad_id, self.d_model = pad_id, d_model
        self.drop = nn.Dropout(dropout)

    def forward(self, tgt_in, memory, memory_padding_mask=None):
        length = tgt_in.shape[1]
        pos = torch.arange(length, dtype=torch.float32)[:, None]
        i = torch.arange(0, self.d_model, 2, dtype=torch.float32)
        pe = torch.zeros(length, self.d_model)
        pe[:, 0::2] = torch.sin(pos / 10000 ** (i / self.d_model))
        pe[:, 1::2] = torch.cos(pos / 10000 ** (i / self.d_model))
        x = self.drop(self.embed(tgt_in) * self.d_model ** 0.5 + pe)
        mask = _mask_arange(tgt_in, self.pad_id)
        for layer in self.layers:
            x = layer(x, memory, mask, memory_padding_mask)
        return x


# ---------------------------------------------------------------- future_influence

def _influence(decoder, tgt_in, memory, position, new_token):
    changed = tgt_in.clone()
    changed[:, position] = new_token
    with torch.no_grad():
        return (decoder(changed, memory) - decoder(tgt_in, memory)).abs().amax(dim=-1)


def _influence_numpy(decoder, tgt_in, memory, position, new_token):
    changed = tgt_in.clone()
    changed[:, position] = new_token
    before, after = np.asarray(decoder(tgt_in, memory)), np.asarray(decoder(changed, memory))
    return np.abs(after - before).max(axis=-1)


def _influence_inf_norm(decoder, tgt_in, memory, position, new_token):
    changed = torch.where(torch.arange(tgt_in.shape[1]) == position, torch.tensor(new_token), tgt_in)
    return torch.linalg.vector_norm(decoder(changed, memory) - decoder(tgt_in, memory), ord=float("inf"), dim=-1)


def _influence_max_values(decoder, tgt_in, memory, position, new_token):
    other = tgt_in.detach().clone()
    other[:, position] = new_token
    return (decoder(other, memory) - decoder(tgt_in, memory)).abs().max(dim=-1).values.double()


def _influence_knobs(reduce="max", offset=0, in_place=False, in_place_late=False, assume_causal=False):
    def influence(decoder, tgt_in, memory, position, new_token):
        before = None if in_place_late else decoder(tgt_in, memory)
        changed = tgt_in if (in_place or in_place_late) else tgt_in.clone()
        changed[:, position + offset] = new_token
        after = decoder(changed, memory)
        before = decoder(tgt_in, memory) if in_place_late else before
        diff = after - before
        out = {"max": lambda: diff.abs().amax(-1), "signed": lambda: diff.amax(-1), "mean": lambda: diff.abs().mean(-1),
               "norm": lambda: diff.norm(dim=-1), "none": lambda: diff.abs(), "positions": lambda: diff.abs().amax(1)}[reduce]()
        if assume_causal:
            out[:, :position] = 0.0
        return out
    return influence


MISTAKES = {
    "decoder-shift_right": [
        (lambda target, bos_id: target, "returns the target unchanged"),
        (lambda t, b: torch.cat([t[:, 1:], torch.full((t.shape[0], 1), b)], dim=1), "it shifts left, BOS at the end"),
        (lambda t, b: torch.cat([torch.full((t.shape[0], 1), b), t[:, 1:]], dim=1), "drops the target's first token"),
        (lambda t, b: torch.roll(t, 1, dims=1), "the first column holds the target's last token, not BOS"),
        (lambda t, b: torch.roll(t, 1), "rolls the flattened array"),
        (lambda t, b: torch.cat([torch.full((t.shape[0], 1), b), t], dim=1), "prepends BOS but keeps the last column"),
        (_shift_float, "returns float ids"),
        (_shift_numpy, "returns a numpy array for a torch tensor input"),
        (lambda t, b: torch.cat([torch.full((1, t.shape[1]), b), t[:-1]], dim=0), "shifts along the batch axis"),
        (lambda t, b: _shift(t, 1), "column 0 should be bos_id"),
        (stub, "not answered yet"),
    ],
    "decoder-decoder_self_mask": [
        (lambda tgt_in, pad_id: torch.tril(torch.ones(tgt_in.shape[1], tgt_in.shape[1])).bool() & (tgt_in != pad_id),
         "the padding mask (batch, tgt_len) does not broadcast against the causal mask"),
        (lambda t, p: _mask(t, p, diagonal=-1), "the diagonal is masked"),
        (lambda t, p: _mask(t, p, diagonal=1), "one future position is visible (off by one)"),
        (lambda t, p: ~_mask(t, p), "it is inverted"),
        (lambda t, p: _mask(t, p, keys=False), "it is the causal mask only"),
        (lambda t, p: _mask(t, p, causal=False), "it is the padding mask only"),
        (lambda t, p: _mask(t, p, query=True), "hides padding queries (rows) instead of padding keys"),
        (lambda t, p: _mask(t, p, upper=True), "upper triangle"),
        (lambda t, p: _mask(t, 0), "it hides token 0 instead of pad_id"),
        (lambda t, p: _mask(t, p, heads_axis=True), "without a heads axis"),
        (stub, "not answered yet"),
    ],
    "decoder-DecoderLayer": [
        (make_written("norm1_all"), "norm1 is used for the masked self-attention sublayer, the cross-attention "
                                    "sublayer and the feed-forward sublayer (norm2 and norm3 never)"),
        (make_written("norm2_for_ffn"), "norm2 is used for the cross-attention sublayer and the feed-forward "
                                        "sublayer (norm3 never)"),
        (make_written("residual_from_y"), "the cross-attention and feed-forward sublayers add back the layer's "
                                          "input y"),
        (make_written("cross_on_y"), "the cross-attention's queries come from the layer's input y"),
        (make_written("sandwich"), "each sublayer is normalized twice"),
        (make_written("memory_normed"), "with norm_first=True it normalizes the memory too"),
        (make_written("cross_gets_tgt_mask"), "The cross-attention (multihead_attn) got a square (tgt_len, tgt_len) "
                                              "mask, the self-attention's"),
        (make_written("self_gets_memory_mask"), "The self-attention got the memory's padding mask"),

        (make_layer(cross="decoder"), "cross-attention takes its keys and values from the decoder"),
        (make_layer(order="swapped"), "it puts the layer norm"),
        (make_layer(residual="none"), "there is no residual connection"),
        (make_layer(residual="outside"), "the residual is added to the wrong tensor"),
        (make_layer(relu=False), "the feed-forward network has no ReLU"),
        (make_layer(self_mask="none"), "it ignores tgt_mask"),
        (make_layer(self_mask="raw"), "it contains NaN: a row of a mask hides every key"),
        (make_layer(self_mask="no_repeat"), "torch wants a 3-D attn_mask"),
        (make_layer(memory_mask="none"), "it ignores memory_padding_mask"),
        (make_layer(memory_mask="raw"), "memory_padding_mask is used the wrong way round"),
        (make_layer(dropout="functional"), "dropout is still on"),
        (make_layer(batch_first=False, transpose=False), "batch_first=True"),
        (make_layer(returns="tuple"), "return one tensor"),
        (make_layer(names=("self_attn", "cross_attn")), "has no attribute multihead_attn"),
        (make_layer(norms=("norm3", "norm2", "norm1")), "the layer norms are used in the wrong order"),
        (NotAModule, "is not a torch.nn.Module"),
        (stub, "it should be a class"),
    ],
    "decoder-Decoder": [
        (make_decoder(assigned=False), "the layers' outputs are not kept"),
        (make_decoder(scale="none"), "not multiplied by sqrt(d_model)"),
        (make_decoder(scale="d"), "multiplied by d_model; multiply by sqrt(d_model)"),
        (make_decoder(scale="after"), "sqrt(d_model) scales the positional encoding too"),
        (make_decoder(pe="none"), "the positional encoding is missing"),
        (make_decoder(pe="twice"), "the positional encoding is added twice"),
        (make_decoder(pe="shifted"), "the positional encoding starts at position 1"),
        (make_decoder(shared=True), "the layers share one set of weights"),
        (make_decoder(mask="none"), "no self-attention mask reaches the layers"),
        (make_decoder(memory_mask=False), "memory_padding_mask does not reach the layers"),
        (make_decoder(mask="pad0"), "hides token 0"),
        (make_decoder(dropout="functional"), "dropout is still on"),
        (make_decoder(layer=make_layer(cross="decoder")), "the leak is inside your DecoderLayer"),
        (make_decoder(layer=make_layer(relu=False)), "The Decoder uses your DecoderLayer: make that pass"),
        (stub, "it should be a class"),
    ],
    "decoder-future_influence": [
        (_influence_knobs(reduce="signed"), "the largest signed change"),
        (_influence_knobs(reduce="mean"), "averages the absolute change"),
        (_influence_knobs(reduce="norm"), "Euclidean norm"),
        (_influence_knobs(in_place_late=True), "it is all zeros"),
        (_influence_knobs(in_place=True), "it changed tgt_in in place"),
        (_influence_knobs(offset=1), "changes the token after `position`"),
        (_influence_knobs(offset=-1), "changes the token before `position`"),
        (_influence_knobs(assume_causal=True), "without measuring it"),
        (_influence_knobs(reduce="none"), "returns the change of every feature"),
        (_influence_knobs(reduce="positions"), "has shape"),
        (stub, "not answered yet"),
    ],
}

VARIANTS = {
    "decoder-shift_right": [_shift, _shift_new_full, _shift_roll, _shift_pad, _shift_flat_roll_fixed],
    "decoder-decoder_self_mask": [_mask, _mask_arange, _mask_expand_loop, _mask_float_tril],
    "decoder-DecoderLayer": [make_layer(), make_written("right"), make_layer(batch_first=False, self_mask="helper"), FloatMaskLayer,
                             SubclassLayer],
    "decoder-Decoder": [make_decoder(), make_decoder(mask="causal"), PlainDecoder, make_decoder(layer=SubclassLayer)],
    "decoder-future_influence": [_influence, _influence_numpy, _influence_inf_norm, _influence_max_values],
}


globals().update(shared_tests("decoder", MISTAKES, VARIANTS, solutions="decoder_notebook", seeds=8))


@pytest.mark.parametrize("norm_first", [False, True])
def test_reference_layer_matches_torch(norm_first):
    """The grader's reference is torch.nn.TransformerDecoderLayer, weight for weight."""
    from coursekit.drivers.decoder import LAYER_PARAMS

    rng = np.random.default_rng(4)
    p = {n: torch.tensor(v, dtype=torch.float32) for n, v in _layer_params(rng, 12, 20).items()}
    theirs = nn.TransformerDecoderLayer(12, 3, 20, dropout=0.0, batch_first=True, norm_first=norm_first).eval()
    theirs.load_state_dict({n: p[n] for n in LAYER_PARAMS})
    ours = reference.DecoderLayer(12, 3, 20, norm_first=norm_first).eval()
    ours.load_state_dict({n: p[n] for n in LAYER_PARAMS})
    y, memory = torch.tensor(rng.normal(size=(2, 5, 12))).float(), torch.tensor(rng.normal(size=(2, 6, 12))).float()
    causal = torch.tril(torch.ones(5, 5, dtype=torch.bool))
    keep = torch.arange(6)[None] < torch.tensor([[5], [3]])
    with torch.no_grad():
        mine = ours(y, memory, tgt_mask=causal, memory_padding_mask=keep)
        ref = theirs(y, memory, tgt_mask=~causal, memory_key_padding_mask=~keep)
    torch.testing.assert_close(mine, ref, rtol=1e-4, atol=1e-5)


def test_reference_stack_matches_the_notebook():
    """The grader's stack reference equals the notebook's Decoder loaded with the same weights."""
    from coursekit.drivers.decoder import decoder_stack

    args, _ = questions("decoder-Decoder", 0)[0].call()
    theirs, ours = decoder_stack(NS["Decoder"])(*args), decoder_stack(reference.Decoder)(*args)
    real = args[-3][0] != args[6]
    np.testing.assert_allclose(ours[0].numpy()[real], theirs[0].numpy()[real], rtol=1e-4, atol=1e-4)
