"""Mistake and variant cases of notebook 02's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6).
"""
from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch

from tests.conftest import solution_namespace
from tests.check_cases import shared_tests


@pytest.fixture(scope="module")
def scaling() -> dict:
    """The reference functions of notebook 02 (dot_variance, scaled_scores, ...)."""
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    namespace = solution_namespace("02_scaling")
    plt.close("all")
    return namespace


def stub(*args):
    raise NotImplementedError()


def _t(x):
    return np.swapaxes(x, -1, -2)


def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _scores(q, k):
    return q @ _t(k)


# --- softmax_saturation: learner-style torch code with one thing changed ------------

def _saturation(scores, target, *, dtype=torch.float64, scalar=None, norm=None, dim=-1, max_fn=None):
    """Autograd as the notebook asks, with hooks for the mistakes below."""
    s = torch.as_tensor(scores, dtype=dtype).detach().clone().requires_grad_(True)
    w = torch.softmax(s, dim=dim)
    (scalar(w, s, target) if scalar else w[..., target].sum()).backward()
    grad = s.grad
    max_weight = max_fn(w) if max_fn else w.max(dim=-1).values.detach()
    return max_weight, norm(grad) if norm else grad.norm(dim=-1)


def _saturation_closed_form(scores, target):
    w = _softmax(np.asarray(scores, dtype=np.float32))
    onehot = np.eye(w.shape[-1], dtype=np.float32)[target]
    grad = w[..., target:target + 1] * (onehot - w)
    return w.max(axis=-1), np.linalg.norm(grad, axis=-1)


def _saturation_autograd_grad(scores, target):
    s = torch.tensor(scores, dtype=torch.float64, requires_grad=True)
    w = torch.nn.functional.softmax(s, dim=-1)
    (grad,) = torch.autograd.grad(w[..., target].sum(), s)
    return [torch.amax(w, dim=-1).detach(), torch.linalg.vector_norm(grad, dim=-1)]


def _saturation_row_by_row(scores, target):
    """One backward pass per row, as a learner who does not trust the sum trick would."""
    flat = torch.as_tensor(scores, dtype=torch.float64).reshape(-1, scores.shape[-1])
    max_weights, norms = [], []
    for row in flat:
        s = row.clone().requires_grad_(True)
        w = torch.softmax(s, dim=0)
        w[target].backward()
        max_weights.append(w.max().item())
        norms.append(s.grad.norm().item())
    shape = scores.shape[:-1]
    return np.array(max_weights).reshape(shape), np.array(norms).reshape(shape)


# --- self_attention_weights ---------------------------------------------------------

def _attention(x, w_q, w_k, scale=None, after=None, axis=-1, keys_from=None, transpose=False, softmax=True):
    d_k = w_q.shape[-1]
    scores = _scores(x @ w_q, x @ (keys_from if keys_from is not None else w_k))
    if transpose:
        scores = _t(scores)
    scores = scores / (np.sqrt(d_k) if scale is None else scale(x, w_q))
    if not softmax:
        return scores
    weights = _softmax(scores, axis=axis)
    return weights / after(x, w_q) if after else weights


def _torch_attention(x, w_q, w_k):
    x, w_q, w_k = (torch.as_tensor(a, dtype=torch.float32) for a in (x, w_q, w_k))
    q, k = x @ w_q, x @ w_k
    return torch.nn.functional.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)


def _einsum_attention(x, w_q, w_k):
    q = np.einsum("...sd,dk->...sk", x, w_q) * w_q.shape[-1] ** -0.5   # scale the queries first
    scores = np.einsum("...qk,...sk->...qs", q, x @ w_k)
    e = np.exp(scores)
    return e / e.sum(axis=-1, keepdims=True)


def _weights_implicit_dim(x, w_q, w_k):
    # torch code with the softmax's dim left out: right on one sentence, dim 0 on a batch
    q, k = torch.as_tensor(x) @ torch.as_tensor(w_q), torch.as_tensor(x) @ torch.as_tensor(w_k)
    return torch.nn.functional.softmax(q @ k.transpose(-2, -1) / math.sqrt(w_q.shape[-1]))


def _weights_no_keepdims(x, w_q, w_k):
    scores = (x @ w_q) @ np.swapaxes(x @ w_k, -1, -2) / np.sqrt(w_q.shape[-1])
    e = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1)  # keepdims forgotten: (seq,) broadcasts along the rows


MISTAKES = {
    "scaling-dot_variance": [
        (lambda q, k: np.var(np.sum(q * k, -1), ddof=1), "sample variance (ddof=1"),
        (lambda q, k: torch.var((torch.as_tensor(q) * torch.as_tensor(k)).sum(-1)), "sample variance (ddof=1"),
        (lambda q, k: np.std(np.sum(q * k, -1)), "standard deviation"),
        (lambda q, k: np.mean(np.sum(q * k, -1) ** 2), "does not subtract the mean"),
        (lambda q, k: np.mean(np.sum(q * k, -1)), "returns the mean"),
        (lambda q, k: np.var(q * k), "variance of the single products"),
        (lambda q, k: np.var(np.sum(q * k, axis=0)), "sums over the n samples (axis 0)"),
        (lambda q, k: np.var(q * k, axis=0), "one variance per coordinate"),
        (lambda q, k: np.var(q * k, axis=0).sum(), "adds up one variance per coordinate"),
        (lambda q, k: np.var(q * k, axis=-1), "one variance per pair of vectors"),
        (lambda q, k: np.var(q @ k.T), "pairs every q with every k"),
        (lambda q, k: "16.0", "should be a numpy array or torch tensor"),
        (stub, "not answered yet"),
    ],
    "scaling-scaled_scores": [
        (lambda q, k: _scores(q, k), "unscaled"),
        (lambda q, k: _scores(q, k) / q.shape[-1], "divides by d_k; divide by its square root"),
        (lambda q, k: _scores(q, k) * np.sqrt(q.shape[-1]), "multiplies by sqrt(d_k)"),
        (lambda q, k: _scores(q, k) / np.sqrt(q.shape[-2]), "number of queries"),
        (lambda q, k: _scores(q, k) / np.sqrt(k.shape[-2]), "number of keys"),
        (lambda q, k: _scores(k, q) / np.sqrt(q.shape[-1]), "computes K Q^T"),
        (lambda q, k: q @ k.T / np.sqrt(q.shape[-1]), "transpose only the last two axes"),
        (lambda q, k: _softmax(_scores(q, k) / np.sqrt(q.shape[-1])), "applies the softmax"),
        (lambda q, k: _scores(q, k) / np.sqrt(q.shape[1]), "off by a constant factor"),
        (stub, "not answered yet"),
    ],
    "scaling-softmax_saturation": [
        (lambda s, t: _saturation(s, t, scalar=lambda w, s_, t_: w.sum()), "0 everywhere"),
        (lambda s, t: _saturation(s, t, scalar=lambda w, s_, t_: w[t_].sum()), "0 everywhere"),
        (lambda s, t: _saturation(s, t, scalar=lambda w, s_, t_: w.max(dim=-1).values.sum()),
         "differentiates the largest weight"),
        (lambda s, t: _saturation(s, t, scalar=lambda w, s_, t_: torch.log(w[..., t_]).sum()),
         "log w[..., target]"),
        (lambda s, t: _saturation(s, t, scalar=lambda w, s_, t_: s_[..., t_].sum()), "norm is 1 for every row"),
        (lambda s, t: _saturation(s, t, scalar=lambda w, s_, t_: w[..., t_ - 1].sum()), "wrong key"),
        (lambda s, t: _saturation(s, t, norm=lambda g: (g ** 2).sum(-1)), "squared norm"),
        (lambda s, t: _saturation(s, t, norm=lambda g: g.abs().sum(-1)), "L1 norm"),
        (lambda s, t: _saturation(s, t, norm=lambda g: g), "the gradient itself"),
        (lambda s, t: _saturation(s, t, norm=lambda g: g.norm()), "one number for the whole batch"),
        (lambda s, t: _saturation(s, t, max_fn=lambda w: w.max(dim=-1)), "(values, indices)"),
        (lambda s, t: _saturation(s, t, max_fn=lambda w: w.argmax(dim=-1)), "index of the largest weight"),
        (lambda s, t: _saturation(s, t, max_fn=lambda w: torch.as_tensor(s).max(dim=-1).values),
         "largest score"),
        (lambda s, t: _saturation(s, t, max_fn=lambda w: w.max()), "one maximum for the whole batch"),
        (lambda s, t: _saturation(s, t, dim=0), "softmax over the wrong axis"),
        (lambda s, t: _saturation(s, t)[1], "should return a tuple (max_weight, grad_norm)"),
        (stub, "not answered yet"),
    ],
    "scaling-self_attention_weights": [
        (_weights_implicit_dim, "an implicit dim"),
        (_weights_no_keepdims, "each row is divided by another row's sums"),
        (lambda x, q, k: _attention(x, q, k, scale=lambda x_, w: np.sqrt(x_.shape[-1])), "sqrt(d_model)"),
        (lambda x, q, k: _attention(x, q, k, scale=lambda x_, w: np.sqrt(w.shape[0])), "sqrt(d_model)"),
        (lambda x, q, k: _attention(x, q, k, scale=lambda x_, w: x_.shape[-1]), "divides by d_model"),
        (lambda x, q, k: _attention(x, q, k, scale=lambda x_, w: w.shape[-1]), "divides the scores by d_k"),
        (lambda x, q, k: _softmax(_scores(x @ q / q.shape[-1] ** 0.5, x @ k / q.shape[-1] ** 0.5)),
         "scale both Q and K"),
        (lambda x, q, k: _attention(x, q, k, scale=lambda x_, w: 1.0), "does not scale"),
        (lambda x, q, k: _attention(x, q, k, scale=lambda x_, w: 1.0, after=lambda x_, w: np.sqrt(w.shape[-1])),
         "scales after the softmax"),
        (lambda x, q, k: _attention(x, q, k, scale=lambda x_, w: 1.0, after=lambda x_, w: w.shape[-1]),
         "never the weights after it"),
        (lambda x, q, k: _attention(x, q, k, axis=-2), "query axis"),
        (lambda x, q, k: _attention(x, q, k, transpose=True), "computes K Q^T"),
        (lambda x, q, k: _attention(x, q, k, keys_from=q), "uses w_q for the keys"),
        (lambda x, q, k: _attention(x, q, k, softmax=False), "returns the scaled scores"),
        (stub, "not answered yet"),
    ],
}


VARIANTS = {
    "scaling-dot_variance": [
        lambda q, k: np.var(np.einsum("nd,nd->n", q, k)),
        lambda q, k: float(np.var(np.sum(q * k, axis=1))),
        lambda q, k: np.var(np.sum(q.astype(np.float32) * k.astype(np.float32), -1)),
        lambda q, k: torch.var((torch.as_tensor(q) * torch.as_tensor(k)).sum(-1), correction=0),
        lambda q, k: (q * k).sum(dim=-1).var(correction=0),   # torch-only code: retried with tensors
        lambda q, k: (lambda s: ((s - s.mean()) ** 2).mean())((q * k).sum(-1)),
    ],
    "scaling-scaled_scores": [
        lambda q, k: np.einsum("...qd,...kd->...qk", q, k) * q.shape[-1] ** -0.5,
        lambda q, k: np.matmul(q.astype(np.float32), _t(k).astype(np.float32)) / np.float32(np.sqrt(q.shape[-1])),
        lambda q, k: (torch.as_tensor(q, dtype=torch.float32) @ torch.as_tensor(k, dtype=torch.float32).transpose(-2, -1)
                      / math.sqrt(q.shape[-1])),
        lambda q, k: (q / np.sqrt(q.shape[-1])) @ _t(k),
        lambda q, k: (q * q.shape[-1] ** -0.25) @ _t(k * k.shape[-1] ** -0.25),
    ],
    "scaling-softmax_saturation": [
        lambda s, t: _saturation(s, t),
        lambda s, t: _saturation(s, t, dtype=torch.float32),
        _saturation_closed_form,
        _saturation_autograd_grad,
        _saturation_row_by_row,
    ],
    "scaling-self_attention_weights": [
        lambda x, q, k: _attention(x, q, k),
        _torch_attention,
        _einsum_attention,
        lambda x, q, k: _attention(x.astype(np.float32), q.astype(np.float32), k.astype(np.float32)),
    ],
}


globals().update(shared_tests("scaling", MISTAKES, VARIANTS, solutions="scaling"))


def test_reference_functions_do_what_the_notebook_claims(scaling):
    """The notebook's numbers: Var(q.k) ~ d_k, scaled ~ 1, saturation without scaling."""
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((3000, 256)), rng.standard_normal((3000, 256))
    assert 230 < float(scaling["dot_variance"](q, k)) < 280
    scaled = scaling["scaled_scores"](q[:, None, :], k[:, None, :])
    assert 0.9 < np.var(scaled) < 1.1
    raw = rng.standard_normal((200, 16)) * np.sqrt(1024)
    max_raw, grad_raw = scaling["softmax_saturation"](raw, 0)
    max_scaled, grad_scaled = scaling["softmax_saturation"](raw / np.sqrt(1024), 0)
    assert max_raw.mean() > 0.9 > 0.5 > max_scaled.mean()
    assert np.median(grad_raw.numpy()) < 1e-6 < 1e-2 < np.median(grad_scaled.numpy())


def test_saturation_does_not_change_the_learners_input(scaling):
    """A torch tensor passed in keeps requires_grad False and its values."""
    scores = torch.tensor([[1.0, 2.0, 0.5]])
    scaling["softmax_saturation"](scores, 2)
    assert not scores.requires_grad and scores.grad is None
    assert torch.equal(scores, torch.tensor([[1.0, 2.0, 0.5]]))
