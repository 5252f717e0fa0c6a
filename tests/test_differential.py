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


import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from grader.checks import answers_of, get, verdict, with_upstream
from grader.checks.reference import encoder as encoder_ref

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
