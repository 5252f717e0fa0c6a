"""Localisation of a module's mistake (grader/checks/_localise.py), in process.

When no catalogued mistake explains a module's wrong output, the grader runs the learner's
module and the reference on the same input, with forward hooks on the submodules the
docstring names (kernel-side, through the exercise's driver), and names the first
submodule, residual or norm whose tensors differ. Each learner-style mistake below is one
that no exercise's catalogue lists; it must get its localisation on the public seed and on
student seeds, never "the right shape but wrong values".
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from coursekit.probe import HOOKED, collect
from grader.checks import exercise_ids, get, public_seed, questions, verdict
from grader.checks._localise import NAME, Event, Record, compare, explain, Term
from grader.checks.reference import decoder as ref_decoder
from grader.checks.reference import encoder as ref_encoder
from grader.checks.reference import gpt as ref_gpt
from grader.checks.reference import multi_head as ref_mha
from grader.checks.reference import transformer as ref_transformer
from grader.checks.reference.transformer import causal_mask
from grader.wire import decode_payload
from tests.scope import student_seeds

MHA = ref_mha.MultiHeadAttention
SEEDS = 3
GENERIC = ("but wrong values", "the mistake is inside a sublayer")


def judged(exercise: str, cls: object, seed: int) -> str | None:
    """What grading says of ``cls`` for ``seed``, through the kernel's half (collect) and the wire."""
    asked = questions(exercise, seed)
    payload = collect(exercise, cls, [q.call() for q in asked], get(exercise).driver)
    return verdict(exercise, seed, decode_payload(payload, exercise))


# ---------------------------------------------------------------- learner-style modules

class Block(nn.Module):
    """Notebook 12's Block as a learner lays it out; ``forward`` is each example's."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0):
        super().__init__()
        self.attn = MHA(d_model, heads)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def attend(self, h):
        return self.dropout(self.attn(h, h, h, causal_mask(h.shape[1]))[0])

    def mlp(self, h):
        return self.dropout(self.linear2(self.dropout(F.gelu(self.linear1(h)))))


class BlockResidualOnNormed(Block):
    def forward(self, x):
        h = self.norm1(x)
        x = h + self.attend(h)  # the residual carries norm1(x), not x
        h = self.norm2(x)
        return h + self.mlp(h)


class BlockNoResidual(Block):
    def forward(self, x):
        x = self.attend(self.norm1(x))  # nothing added back
        return x + self.mlp(self.norm2(x))


class BlockOneNorm(Block):
    def forward(self, x):
        x = x + self.attend(self.norm1(x))
        return x + self.mlp(self.norm1(x))  # norm1 again, norm2 unused


class BlockNormInsideSublayer(Block):
    def forward(self, x):
        x = x + self.norm1(self.attend(self.norm1(x)))  # the sublayer normalises its own output as well
        return x + self.mlp(self.norm2(x))


class BlockNoActivation(Block):
    def forward(self, x):
        x = x + self.attend(self.norm1(x))
        return x + self.dropout(self.linear2(self.linear1(self.norm2(x))))


class Layer(ref_encoder.EncoderLayer):
    """Notebook 07's EncoderLayer as a learner lays it out (the reference's submodules, the
    learner's own forward)."""

    def sa(self, x, padding_mask):
        ignore = None if padding_mask is None else ~padding_mask
        return self.dropout(self.self_attn(x, x, x, key_padding_mask=ignore, need_weights=False)[0])

    def ff(self, x):
        return self.dropout(self.linear2(self.dropout(F.relu(self.linear1(x)))))


class LayerOneNorm(Layer):
    def forward(self, x, padding_mask=None):
        if self.norm_first:
            x = x + self.sa(self.norm1(x), padding_mask)
            return x + self.ff(self.norm1(x))
        x = self.norm1(x + self.sa(x, padding_mask))
        return self.norm1(x + self.ff(x))


class LayerGelu(Layer):
    def forward(self, x, padding_mask=None):
        ff = lambda t: self.linear2(F.gelu(self.linear1(t)))  # noqa: E731
        if self.norm_first:
            x = x + self.sa(self.norm1(x), padding_mask)
            return x + ff(self.norm2(x))
        x = self.norm1(x + self.sa(x, padding_mask))
        return self.norm2(x + ff(x))


class DecoderLayerOneNorm(ref_decoder.DecoderLayer):
    def norms(self):
        return self.norm1, self.norm2, self.norm2  # norm3 never used


class EncoderPositionsSubtracted(ref_encoder.Encoder):
    """The stack's input: the positional encoding subtracted from the scaled embeddings."""

    def forward(self, src):
        x = self.dropout(self.embed(src) * math.sqrt(self.d_model) - self.pe[:src.shape[1]])
        for layer in self.layers:
            x = layer(x, src != self.pad_id)
        return x


class DecoderLayersReversed(ref_decoder.Decoder):
    """The stack runs its layers last to first."""

    def forward(self, tgt_in, memory, memory_padding_mask=None):
        x, mask = self.dropout(self.inputs(tgt_in)), self.mask(tgt_in)
        for layer in reversed(self.layers):
            x = layer(x, memory, tgt_mask=mask, memory_padding_mask=memory_padding_mask)
        return x


class MHAMergeTransposed(MHA):
    def forward(self, query, key, value, mask=None):
        q, k, v = (ref_mha.split_heads(w(t), self.heads) for w, t in [(self.W_q, query), (self.W_k, key),
                                                                        (self.W_v, value)])
        if mask is not None:
            mask = mask.unsqueeze(-3)
        out, weights = ref_mha.scaled_dot_product_attention(q, k, v, mask)
        batch, heads, length, d_k = out.shape
        return self.W_o(out.transpose(2, 3).reshape(batch, length, heads * d_k)), weights  # (d_k, heads) order


class BlockMergeTransposed(Block):
    def __init__(self, d_model, heads, d_ff, dropout=0.0):
        super().__init__(d_model, heads, d_ff, dropout)
        self.attn = MHAMergeTransposed(d_model, heads)

    def forward(self, x):
        x = x + self.attend(self.norm1(x))
        return x + self.mlp(self.norm2(x))


def _transformer(decode_memory):
    """A learner's Transformer of notebook 09, with the memory its decoder layers read."""

    class Transformer(ref_transformer.Transformer):
        def __init__(self, src_vocab, tgt_vocab, d_model, heads, d_ff, layers, max_len, pad_id, dropout=0.0):
            super().__init__(src_vocab, tgt_vocab, d_model, heads, d_ff, layers, max_len, pad_id, dropout)
            self.encoder_layers = nn.ModuleList([ref_encoder.EncoderLayer(d_model, heads, d_ff, dropout)
                                                 for _ in range(layers)])
            self.decoder_layers = nn.ModuleList([ref_decoder.DecoderLayer(d_model, heads, d_ff, dropout)
                                                 for _ in range(layers)])

        def encode(self, src, src_mask):
            x = self.dropout(self.src_embed(src) * math.sqrt(self.d_model) + self.pe[:src.shape[1]])
            for layer in self.encoder_layers:
                x = layer(x, src_mask)
            return x

        def decode(self, memory, src_mask, tgt_in):
            y = self.dropout(self.tgt_embed(tgt_in) * math.sqrt(self.d_model) + self.pe[:tgt_in.shape[1]])
            mask = causal_mask(tgt_in.shape[1])
            for layer in self.decoder_layers:
                y = layer(y, decode_memory(y, memory), tgt_mask=mask,
                          memory_padding_mask=None if decode_memory(y, memory) is y else src_mask)
            return self.generator(y)

    return Transformer


# (exercise, learner's module, what the diagnosis must say: each of these substrings)
LOCALISED = {
    "residual_on_normed": ("gpt-Block", BlockResidualOnNormed, (
        "norm2's input differs", "norm1's output + attn's output", "should be the input x + attn's output",
        "is the residual added to the norm's output rather than to the sublayer's input?")),
    "no_residual": ("gpt-Block", BlockNoResidual, (
        "norm2's input differs", "it is attn's output", "the residual is missing: the input x is not added")),
    "one_norm_block": ("gpt-Block", BlockOneNorm, ("norm1 is called twice and norm2 never",
                                                   "each sublayer has its own norm")),
    # (encoder-EncoderLayer and decoder-DecoderLayer catalogue a reused norm; an Encoder around one does not)
    "one_norm_layer": ("encoder-Encoder", type("Encoder", (ref_encoder.Encoder,), {"layer": LayerOneNorm}), (
        "layers.0.norm1 is called twice and layers.0.norm2 never", "This is inside layers.0")),
    "norm_inside_sublayer": ("gpt-Block", BlockNormInsideSublayer, (
        "norm2's input differs", "norm1 applied to attn's output",
        "is norm1 applied to the sublayer's output, inside the sublayer?")),
    # (gpt-Block catalogues this one; the GPT around such a block does not)
    "no_activation": ("gpt-GPT", type("GPT", (ref_gpt.GPT,), {"block": BlockNoActivation}), (
        "blocks.0.linear2's input differs", "it is blocks.0.linear1's output", "gelu(blocks.0.linear1's output)",
        "the activation (gelu) is missing", "This is inside blocks.0. The GPT uses your BlockNoActivation")),
    "other_activation": ("encoder-EncoderLayer", LayerGelu, (
        "linear2's input differs", "it is gelu(linear1's output), where it should be relu(linear1's output)",
        "the activation is gelu, where the docstring asks for relu")),
    "stack_input": ("encoder-Encoder", EncoderPositionsSubtracted, (
        "layers.0's input differs, while embed before it is right",)),
    "layers_inside": ("decoder-Decoder", type("Decoder", (ref_decoder.Decoder,), {"layer": DecoderLayerOneNorm}), (
        "layers.0.norm2 is called twice and layers.0.norm3 never",
        "This is inside layers.0. The Decoder uses your DecoderLayer")),
    "layers_reversed": ("decoder-Decoder", DecoderLayersReversed, (
        "layers.0's y differs", "it is layers.1's output", "which comes after this point")),
    "transformer_self_memory": ("transformer-Transformer", _transformer(lambda y, memory: y), (
        "decoder_layers.0's memory has shape",
        "it is decoder_layers.0's y (the same tensor), where it should be encoder_layers.1's output")),
    # (multi_head-MultiHeadAttention catalogues this one; a Block whose attention does it does not)
    "merge_transposed": ("gpt-Block", BlockMergeTransposed, (
        "attn.W_o's input differs", "attn.W_v, attn.W_k, attn.W_q and everything before them are right",
        "the right numbers in another arrangement")),
}


@pytest.mark.parametrize("name", sorted(LOCALISED))
def test_a_mistake_nobody_catalogued_is_localised(name):
    """On the public seed and on student seeds, the diagnosis names the first submodule,
    residual or norm that differs, and how."""
    exercise, cls, wanted = LOCALISED[name]
    for seed in [public_seed(exercise), *student_seeds(SEEDS)]:
        said = judged(exercise, cls, seed)
        assert said is not None, f"{name} passed the checks of seed {seed}"
        for words in wanted:
            assert words in said, f"{name}, seed {seed}: {words!r} not in {said!r}"
        assert not any(g in said for g in GENERIC), said
        # (a layer's own check is blamed only for what happens inside the layer)
        assert ("make that pass its own checks first" in said) == (name in ("layers_inside", "no_activation", "one_norm_layer")), said


# ---------------------------------------------------------------- the comparison itself

def _event(name, start, end, inputs, output, k=0, training=False, parameters=()):
    return Event(name, k, start, end, tuple(np.asarray(v, dtype=np.float64) for v in inputs),
                 None if output is None else np.asarray(output, dtype=np.float64), training, parameters)


class _Spec:
    function = "Block"


def _records(rng, learner_norm2=True, learner_norm_input=None, training=False):
    """A reference record of x -> norm1 -> sublayer, and the learner's, with one thing changed."""
    x = rng.normal(size=(2, 3, 4))
    normed = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)
    sub = np.tanh(normed)
    right = Record({"": "Block", "norm1": "LayerNorm", "sub": "Tanh"}, (
        _event("", 0, 5, [x], x + sub, parameters=("x",)), _event("norm1", 1, 2, [x], normed),
        _event("sub", 3, 4, [normed], sub)))
    given = normed if learner_norm_input is None else learner_norm_input(x, normed, sub)
    mine = Record({"": "Block", "norm1": "LayerNorm", **({"sub": "Tanh"} if learner_norm2 else {})}, (
        _event("", 0, 5, [x], x + sub, parameters=("x",)), _event("norm1", 1, 2, [x], normed, training=training),
        _event("sub", 3, 4, [given], np.tanh(given))) if learner_norm2 else (
        _event("", 0, 3, [x], x, parameters=("x",)), _event("norm1", 1, 2, [x], normed)))
    return mine, right


def test_a_renamed_submodule_is_named_not_a_crash():
    mine, right = _records(np.random.default_rng(0), learner_norm2=False)
    said = compare(_Spec, mine, right)
    assert said.startswith("the grader cannot find the submodule sub that the docstring names"), said


def test_a_submodule_left_in_training_mode_is_named():
    mine, right = _records(np.random.default_rng(1), training=True)
    assert "norm1 is in training mode" in compare(_Spec, mine, right)


def test_dropout_left_on_between_two_submodules_is_named():
    keep = np.random.default_rng(2).random((2, 3, 4)) < 0.5
    mine, right = _records(np.random.default_rng(2), learner_norm_input=lambda x, normed, sub: normed * keep * 2)
    said = compare(_Spec, mine, right)
    assert "sub's input differs" in said and "it is dropout of norm1's output" in said, said
    assert "dropout is still applied in eval mode" in said, said


def test_explain_names_sums_activations_and_nothing_it_cannot_show():
    rng = np.random.default_rng(3)
    a, b = Term("a", rng.normal(size=(3, 4))), Term("b", rng.normal(size=(3, 4)))
    assert explain(a.value + b.value, [a, b])[0] == "a + b"
    assert explain(np.maximum(b.value, 0), [a, b])[0] == "relu(b)"
    assert explain(a.value * 3.7 + 1, [a, b]) is None
    assert explain(a.value, [b]) is None


def test_the_hooked_questions_leave_the_graded_ones_and_change_nothing_for_a_right_module():
    """The localisation's questions come after every other question (the graded inputs are
    those drawn before), and a right module answers them as the reference does."""
    for exercise in ("gpt-Block", "encoder-EncoderLayer"):
        spec = get(exercise)
        assert spec.probes[-1].name == NAME
        asked = questions(exercise, public_seed(exercise))
        hooked = [q for q in asked if HOOKED in q.kwargs]
        assert hooked and asked[-len(hooked):] == hooked
    assert judged("gpt-Block", __import__("grader.checks.reference.gpt", fromlist=["Block"]).Block, 5) is None


class _Raising(Block):
    def forward(self, x):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")


def test_a_module_that_raises_gets_its_error_and_the_hooks_stay_out_of_the_way():
    said = judged("gpt-Block", _Raising, public_seed("gpt-Block"))
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in said, said
    import torch.nn.modules.module as module
    assert not module._global_forward_hooks and not module._global_forward_pre_hooks


# module exercises made of parameters alone (built here from these arguments): nothing inside to hook
LEAF_MODULES = {"modern_decoder-RMSNorm": (8,)}


def test_every_module_exercise_hooks_submodules_its_reference_has():
    """Each module exercise declares submodules, and each name matches a submodule of the
    reference that the reference calls on the public seed's first question; one made of
    parameters alone (LEAF_MODULES) declares none and has none."""
    from grader.checks._core import _answer_of
    from grader.checks._localise import _record
    for exercise in exercise_ids():
        spec = get(exercise)
        if not (isinstance(spec.reference, type) and issubclass(spec.reference, torch.nn.Module)):
            continue                # a function, or a class that is not a module (serving's PagedKVCache)
        if exercise in LEAF_MODULES:
            assert not spec.submodules and not list(spec.reference(*LEAF_MODULES[exercise]).children()), exercise
            continue
        assert spec.submodules, f"{exercise} hooks no submodule"
        seed = public_seed(exercise)
        call = [q for q in questions(exercise, seed) if HOOKED in q.kwargs][0]
        record = _record(_answer_of(spec, seed, (NAME, call.what), "reference", spec.reference, call))
        assert not record.truncated, f"{exercise}: the hooks see more than the kernel hands back"
        called = {e.name for e in record.events}
        import re
        for pattern in spec.submodules:
            wanted = re.compile(re.escape(pattern).replace(r"\*", r"\d+"))
            assert any(wanted.fullmatch(n) for n in record.present), f"{exercise}: no submodule {pattern}"
            assert any(wanted.fullmatch(n) for n in called), f"{exercise}: the reference never calls {pattern}"


def test_the_first_tensor_holding_nan_is_named():
    """NaN from a submodule (here the learner's own norm dividing by a zero spread) is named where
    it first appears, not at the output."""
    with np.errstate(all="ignore"):
        mine, right = _records(np.random.default_rng(4), learner_norm_input=lambda x, normed, sub: normed / 0.0)
        said = compare(_Spec, mine, right)
    assert said.startswith("sub's input is the first tensor the hooks see holding NaN or infinity"), said
    assert "norm1 before it is right" in said, said


def test_a_hooked_question_survives_the_hidden_cell_s_encoding():
    """The hidden test cell carries the questions as JSON (coursekit.probe.encode_questions): the
    hooked names arrive as the keyword the kernel's collect reads, and the answer is the same."""
    from coursekit.probe import decode_questions, encode_questions
    exercise = "gpt-Block"
    spec, seed = get(exercise), public_seed(exercise)
    asked = [q.call() for q in questions(exercise, seed) if HOOKED in q.kwargs]
    direct = decode_payload(collect(exercise, BlockOneNorm, asked, spec.driver), exercise)
    carried = decode_payload(collect(exercise, BlockOneNorm, decode_questions(encode_questions(asked)), spec.driver),
                             exercise)
    assert len(direct) == len(carried) and all(
        a[:2] == b[:2] and all(np.array_equal(x, y) for cx, cy in zip(a[2:], b[2:]) for x, y in zip(cx, cy))
        for a, b in zip(direct, carried))
