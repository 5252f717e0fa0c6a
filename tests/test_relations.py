"""A diagnosis for any difference (issue 33, items 3 and 4), in process.

Learner-style wrong implementations that no catalogued mistake reproduces get the relation
that holds between their answers and the reference's on every graded call
(grader/checks/_relations.py), on the public seed and on student seeds; a raised error that
no rule explains says what the docstring asks for; a NameError says to restart and run all;
a catalogued diagnosis (one mistake, or two at once) is claimed only when it reproduces every
graded answer.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from grader.checks import answers_of, get, public_seed, questions, verdict
from grader.checks import _relations as relations
from tests.generic_diagnoses import generic
from tests.scope import student_seeds

SEEDS = student_seeds(6)


def _verdicts(exercise: str, fn: object) -> list[tuple[int, str | None]]:
    """(seed, verdict) for the public seed and the student seeds, as grading judges."""
    found = []
    for seed in [public_seed(exercise), *SEEDS]:
        with np.errstate(all="ignore"):
            found.append((seed, verdict(exercise, seed, answers_of(exercise, fn, seed))))
    return found


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --- learner-style mistakes nobody catalogued ------------------------------------------------

def dot_product_mean(a, b):
    """np.mean where the dot product sums."""
    return np.mean(a * b, axis=-1)


def dot_variance_summed(q, k):
    """The variance written out, with a sum where the mean of the squared deviations is asked."""
    dots = (q * k).sum(axis=-1)
    return np.sum((dots - dots.mean()) ** 2)


def softmax_reversed(x, axis=-1):
    """The weights written back in reversed order (a [::-1] left from a test)."""
    return np.flip(_softmax(x, axis), axis=-1)


def scores_float16(queries, keys):
    """The scores computed in float16 to save memory."""
    q, k = queries.astype(np.float16), keys.astype(np.float16)
    return q @ np.swapaxes(k, -1, -2) / np.float16(math.sqrt(queries.shape[-1]))


def cosine_keepdims(a, b, eps=1e-8):
    """keepdims=True left on the final sum."""
    dot = (a * b).sum(axis=-1, keepdims=True)
    return dot / (np.linalg.norm(a, axis=-1, keepdims=True) * np.linalg.norm(b, axis=-1, keepdims=True) + eps)


def smoothed_loss_as_kl(logits, target, pad_id, smoothing):
    """KL(q || p) written with log(q / p): q is 0 at the pad class, and 0 * log(0) is NaN."""
    V = logits.shape[-1]
    p = torch.softmax(logits, dim=-1)
    q = smoothing / (V - 1) + (1 - smoothing - smoothing / (V - 1)) * F.one_hot(target, V)
    q[..., pad_id] = 0.0
    kl = (q * torch.log(q / p)).sum(dim=-1) - (q * torch.log(q)).sum(dim=-1)
    return kl[target != pad_id].mean()


def scores_with_helper(queries, keys):
    """Calls a helper defined in a later cell (or deleted): NameError in a run from the top."""
    return raw_scores(queries, keys) / np.sqrt(queries.shape[-1])  # noqa: F821


def cache_bytes_without_kv_heads(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
    """The per-head width counted, the number of key/value heads forgotten."""
    if d_model % heads or heads % kv_heads:
        raise ValueError("heads must divide d_model and kv_heads must divide heads")
    return 2 * tokens * layers * (d_model // heads) * bytes_per_value


RELATED = [
    ("similarity-dot_product", dot_product_mean,
     ("every value is the right one divided by a.shape[-1], on every graded call", "a mean where a sum is asked")),
    ("scaling-dot_variance", dot_variance_summed,
     ("every value is the right one multiplied by q.shape[-2], on every graded call", "a sum where a mean is asked")),
    ("efficient_attention-kv_cache_bytes", cache_bytes_without_kv_heads,
     ("every value is the right one divided by kv_heads, on every graded call",)),
    ("softmax-stable_softmax", softmax_reversed, ("it is the right answer in reversed order along the last axis",)),
    ("scaling-scaled_scores", scores_float16, ("but not to the 1e-4 asked: precision is lost", "float16")),
    ("similarity-cosine_similarity", cosine_keepdims,
     ("has an extra axis 2 of length 1 (keepdims=True, or a squeeze missing); the values are right",)),
    ("transformer-label_smoothed_loss", smoothed_loss_as_kl, ("it contains NaN where the right value is finite",)),
    ("scaling-scaled_scores", scores_with_helper,
     ("raised NameError: name 'raw_scores' is not defined", "or defined in a later cell",
      "Restart the kernel and run all cells from the top to see it")),
]


@pytest.mark.parametrize("exercise,fn,words", RELATED, ids=[f"{e}-{fn.__name__}" for e, fn, _ in RELATED])
def test_a_mistake_nobody_catalogued_gets_the_relation_that_holds_on_every_call(exercise, fn, words):
    for seed, message in _verdicts(exercise, fn):
        assert message and all(w in message for w in words), (seed, message)
        assert not generic(message), (seed, message)


def test_an_unexplained_error_names_the_call_and_what_the_docstring_asks_for():
    """np.dot pairs the last axis of a with the second-to-last of b: it raises on a batch."""
    spec = get("similarity-dot_product")
    for seed, message in _verdicts("similarity-dot_product", np.dot):
        failing = []
        for call in questions("similarity-dot_product", seed):
            try:
                np.dot(*call.args)
            except ValueError:
                failing.append(call)
        assert failing, seed
        shape = spec.reference(*failing[0].args).shape
        assert message.startswith(f"{failing[0].what} raised ValueError: "), (seed, message)
        assert message.endswith(f"; it should return an array of shape {shape}"), (seed, message)


# --- the relations themselves, on arrays -------------------------------------------------------

def _pair(got, want, *args):
    return relations.Pair(np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64), args)


def test_each_relation_is_named_only_when_it_holds_on_every_call():
    rng = np.random.default_rng(0)
    wants = [rng.normal(size=(2, 4, 5)), rng.normal(size=(3, 6, 6))]
    keys = [rng.normal(size=(2, 5, 8)), rng.normal(size=(3, 6, 2))]
    names = ["query", "key"]

    def said(transform, pairs=None):
        pairs = pairs or [relations.Pair(transform(w, k), w, (None, k)) for w, k in zip(wants, keys)]
        return relations.describe(pairs, 0, names)

    assert "divided by sqrt(key.shape[-1])" in said(lambda w, k: w / math.sqrt(k.shape[-1]))
    assert "opposite sign" in said(lambda w, k: -w)
    assert "shifted by one position along the last axis" in said(
        lambda w, k: np.concatenate([w[..., :1], w[..., :-1]], axis=-1))
    assert "right except the first position along the second-to-last axis" in said(
        lambda w, k: np.concatenate([w[..., :1, :] * 0, w[..., 1:, :]], axis=-2))
    assert "plus a constant along the last axis" in said(lambda w, k: w - w.max(axis=-1, keepdims=True))
    square = [rng.normal(size=(2, 5, 5)), rng.normal(size=(3, 4, 4))]
    diagonal = [relations.Pair(w + 0.5 * np.eye(w.shape[-1]), w, ()) for w in square]
    assert "right except on the diagonal" in relations.describe(diagonal, 0, names)
    weights = [_softmax(w) for w in wants]
    wrong_axis = [relations.Pair(_softmax(w, axis=-2), s, ()) for w, s in zip(wants, weights)]
    assert "normalised (a softmax?) over the wrong axis" in relations.describe(wrong_axis, 0, names)
    # a factor on one call only is no relation: the other call is right
    mixed = [_pair(wants[0] * 2, wants[0]), _pair(wants[1], wants[1])]
    assert relations.describe(mixed, 0, []) is None or "2" not in relations.describe(mixed, 0, [])
    # a single number is a multiple of any other: no factor is claimed from one
    assert relations.describe([_pair(3.0, 1.5)], 0, []) is None


def test_wrong_where_a_boolean_argument_is_false_names_it():
    rng = np.random.default_rng(1)
    want = rng.normal(size=(2, 3, 4, 5))
    keep = rng.random((2, 5)) < 0.6
    keep[:, 0] = True
    got = np.where(keep[:, None, None, :], want, 0.0)
    message = relations.describe([relations.Pair(got, want, (None, keep))], 0, ["scores", "key_padding"])
    # (one call only: "on every graded call" is not claimed)
    assert message == "it is right except where key_padding is False, where every value differs", message


def test_nan_is_located_and_a_shape_is_related():
    want = np.arange(1.0, 13.0).reshape(3, 4)
    got = want.copy()
    got[1, 2] = np.nan
    said = relations.nonfinite([_pair(got, want)], 0, [])
    assert "NaN where the right value is finite (first at position (1, 2))" in said
    assert "axes are swapped" in relations.shape_relation(want.T.copy(), want)
    assert "summed over that axis" in relations.shape_relation(want.sum(axis=0), want)


# --- calibrated claims (item 4) ------------------------------------------------------------------

def _on_one_call_only(exercise: str, implementation):
    """The catalogued mistake on the first graded call's inputs (recognised by their values),
    the reference elsewhere: a mistake that reproduces one call only."""
    spec = get(exercise)
    first = questions(exercise, public_seed(exercise))[0]

    def fn(*args, **kwargs):
        mine = len(args) == len(first.args) and all(np.array_equal(np.asarray(a), np.asarray(b))
                                                     for a, b in zip(args, first.args))
        return (implementation if mine else spec.reference)(*args, **kwargs)
    return fn


@pytest.mark.parametrize("exercise", ["scaling-scaled_scores", "masking-masked_softmax",
                                      "softmax-stable_softmax"])
def test_a_catalogued_diagnosis_is_never_claimed_when_it_reproduces_only_some_calls(exercise):
    spec = get(exercise)
    mistake = spec.catalogue()[0]
    seed = public_seed(exercise)
    with np.errstate(all="ignore"):
        message = verdict(exercise, seed, answers_of(exercise, _on_one_call_only(exercise, mistake.implementation),
                                                     seed))
    assert message and mistake.diagnosis in message, message
    assert re.search(r"partly like this mistake: .*But that mistake does not give your answers to", message), message


def test_two_mistakes_at_once_are_never_claimed_from_one_call():
    """A pair of knob settings that gives the learner's answer to one call only (the others
    right) is said as "partly like", never as two mistakes at once."""
    exercise = "gpt-next_token_loss"
    name, implementation, both = get(exercise).pairs()[0]
    seed = public_seed(exercise)
    with np.errstate(all="ignore"):
        message = verdict(exercise, seed, answers_of(exercise, _on_one_call_only(exercise, implementation), seed))
    assert message and re.search(r"partly like these: two mistakes at once: .*But they do not give your answers to",
                                 message), message


def test_an_argument_that_tells_the_right_calls_from_the_wrong_ones_is_named():
    rng = np.random.default_rng(2)
    wants = [rng.normal(size=(3, 4)) for _ in range(4)]
    pairs = [relations.Pair(w + (rng.normal(size=w.shape) if causal else 0), w, (None,), (("causal", causal),))
             for w, causal in zip(wants, (True, False, True, False))]
    said = relations.right_on(pairs, ["x"])
    assert said == "; it is wrong exactly on the graded calls where causal is True, right on the others", said


def test_a_not_implemented_error_of_a_library_is_explained_not_taken_for_the_stub():
    """Only the stub's bare NotImplementedError() means "not answered yet"; one a library raises
    for an operation it lacks (with a message) is the learner's error."""
    from grader.checks import CheckFailed, check

    def stub(a, b):
        raise NotImplementedError()

    def unsupported(a, b):
        raise NotImplementedError("the derivative for 'einsum' is not implemented")

    with pytest.raises(CheckFailed, match="not answered yet"):
        check("similarity-dot_product", stub)
    with pytest.raises(CheckFailed) as failure:
        check("similarity-dot_product", unsupported)
    assert "not answered yet" not in str(failure.value) and "is not implemented" in str(failure.value)
