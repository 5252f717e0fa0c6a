"""Mistake and variant cases of notebook 04's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from grader.checks import check
from tests.conftest import solution_namespace
from tests.check_cases import _verdict_for_seed, shared_tests
from tests.scope import student_seeds

# The mistakes overflow and divide by zero on purpose.
pytestmark = [pytest.mark.filterwarnings("ignore::RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")]


@pytest.fixture(scope="module")
def softmax_notebook() -> dict:
    """The reference functions of notebook 04 (stable_softmax, softmax_with_temperature, ...)."""
    return solution_namespace("04_softmax")


def stub(*args, **kwargs):
    raise NotImplementedError()


def _swap(x):
    return np.swapaxes(x, -1, -2)


def _softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ---------------------------------------------------------------- stable_softmax

def _torch_naive_float32(x, axis=-1):
    e = torch.exp(torch.as_tensor(x, dtype=torch.float32))
    return e / e.sum(dim=axis, keepdim=True)


def _log_sum_exp(x, axis=-1):
    m = np.max(x, axis=axis, keepdims=True)
    return np.exp(x - m - np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True)))


def _moveaxis(x, axis=-1):
    """Move the axis to the end, softmax there, move it back."""
    y = np.moveaxis(x, axis, -1).astype(np.float32)
    y = np.exp(y - y.max(-1)[..., None])
    return np.moveaxis(y / y.sum(-1)[..., None], -1, axis)


def _torch_manual(x, axis=-1):
    shifted = x - x.max(dim=axis, keepdim=True).values
    return shifted.exp() / shifted.exp().sum(dim=axis, keepdim=True)


# ---------------------------------------------------------------- temperature

def _t(fn):
    """A temperature softmax that validates T as the docstring asks, then applies ``fn``."""
    def with_temperature(scores, temperature):
        if temperature <= 0:
            raise ValueError("temperature must be positive")
        return fn(scores, temperature)
    return with_temperature


def _t_no_check(scores, temperature):
    return _softmax(scores / temperature)


def _t_power(scores, temperature):
    """softmax(s)**(1/T), normalized again, is softmax(s / T): valid."""
    if temperature <= 0:
        raise ValueError("temperature must be positive")
    w = _softmax(scores) ** (1.0 / temperature)
    return w / w.sum(-1, keepdims=True)


def _t_torch_float32(scores, temperature):
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    return torch.softmax(torch.as_tensor(scores, dtype=torch.float32) / temperature, dim=-1)


# ---------------------------------------------------------------- attention

def _att(divisor=None, fill=-np.inf, axis=-1, when="before", invert=False, use_mask=True, swap=False):
    """A numpy attention with knobs for the mistakes learners make."""
    def attention(query, key, value, mask=None):
        d_k = query.shape[-1]
        scores = query @ _swap(key)
        if when != "after":
            scores = scores / (math.sqrt(d_k) if divisor is None else divisor)
        if mask is not None and use_mask and when != "mask_after":
            scores = np.where(~mask if invert else mask, scores, fill)
        weights = _softmax(scores, axis)
        if when == "after":
            weights = weights / math.sqrt(d_k)
        if mask is not None and when == "mask_after":
            weights = weights * mask
        output = weights @ value
        return (weights, output) if swap else (output, weights)
    return attention


def _att_one_minus(query, key, value, mask=None):
    scores = query @ _swap(key) / np.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores + (1 - mask) * -1e9
    w = _softmax(scores)
    return w @ value, w


def _att_torch_transpose(query, key, value, mask=None):
    """PyTorch code reading d_k from .shape: on numpy, key.transpose(-2, -1) raises ValueError,
    and the probe calls it again with tensors."""
    d_k = query.shape[-1]
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _att_torch(query, key, value, mask=None):
    """PyTorch, float32, masked_fill with a large negative number, d_k**-0.5."""
    query, key, value = (t.float() for t in (query, key, value))
    scores = query @ key.transpose(-2, -1) * query.size(-1) ** -0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, -1e9)
    weights = scores.softmax(dim=-1)
    return weights @ value, weights


def _att_einsum(query, key, value, mask=None):
    """einsum, float32, an additive mask of 0 and -inf, the learner's own stable softmax."""
    query, key, value = (np.asarray(a, dtype=np.float32) for a in (query, key, value))
    scores = np.einsum("...qd,...kd->...qk", query, key) / np.sqrt(np.float32(query.shape[-1]))
    if mask is not None:
        scores = scores + np.where(mask, 0.0, -np.inf).astype(np.float32)
    weights = _log_sum_exp(scores)
    return np.einsum("...qk,...kv->...qv", weights, value), weights


def _att_temperature(query, key, value, mask=None):
    """Attention as a temperature softmax with T = sqrt(d_k), filled with finfo.min."""
    scores = query @ _swap(key)
    if mask is not None:
        scores = np.where(mask, scores, np.finfo(scores.dtype).min)
    with np.errstate(over="ignore"):
        weights = _t_no_check(scores, math.sqrt(query.shape[-1]))
    return [weights @ value, weights]


def _att_mask_after_renormalized(query, key, value, mask=None):
    """Zeroing masked weights after the softmax and renormalizing is the same softmax: valid."""
    w = _softmax(query @ _swap(key) / np.sqrt(query.shape[-1]))
    if mask is not None:
        w = w * mask
        w = w / w.sum(-1, keepdims=True)
    return w @ value, w


def _att_torch_builtin(query, key, value, mask=None):
    """PyTorch's own function for the output, the weights computed beside it."""
    import torch.nn.functional as F
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    return output, torch.softmax(scores, dim=-1)


def _att_torch_masked_bias(query, key, value, mask=None):
    """PyTorch attention with the fill of GPT-2's masked_bias (-1e4), float32."""
    query, key, value = (torch.as_tensor(a, dtype=torch.float32) for a in (query, key, value))
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), -1e4)
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def _att_torch_finfo(query, key, value, mask=None):
    """PyTorch attention, float32, masked with torch.finfo(dtype).min (as Hugging Face does now)."""
    query, key, value = (torch.as_tensor(a, dtype=torch.float32) for a in (query, key, value))
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


# The mistakes of grader/checks/softmax.py's catalogue are asserted by tests/test_catalogue.py;
# these are the others (torch code, stubs, and implementations the catalogue does not hold).
MISTAKES = {
    "softmax-stable_softmax": [
        (_torch_naive_float32, "exp overflows"),
        (lambda x, axis=-1: np.log(_softmax(x, axis)), "log-probabilities"),
        (stub, "not answered yet"),
    ],
    "softmax-softmax_with_temperature": [
        (stub, "not answered yet"),
    ],
    "softmax-scaled_dot_product_attention": [
        (_att(fill=np.inf), "NaN in exactly the rows that mask a key"),
        (lambda q, k, v, mask=None: _att()(q, k, v, None if mask is None else np.squeeze(mask)),
         "without reshaping or squeezing it"),
        (_att(fill=-1e4), "of order -1e4 (GPT-2's masked_bias is -1e4)"),
        (_att_torch_masked_bias, "of order -1e4 (GPT-2's masked_bias is -1e4)"),
        (_att(fill=-1e6), "of order -1e6"),
        (_att(fill=-200.0), "filled with a finite number (such as -1e4"),
        (_att(use_mask=False), "ignores the mask"),
        (_att(invert=True), "the mask is inverted"),
        (_att(invert=True, fill=-1e9), "the mask is inverted"),
        (_att(fill=0.0), "sets the masked scores to 0"),
        (_att(when="mask_after"), "masks after the softmax"),
        (_att(divisor=1.0), "does not scale the scores"),
        (lambda q, k, v, mask=None: _att(divisor=q.shape[-1])(q, k, v, mask), "divides the scores by d_k;"),
        (lambda q, k, v, mask=None: _att(divisor=q.shape[-1] ** -0.5)(q, k, v, mask), "multiplies the scores by sqrt(d_k)"),
        (_att(when="after"), "scales after the softmax"),
        (lambda q, k, v, mask=None: _att(divisor=math.sqrt(v.shape[-1]))(q, k, v, mask), "sqrt(d_v = 7)"),
        (lambda q, k, v, mask=None: _att(divisor=math.sqrt(k.shape[-2]))(q, k, v, mask), "sqrt(k_len = 5)"),
        (lambda q, k, v, mask=None: _att(divisor=math.sqrt(q.shape[-2]))(q, k, v, mask), "sqrt(q_len = 4)"),
        (lambda q, k, v, mask=None: _att(divisor=math.sqrt(q.shape[1] * q.shape[-1]))(q, k, v, mask), "sqrt(d_model = h * d_k = 18)"),
        (lambda q, k, v, mask=None: _att(divisor=q.shape[1] * q.shape[-1])(q, k, v, mask), "divides the scores by d_model = h * d_k = 18;"),
        (_att(axis=-2), "over the query axis"),
        (_att(axis=1), "over axis 1 (heads)"),
        (_att(swap=True), "returns (weights, output)"),
        (lambda q, k, v, mask=None: _att()(q, k, v, mask)[0], "should return a tuple (output, weights)"),
        (lambda q, k, v, mask=None: (lambda o, w: (o / math.sqrt(q.shape[-1]), w))(*_att()(q, k, v, mask)),
         "divides the output by sqrt(d_k)"),
        (lambda q, k, v, mask=None: q @ k.T, "key.T reverses every axis"),
        (stub, "not answered yet"),
    ],
}

VARIANTS = {
    "softmax-stable_softmax": [
        _softmax,
        _log_sum_exp,
        _moveaxis,
        _torch_manual,  # torch-only code: the check retries with tensors
        lambda x, axis=-1: torch.softmax(torch.as_tensor(x, dtype=torch.float32), dim=axis),
        lambda x, axis=-1: np.exp(x - np.logaddexp.reduce(x, axis=axis, keepdims=True)),
    ],
    "softmax-softmax_with_temperature": [
        _t(lambda s, t: _softmax(s / t)),
        _t(lambda s, t: _softmax(s * (1.0 / t))),
        _t_power,
        _t_torch_float32,
    ],
    "softmax-scaled_dot_product_attention": [
        _att(),
        _att(fill=-1e9),
        _att(fill=-1e30),
        _att_torch,
        _att_torch_transpose,
        _att_einsum,
        _att_temperature,
        _att_mask_after_renormalized,
        _att_one_minus,  # 1 - mask works on numpy bools (an int array) and -1e9 is far enough
        _att_torch_builtin,
        _att_torch_finfo,
    ],
}


globals().update(shared_tests("softmax", MISTAKES, VARIANTS, solutions="softmax_notebook", seeds=40))


def test_reference_attention_matches_pytorch(softmax_notebook):
    """The notebook's claim: the reference equals torch's built-in, masks included (True = attend)."""
    import torch.nn.functional as F

    attention = softmax_notebook["scaled_dot_product_attention"]
    rng = np.random.default_rng(4)
    q, k, v = rng.normal(size=(2, 3, 5, 6)), rng.normal(size=(2, 3, 5, 6)), rng.normal(size=(2, 3, 5, 7))
    for mask in [None, np.tril(np.ones((5, 5), dtype=bool))]:
        output, _ = attention(q, k, v, mask=mask)
        expected = F.scaled_dot_product_attention(*(torch.as_tensor(a) for a in (q, k, v)),
                                                  attn_mask=None if mask is None else torch.as_tensor(mask))
        np.testing.assert_allclose(output, expected.numpy(), rtol=1e-6, atol=1e-9)


def test_checks_do_not_trust_inputs_changed_in_place():
    def in_place(x, axis=-1):
        x -= x.max(axis=axis, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(axis=axis, keepdims=True)
        return x
    check("softmax-stable_softmax", in_place)


@pytest.mark.parametrize("fill", [-1e3, -1e4, -65504.0, -1e5, -1e7, -2e8])
def test_every_seed_rejects_a_finite_fill_that_real_scores_go_below(fill):
    """Attention whose masked scores get a finite fill above some real scores (GPT-2's
    masked_bias, -1e4, and the whole kind up to -2e8) is rejected on every seed, with a
    diagnosis that names a finite fill; -1e9, -1e30, finfo.min and -inf pass (VARIANTS)."""
    for seed in student_seeds(10):
        message = _verdict_for_seed("softmax-scaled_dot_product_attention", _att(fill=fill), seed)
        assert message and "filled with a finite number" in message, (seed, message)
