"""Differential diagnosis on mistakes written here, independently of any catalogue entry.

The catalogue's own implementations are tested by tests/test_catalogue.py. These are
learner-style answers written the way a learner would (other library calls, other
structure), each with a kind of mistake the issue names: two known mistakes at once,
another activation, a residual or norm inside a sublayer as well as around it, a loss
reduced differently, an upstream function to blame, a raised error on a later question.
Each is judged by the grading path (collect, wire, verdict) on the public seed and on
several student seeds.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from grader.checks import Raised, answers_of, get, verdict, with_upstream
from grader.checks.reference import encoder as encoder_ref
from grader.checks.reference import multi_head as multi_head_ref

SEEDS = (1, 2, 3)


def diagnoses(exercise: str, fn: object) -> list[str]:
    found = []
    for seed in SEEDS:
        with np.errstate(all="ignore"):
            found.append(verdict(exercise, seed, answers_of(exercise, fn, seed)))
    return found


def assert_named(exercise: str, fn: object, *words: str) -> None:
    for message in diagnoses(exercise, fn):
        assert message and all(w in message for w in words), message


# --------------------------------------------------------------- two mistakes at once
def attention_unscaled_over_queries(query, key, value, mask=None):
    scores = torch.matmul(torch.as_tensor(query), torch.as_tensor(key).transpose(-1, -2))
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), float("-inf"))
    weights = torch.softmax(scores, dim=-2)
    return weights @ torch.as_tensor(value), weights


def attention_by_d_k_with_zero_fill(query, key, value, mask=None):
    scores = np.einsum("...qd,...kd->...qk", query, key) / query.shape[-1]
    if mask is not None:
        scores = scores * mask
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
    return np.einsum("...qk,...kv->...qv", weights, value), weights


@pytest.mark.parametrize("fn,first,second", [
    (attention_unscaled_over_queries, "does not scale the scores", "softmax runs over the query axis"),
    (attention_by_d_k_with_zero_fill, "divides the scores by d_k", "sets the masked scores to 0"),
])
def test_two_mistakes_at_once_are_both_named(fn, first, second):
    assert_named("softmax-scaled_dot_product_attention", fn, "two mistakes at once", first, second)


def loss_summed_over_every_position(logits, target, pad_id, smoothing):
    V = logits.shape[-1]
    smooth = torch.full((V,), smoothing / (V - 1)).index_fill(0, torch.tensor([pad_id]), 0.0)
    q = smooth.expand(*target.shape, V).clone()
    q.scatter_add_(-1, target.unsqueeze(-1), torch.full((*target.shape, 1), 1 - smoothing))
    return -(q * logits.log_softmax(-1)).sum()


def test_a_loss_summed_over_padding_too_names_both():
    assert_named("transformer-label_smoothed_loss", loss_summed_over_every_position,
                 "two mistakes at once", "sums over the tokens", "padding positions are not ignored")


# --------------------------------------------------------------- another activation
def ffn_with(activation):
    def feed_forward(x, W1, b1, W2, b2):
        return activation(F.linear(x, W1, b1)) @ W2.T + b2
    return feed_forward


@pytest.mark.parametrize("activation,named", [
    (nn.GELU(), "applies GELU"), (nn.GELU(approximate="tanh"), "tanh approximation of GELU"),
    (torch.tanh, "applies tanh"), (nn.SiLU(), "applies SiLU"), (torch.sigmoid, "applies a sigmoid"),
])
def test_another_activation_is_named(activation, named):
    assert_named("encoder-feed_forward", ffn_with(activation), named)


def test_another_activation_and_a_missing_bias_are_both_named():
    def feed_forward(x, W1, b1, W2, b2):
        return F.gelu(x @ W1.T) @ W2.T + b2
    assert_named("encoder-feed_forward", feed_forward, "two mistakes at once", "GELU", "bias b1")


# --------------------------------------------------- a residual or norm inside and around
class ResidualInsideFFN(encoder_ref.EncoderLayer):
    def ffn(self, t):
        hidden = self.linear2(self.dropout(F.relu(self.linear1(t))))
        return t + self.dropout(hidden)  # its own residual; sublayer_connection adds another


class NormInsideFFN(encoder_ref.EncoderLayer):
    def ffn(self, t):
        return self.norm2(self.dropout(self.linear2(F.relu(self.linear1(t)))))


@pytest.mark.parametrize("layer,named", [
    (ResidualInsideFFN, "adds its own residual and sublayer_connection adds x again"),
    (NormInsideFFN, "normalizes its own output and sublayer_connection normalizes again"),
])
def test_residual_or_norm_inside_a_sublayer_as_well_as_around_it(layer, named):
    assert_named("encoder-EncoderLayer", layer, named)


# --------------------------------------------------------------- a loss reduced differently
def loss_reduced(how):
    def label_smoothed_loss(logits, target, pad_id, smoothing):
        V = logits.shape[-1]
        logp = F.log_softmax(logits, -1).reshape(-1, V)
        t = target.reshape(-1)
        q = torch.full_like(logp, smoothing / (V - 1))
        q[:, pad_id] = 0
        q[torch.arange(len(t)), t] = 1 - smoothing + smoothing / (V - 1)
        keep = t != pad_id
        if how == "kl":
            return F.kl_div(logp[keep], q[keep], reduction="batchmean")
        per_token = -(q * logp).sum(-1)
        if how == "sum":
            return per_token[keep].sum()
        return per_token.mean()  # "all": padding positions averaged in
    return label_smoothed_loss


@pytest.mark.parametrize("how,named", [("sum", "sums over the tokens"), ("kl", "KL divergence"),
                                       ("all", "padding positions are not ignored")])
def test_a_loss_reduced_differently_is_named(how, named):
    assert_named("transformer-label_smoothed_loss", loss_reduced(how), named)


# --------------------------------------------------------------- an upstream bug
class InvertedMaskLayer(encoder_ref.EncoderLayer):
    def forward(self, x, padding_mask=None):
        ignore = padding_mask  # PyTorch wants True = ignore: this passes the real tokens
        x = encoder_ref.sublayer_connection(x, lambda t: self.attend(t, ignore), self.norm1, self.norm_first)
        return encoder_ref.sublayer_connection(x, self.ffn, self.norm2, self.norm_first)


class EncoderOfInvertedLayers(encoder_ref.Encoder):
    layer = InvertedMaskLayer


def test_an_upstream_bug_is_blamed_downstream():
    """The notebook's verdicts: EncoderLayer is wrong, so the Encoder built from it is told to fix it first."""
    verdicts = {"encoder-EncoderLayer": diagnoses("encoder-EncoderLayer", InvertedMaskLayer)[0],
                "encoder-Encoder": diagnoses("encoder-Encoder", EncoderOfInvertedLayers)[0],
                "encoder-sublayer_connection": None}
    assert "padding mask is inverted" in verdicts["encoder-EncoderLayer"]
    blamed = with_upstream(verdicts)
    assert blamed["encoder-Encoder"].startswith(verdicts["encoder-Encoder"])
    assert "EncoderLayer is wrong too, and Encoder calls it: fix EncoderLayer first" in blamed["encoder-Encoder"]
    assert blamed["encoder-EncoderLayer"] == verdicts["encoder-EncoderLayer"]  # nothing upstream of it failed


def test_no_blame_when_the_upstream_passes_or_the_downstream_is_not_answered():
    right = with_upstream({"encoder-EncoderLayer": None, "encoder-Encoder": "Encoder(...): wrong values"})
    assert right["encoder-Encoder"] == "Encoder(...): wrong values"
    stub = with_upstream({"encoder-EncoderLayer": "wrong", "encoder-Encoder": "Encoder: not answered yet, it "
                          "still raises NotImplementedError"})
    assert "fix" not in stub["encoder-Encoder"]


def test_depends_lists_the_exercises_each_solution_calls():
    """Spec.depends is kept true: the same-notebook exercise functions the solution cell calls."""
    import re

    import nbformat

    from grader import course
    from grader.checks import exercise_ids

    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        cells = {c.metadata.get("nbgrader", {}).get("grade_id"): c.source
                 for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"}
        ids = [i for i in exercise_ids() if i in cells]
        for exercise in ids:
            solution = "\n".join(re.findall(r"### BEGIN SOLUTION(.*?)### END SOLUTION", cells[exercise], re.S))
            calls = {j for j in ids if j != exercise and re.search(rf"\b{get(j).function}\b", solution)}
            assert set(get(exercise).depends) == calls, exercise


# --------------------------------------------------------------- an error on a later question
def test_an_error_on_a_later_question_is_explained_in_the_exercise_s_words():
    def score_matrix(queries, keys):
        return np.dot(queries, keys.T)  # right for 2-D, a shape error on the batch
    assert_named("similarity-score_matrix", score_matrix, "It fails on a batch")


def test_the_attention_knobs_compose_with_math_not_with_the_catalogue():
    """A valid variant with every choice made differently from the reference's code passes."""
    def attention(query, key, value, mask=None):
        scores = query @ np.swapaxes(key, -1, -2) * query.shape[-1] ** -0.5
        if mask is not None:
            scores = np.where(mask, scores, -1e9)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)
        return weights @ value, weights
    assert diagnoses("softmax-scaled_dot_product_attention", attention) == [None] * len(SEEDS)


# ===================================================================== targeted extra questions
# The probes of a spec (diagnostic calls answered with the graded ones) locate what no
# catalogued mistake explains. Every class and function below is written from scratch, the
# way a learner would, not from the catalogue's implementations.

# --------------------------------------------------------------- which axis sums to one
def attention_softmax_without_dim(query, key, value, mask=None):
    q, k, v = (torch.as_tensor(a) for a in (query, key, value))
    scores = torch.matmul(q, k.transpose(-2, -1)) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), -1e9)
    with __import__("warnings").catch_warnings():
        __import__("warnings").simplefilter("ignore")
        weights = F.softmax(scores)  # no dim: torch picks dim 1 of 4-D scores, dim 0 of 3-D ones
    return torch.matmul(weights, v), weights


def attention_normalized_per_head(query, key, value, mask=None):
    scores = np.einsum("...qd,...kd->...qk", query, key) / np.sqrt(query.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    e = np.exp(scores - scores.max(axis=(-2, -1), keepdims=True))
    weights = e / e.sum(axis=(-2, -1), keepdims=True)  # every entry of a head's matrix at once
    return weights @ value, weights


def attention_over_queries_scaled_twice(query, key, value, mask=None):
    scores = query @ np.swapaxes(key, -1, -2) / query.shape[-1] ** 1.5  # a scale no knob lists
    if mask is not None:
        scores = np.where(mask, scores, -1e9)
    e = np.exp(scores - scores.max(axis=-2, keepdims=True))
    weights = e / e.sum(axis=-2, keepdims=True)
    return weights @ value, weights


@pytest.mark.parametrize("fn,words", [
    (attention_softmax_without_dim, ("the heads axis of (batch, heads, query, key) weights",
                                     "the batch axis of (batch, query, key) weights")),
    (attention_normalized_per_head, ("the query and key axes together",)),
    (attention_over_queries_scaled_twice, ("the weights sum to 1 over the query axis",)),
])
def test_which_axis_sums_to_one_is_named(fn, words):
    assert_named("softmax-scaled_dot_product_attention", fn, "each query's weights over the keys should sum to 1",
                 *words)


class HeadsSoftmaxMHA(multi_head_ref.MultiHeadAttention):  # (its __init__ only: the layers the driver loads)
    def forward(self, query, key, value, mask=None):
        b = query.shape[0]
        q, k, v = (w(x).view(b, -1, self.heads, self.d_k).permute(0, 2, 1, 3)
                   for w, x in ((self.W_q, query), (self.W_k, key), (self.W_v, value)))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask.unsqueeze(-3), float("-inf"))
        weights = scores.softmax(dim=1)  # over the heads
        out = torch.einsum("bhqk,bhkd->bhqd", weights, v).permute(0, 2, 1, 3).reshape(b, -1, self.d_model)
        return self.W_o(out), weights


def test_which_axis_the_multi_head_weights_sum_to_one_over_is_named():
    assert_named("multi_head-MultiHeadAttention", HeadsSoftmaxMHA, "the weights sum to 1 over the heads axis")


# ------------------------------------------------ a residual or norm missing or doubled
class ScratchEncoderLayer(nn.Module):
    """An encoder layer written out in full, with switches for what a learner gets wrong."""

    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False, *, inside_ffn_residual=False,
                 attention_norm=True, activation=F.relu, inverted=False, attention_inside_norm=False):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.drop = nn.Dropout(dropout)
        self.norm_first, self.inside_ffn_residual, self.attention_norm = norm_first, inside_ffn_residual, attention_norm
        self.activation, self.inverted, self.attention_inside_norm = activation, inverted, attention_inside_norm

    def _attention(self, t, padding_mask):
        ignore = None if padding_mask is None else (padding_mask if self.inverted else ~padding_mask)
        out = self.drop(self.self_attn(t, t, t, key_padding_mask=ignore)[0])
        return self.norm1(out) if self.attention_inside_norm else out

    def _ffn(self, t):
        out = self.drop(self.linear2(self.activation(self.linear1(t))))
        return t + out if self.inside_ffn_residual else out

    def forward(self, x, padding_mask=None):
        norm1 = self.norm1 if self.attention_norm else nn.Identity()
        if self.norm_first:
            x = x + self._attention(norm1(x), padding_mask)
            return x + self._ffn(self.norm2(x))
        x = norm1(x + self._attention(x, padding_mask))
        return self.norm2(x + self._ffn(x))


def scratch_layer(**wrong):
    return type("EncoderLayer", (ScratchEncoderLayer,), {"__init__": lambda self, *a, **k: ScratchEncoderLayer.__init__(
        self, *a, **k, **wrong)})


def test_the_scratch_encoder_layer_is_right():
    assert diagnoses("encoder-EncoderLayer", scratch_layer()) == [None] * len(SEEDS)


@pytest.mark.parametrize("wrong,words", [
    ({"inside_ffn_residual": True, "attention_norm": False},
     ("two mistakes at once", "the feed-forward sublayer adds its own residual", "self-attention sublayer's norm "
      "(norm1) is missing")),
    ({"attention_inside_norm": True, "inside_ffn_residual": True, "inverted": True},
     ("three mistakes at once", "the self-attention sublayer normalizes its own output",
      "the feed-forward sublayer adds its own residual", "the padding mask is inverted")),
    ({"inverted": True, "inside_ffn_residual": True},
     ("two mistakes at once", "the padding mask is inverted", "the feed-forward sublayer adds its own residual")),
    ({"inside_ffn_residual": True, "activation": F.gelu},
     ("the feed-forward sublayer adds its own residual", "Something else differs as well")),
    # (the connections are right: the hooks on the submodules locate the activation, grader/checks/_localise.py)
    ({"activation": F.gelu}, ("linear2's input differs", "it is gelu(linear1's output), where it should be "
                              "relu(linear1's output)")),
])
def test_residuals_and_norms_are_located_in_an_encoder_layer(wrong, words):
    assert_named("encoder-EncoderLayer", scratch_layer(**wrong), *words)


class ScratchDecoderLayer(nn.Module):
    def __init__(self, d_model, heads, d_ff, dropout=0.0, norm_first=False, *, cross_inside_residual=False,
                 ffn_norm=True, self_inside_norm=False):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.multihead_attn = nn.MultiheadAttention(d_model, heads, dropout=dropout, batch_first=True)
        self.linear1, self.linear2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model) for _ in range(3))
        self.dropout, self.norm_first, self.heads = nn.Dropout(dropout), norm_first, heads
        self.cross_inside_residual, self.ffn_norm, self.self_inside_norm = cross_inside_residual, ffn_norm, self_inside_norm

    def forward(self, y, memory, tgt_mask=None, memory_padding_mask=None):
        attn_mask = None if tgt_mask is None else ~tgt_mask
        if attn_mask is not None and attn_mask.dim() == 3:
            attn_mask = attn_mask.repeat_interleave(self.heads, dim=0)
        ignore = None if memory_padding_mask is None else ~memory_padding_mask

        def self_block(x):
            out = self.dropout(self.self_attn(x, x, x, attn_mask=attn_mask)[0])
            return self.norm1(out) if self.self_inside_norm else out

        def cross_block(x):
            out = self.dropout(self.multihead_attn(x, memory, memory, key_padding_mask=ignore)[0])
            return x + out if self.cross_inside_residual else out

        def ffn_block(x):
            return self.dropout(self.linear2(F.relu(self.linear1(x))))

        norm3 = self.norm3 if self.ffn_norm else (lambda t: t)
        x = y
        for block, norm in ((self_block, self.norm1), (cross_block, self.norm2), (ffn_block, norm3)):
            x = x + block(norm(x)) if self.norm_first else norm(x + block(x))
        return x


def scratch_decoder_layer(**wrong):
    return type("DecoderLayer", (ScratchDecoderLayer,), {"__init__": lambda self, *a, **k: ScratchDecoderLayer.__init__(
        self, *a, **k, **wrong)})


@pytest.mark.parametrize("wrong,words", [
    ({}, ()),
    ({"cross_inside_residual": True, "ffn_norm": False},
     ("two mistakes at once", "the cross-attention sublayer adds its own residual",
      "the feed-forward sublayer's norm (norm3) is missing")),
    ({"self_inside_norm": True}, ("the masked self-attention sublayer normalizes its own output",)),
])
def test_residuals_and_norms_are_located_in_a_decoder_layer(wrong, words):
    if not words:
        assert diagnoses("decoder-DecoderLayer", scratch_decoder_layer()) == [None] * len(SEEDS)
    else:
        assert_named("decoder-DecoderLayer", scratch_decoder_layer(**wrong), *words)


# --------------------------------------------------------------- which activation
def gelu_typed_by_hand(h):
    return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))


def gelu_erf_typed_by_hand(h):
    return 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))


@pytest.mark.parametrize("activation,named", [
    (nn.ELU(), "applies ELU"), (nn.Softplus(), "applies softplus"), (nn.Mish(), "applies Mish"),
    (nn.ReLU6(), "applies ReLU6"), (nn.Hardswish(), "applies hard swish"), (nn.SELU(), "applies SELU"),
    (gelu_typed_by_hand, "the tanh approximation of GELU"), (gelu_erf_typed_by_hand, "applies GELU"),
    (lambda h: h * torch.sigmoid(1.702 * h), "the sigmoid approximation of GELU"),
    (lambda h: h * torch.tanh(h), "the activation between the layers is not ReLU: it is"),
])
def test_an_activation_no_knob_lists_is_named(activation, named):
    assert_named("encoder-feed_forward", ffn_with(activation), named)


def test_an_activation_and_a_bias_no_single_mistake_explains_are_both_named():
    def feed_forward(x, W1, b1, W2, b2):
        return F.linear(F.elu(F.linear(x, W1)), W2, b2)  # ELU, and no b1
    assert_named("encoder-feed_forward", feed_forward, "two mistakes at once", "applies ELU", "bias b1")


# --------------------------------------------------------------- which reduction
def loss_reduced_as(reduce, q_of=None):
    def label_smoothed_loss(logits, target, pad_id, smoothing):
        V = logits.shape[-1]
        logp = logits.reshape(-1, V).log_softmax(-1)
        t = target.reshape(-1)
        if q_of is None:
            q = torch.full_like(logp, smoothing / (V - 1))
            q[:, pad_id] = 0.0
            q.scatter_(1, t.unsqueeze(1), 1 - smoothing + smoothing / (V - 1))
        else:
            q = q_of(logp, t, smoothing, V)
        per_token = -(q * logp).sum(-1)
        real = (t != pad_id).float()
        return reduce(per_token, real, target.shape)
    return label_smoothed_loss


def _uniform_over_every_class(logp, t, eps, V):
    q = torch.full_like(logp, eps / (V - 1))  # padding keeps its share: in no knob list
    q[torch.arange(len(t)), t] = 1 - eps
    return q


@pytest.mark.parametrize("loss,words", [
    (loss_reduced_as(lambda l, real, shape: (l * real).sum() / real.numel()), ("by the number of all positions",)),
    (loss_reduced_as(lambda l, real, shape: ((l * real).view(shape).sum(1) / real.view(shape).sum(1)).mean()),
     ("it averages per sentence",)),
    (loss_reduced_as(lambda l, real, shape: (l * real).sum() / shape[0]), ("divides by the batch size",)),
    (loss_reduced_as(lambda l, real, shape: (l * (1 - real)).sum() / (1 - real).sum()),
     ("over the padding positions only",)),
    (loss_reduced_as(lambda l, real, shape: (l * real).sum(), _uniform_over_every_class),
     ("it sums over the tokens", "Something else differs as well")),
])
def test_the_reduction_of_a_loss_is_named(loss, words):
    assert_named("transformer-label_smoothed_loss", loss, *words)


def test_kl_summed_names_both():
    def label_smoothed_loss(logits, target, pad_id, smoothing):
        V = logits.shape[-1]
        logp, t = F.log_softmax(logits, -1).view(-1, V), target.view(-1)
        q = torch.full_like(logp, smoothing / (V - 1))
        q[:, pad_id] = 0
        q[torch.arange(len(t)), t] = 1 - smoothing + smoothing / (V - 1)
        keep = t != pad_id
        return F.kl_div(logp[keep], q[keep], reduction="sum")
    assert_named("transformer-label_smoothed_loss", label_smoothed_loss, "two mistakes at once", "KL divergence",
                 "sums over the tokens")


# --------------------------------------------------------------- two known mistakes at once
class UnscaledReversedMHA(HeadsSoftmaxMHA):
    def forward(self, query, key, value, mask=None):
        b = query.shape[0]
        q, k, v = (w(x).view(b, -1, self.heads, self.d_k).transpose(1, 2)
                   for w, x in ((self.W_q, query), (self.W_k, key), (self.W_v, value)))
        scores = q @ k.transpose(-2, -1)  # not scaled
        if mask is not None:
            scores = scores.masked_fill(~mask.unsqueeze(-3), float("-inf"))
        weights = scores.softmax(-1)
        heads = list((weights @ v).unbind(1))[::-1]  # concatenated last head first
        return self.W_o(torch.cat(heads, dim=-1)), weights


def test_two_known_multi_head_mistakes_are_both_named():
    assert_named("multi_head-MultiHeadAttention", UnscaledReversedMHA, "two mistakes at once",
                 "does not scale the scores", "in reverse order")


# --------------------------------------------------------------- raised errors on later questions
def attention_if_mask(query, key, value, mask=None):
    scores = query @ np.swapaxes(key, -1, -2) / np.sqrt(query.shape[-1])
    if mask:  # fine without a mask; raises on the first question that has one
        scores = np.where(mask, scores, -np.inf)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    return weights @ value, weights


class MaskWithoutHeadsMHA(HeadsSoftmaxMHA):
    def forward(self, query, key, value, mask=None):
        if mask is not None and mask.dim() == 3 and mask.shape[1] != 1:
            mask = mask.unsqueeze(0)  # (batch, q_len, k_len) gets an axis in front, not a heads axis
        b = query.shape[0]
        q, k, v = (w(x).view(b, -1, self.heads, self.d_k).transpose(1, 2)
                   for w, x in ((self.W_q, query), (self.W_k, key), (self.W_v, value)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~(mask if mask.dim() == 4 else mask.unsqueeze(-3)), float("-inf"))
        weights = scores.softmax(-1)
        return self.W_o((weights @ v).transpose(1, 2).reshape(b, -1, self.d_model)), weights


def ffn_einsum_without_ellipsis(x, W1, b1, W2, b2):
    hidden = torch.relu(torch.einsum("bsd,fd->bsf", x, W1) + b1)  # (batch, seq_len, d) only
    return torch.einsum("bsf,df->bsd", hidden, W2) + b2


def loss_unpacking_the_shape(logits, target, pad_id, smoothing):
    B, T, V = logits.shape  # the last question's logits are (tokens, V)
    logp, t = logits.view(B * T, V).log_softmax(-1), target.view(B * T)
    q = torch.full_like(logp, smoothing / (V - 1)).index_fill(1, torch.tensor([pad_id]), 0.0)
    q[torch.arange(B * T), t] = 1 - smoothing + smoothing / (V - 1)
    return -(q * logp).sum(-1)[t != pad_id].mean()


class FloatMaskLayer(ScratchEncoderLayer):
    def _attention(self, t, padding_mask):
        ignore = None if padding_mask is None else (~padding_mask).float() * 2  # neither bool nor a float mask
        return self.drop(self.self_attn(t, t, t, key_padding_mask=ignore)[0])


@pytest.mark.parametrize("exercise,fn,words", [
    ("softmax-scaled_dot_product_attention", attention_if_mask, ("`if mask is not None:`",)),
    ("multi_head-MultiHeadAttention", MaskWithoutHeadsMHA, ("has no heads axis",)),
    ("encoder-feed_forward", ffn_einsum_without_ellipsis, ("the layers act on the last axis",)),
    ("transformer-label_smoothed_loss", loss_unpacking_the_shape, ("logits may be (tokens, V)",)),
])
def test_an_error_raised_on_a_later_question_is_explained_in_the_exercise_s_words(exercise, fn, words):
    """Each is right, or raises nothing, on the first question: the rule must apply on the one that raises."""
    graded = len(get(exercise).inputs(np.random.default_rng(0)))
    for seed in SEEDS:
        answers = answers_of(exercise, fn, seed)[:graded]
        assert not isinstance(answers[0], Raised), answers[0]
        assert any(isinstance(a, Raised) for a in answers[1:])
    assert_named(exercise, fn, *words)


# --------------------------------------------------------------- the probes never cost points
def feed_forward_that_refuses_identity_weights(x, W1, b1, W2, b2):
    if W1.shape[0] == W1.shape[1] and torch.equal(W1, torch.eye(W1.shape[0], dtype=W1.dtype)):
        raise ValueError("an identity layer: refused")
    return F.linear(F.relu(F.linear(x, W1, b1)), W2, b2)


def test_a_right_answer_is_right_whatever_it_answers_to_the_probes():
    """Diagnostic calls never count for points: an implementation right on every graded call
    passes even when it raises on every probe."""
    assert diagnoses("encoder-feed_forward", feed_forward_that_refuses_identity_weights) == [None] * len(SEEDS)
    answers = answers_of("encoder-feed_forward", feed_forward_that_refuses_identity_weights, 1)
    assert isinstance(answers[-1], Raised)  # (it did refuse the probe)
