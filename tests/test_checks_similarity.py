"""Mistake and variant cases of notebook 01's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grader.checks import check
from tests.check_cases import shared_tests


def stub(*args):
    raise NotImplementedError()


class EqualsAnything:
    def __eq__(self, other):
        return True

    def __array__(self, *args, **kwargs):
        return np.zeros(())


def _norm(x):
    return np.linalg.norm(x, axis=-1)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _lookup_implicit_dim(scores, values):
    # torch code with the softmax's dim left out: dim 0 (the batch) of 3-D scores
    weights = torch.nn.Softmax()(torch.as_tensor(scores))
    return weights @ torch.as_tensor(values), weights


MISTAKES = {
    "similarity-dot_product": [
        (lambda a, b: a * b, "element-wise products"),
        (lambda a, b: np.sum(a * b), "sums over every axis"),
        (lambda a, b: np.sum(a * b, axis=0), "sums over the first axis"),
        (lambda a, b: _norm(a) * _norm(b), "lengths only"),
        (lambda a, b: a @ np.swapaxes(b, -1, -2) if a.ndim > 1 else a @ b, "pairs every vector of a with every vector of b"),
        (lambda a, b: np.dot(a, b), "raised ValueError"),
        (lambda a, b: EqualsAnything(), "should be a numpy array or torch tensor"),
        (lambda a, b: "12.0", "should be a numpy array or torch tensor"),
        (stub, "not answered yet"),
    ],
    "similarity-cosine_similarity": [
        (lambda a, b, eps=1e-8: np.sum(a * b, -1), "plain dot product"),
        (lambda a, b, eps=1e-8: np.sum(a * b, -1) / _norm(a), "divides by |a| only"),
        (lambda a, b, eps=1e-8: np.sum(a * b, -1) / (np.sum(a * a, -1) * np.sum(b * b, -1)), "squared lengths"),
        (lambda a, b, eps=1e-8: np.sum(a * b, -1) / (np.linalg.norm(a) * np.linalg.norm(b)), "length of the whole array"),
        (lambda a, b, eps=1e-8: np.sum(a * b, -1) / (_norm(a) * _norm(b)), "should be 0.0"),
        (stub, "not answered yet"),
    ],
    "similarity-score_matrix": [
        (lambda q, k: k @ np.swapaxes(q, -1, -2), "keys @ queries^T"),
        (lambda q, k: q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1]), "scales the scores"),
        (lambda q, k: q @ k.T, "fails on a batch"),
        (lambda q, k: (q / _norm(q)[..., None]) @ np.swapaxes(k / _norm(k)[..., None], -1, -2), "normalizes the vectors"),
        (stub, "not answered yet"),
    ],
    "similarity-soft_lookup": [
        (_lookup_implicit_dim, "an implicit dim"),
        (lambda s, v: (lambda w: (w @ v, w))(np.exp(s) / np.exp(s).sum()), "over the whole array at once"),
        (lambda s, v: (lambda e: (e / e.sum(-1) @ v, e / e.sum(-1)))(np.exp(s - s.max(-1, keepdims=True))),
         "keepdims=True forgotten"),
        (lambda s, v: (_softmax(s, -2) @ v, _softmax(s, -2)), "each column sums to 1"),
        (lambda s, v: ((s / s.sum(-1, keepdims=True)) @ v, s / s.sum(-1, keepdims=True)), "without exponentiating"),
        (lambda s, v: ((s == s.max(-1, keepdims=True)) @ v, (s == s.max(-1, keepdims=True)) * 1.0), "hard lookup"),
        (lambda s, v: (s @ v, s), "returns the scores themselves"),
        (lambda s, v: (s @ v, _softmax(s)), "averages the values with the raw scores"),
        (lambda s, v: _softmax(s) @ v, "should return a tuple (output, weights)"),
        (stub, "not answered yet"),
    ],
}


def _loop_dot(a, b):
    total = 0.0
    for i in range(a.shape[-1]):
        total = total + a[..., i] * b[..., i]
    return total


def _torch_soft_lookup(s, v):
    w = torch.softmax(torch.as_tensor(s, dtype=torch.float32), dim=-1)
    return w @ torch.as_tensor(v, dtype=torch.float32), w


VARIANTS = {
    "similarity-dot_product": [
        _loop_dot,
        lambda a, b: np.einsum("...i,...i->...", a, b),
        lambda a, b: np.vecdot(a, b),
        lambda a, b: (a.astype(np.float32) * b.astype(np.float32)).sum(-1),
        lambda a, b: (torch.as_tensor(a) * torch.as_tensor(b)).sum(-1),
        lambda a, b: (a * b).sum(dim=-1),  # torch-only code: the check retries with tensors
    ],
    "similarity-cosine_similarity": [
        lambda a, b, eps=1e-8: np.sum(a * b, -1) / (_norm(a) * _norm(b) + eps),
        lambda a, b, eps=1e-8: np.sum(a / np.maximum(_norm(a), eps)[..., None] * b / np.maximum(_norm(b), eps)[..., None], -1),
        lambda a, b, eps=1e-8: torch.nn.functional.cosine_similarity(torch.as_tensor(a), torch.as_tensor(b), dim=-1, eps=eps),
    ],
    "similarity-score_matrix": [
        lambda q, k: np.einsum("...qd,...kd->...qk", q, k),
        lambda q, k: torch.as_tensor(q) @ torch.as_tensor(k).transpose(-2, -1),
        lambda q, k: np.matmul(q.astype(np.float32), np.swapaxes(k, -1, -2).astype(np.float32)),
    ],
    "similarity-soft_lookup": [
        lambda s, v: (np.exp(s) / np.exp(s).sum(-1, keepdims=True) @ v, np.exp(s) / np.exp(s).sum(-1, keepdims=True)),
        _torch_soft_lookup,
        lambda s, v: [_softmax(s) @ v, _softmax(s)],
    ],
}


globals().update(shared_tests("similarity", MISTAKES, VARIANTS, solutions="similarity"))


def test_checks_do_not_modify_or_trust_learner_inputs(similarity):
    """A function that changes its inputs in place is judged on what it returns."""
    def in_place(scores, values):
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        return scores @ values, scores
    check("similarity-soft_lookup", in_place)


def test_unknown_exercise_is_a_clear_error():
    with pytest.raises(LookupError, match="no check registered"):
        check("similarity-nonexistent", stub)
    with pytest.raises(LookupError, match="no checks for topic"):
        check("nosuchtopic-x", stub)
