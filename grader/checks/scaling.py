"""Hidden checks of notebook 02, scaling.

Sizes are pairwise distinct (batch 2, heads 3, queries 4, keys 5, d_k 6; d_model 7
against d_k 3) so that a swapped axis either raises or shows, and dividing by the
size of the wrong axis gives a different number. Inputs are random, so no tie hides
a mistake, and the dot products of ``dot_variance`` have a mean well away from 0, so
that forgetting to subtract it shows. ``softmax_saturation`` gets rows from mild to
saturated and two different target keys, neither the first nor always the last, so a
hard-wired or off-by-one key shows; its reference is the closed form
d w_t / d s_j = w_t (delta_tj - w_j), so autograd and the formula both pass.
"""
from __future__ import annotations

import numpy as np

from ._core import CheckFailed, Question, exercise, judge, to_array, value


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("...d,...d->...", a, b)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _t(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, -1, -2)


def _proportional(got: np.ndarray, expected: np.ndarray) -> bool:
    """``got`` is a constant multiple (not 1) of ``expected``."""
    if got.shape != expected.shape or not np.all(np.isfinite(got)):
        return False
    flat_e, flat_g = expected.ravel(), got.ravel()
    factor = flat_g @ flat_e / (flat_e @ flat_e)
    return not np.isclose(factor, 1.0) and np.allclose(got, factor * expected, rtol=1e-4, atol=1e-5)


@exercise("scaling-dot_variance", "dot_variance")
def dot_variance_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for n, d_k in [(7, 6), (5, 9)]:
        # Shifted entries: the dot products have a mean far from 0.
        q = rng.normal(loc=0.6, size=(n, d_k))
        k = rng.normal(loc=0.4, scale=1.5, size=(n, d_k))
        s = _dot(q, k)
        what = f"dot_variance(q, k) for q and k of shape (n, d_k) = ({n}, {d_k})"
        mistakes = [
            ("it is the sample variance (ddof=1, what torch.var and Tensor.var compute by "
             "default); the docstring asks for the population variance, ddof=0: np.var(s) or "
             "torch.var(s, correction=0)", np.var(s, ddof=1)),
            ("it returns the standard deviation; the variance is its square", np.std(s)),
            ("it does not subtract the mean of the dot products: the variance is the mean of "
             "(s - mean(s))**2, not the mean of s**2", np.mean(s ** 2)),
            ("it returns the mean of the dot products; return their variance", np.mean(s)),
            ("it takes the variance of the single products q[i, j] * k[i, j]; first add them up "
             "over the last axis (one dot product per pair of rows), then take the variance of "
             "those n numbers", np.var(q * k)),
            ("it takes the variance over the wrong axis: it sums over the n samples (axis 0) and "
             "takes the variance across the d_k coordinates. Sum over the last axis (the d_k "
             "entries of each vector), then take the variance over the n dot products",
             np.var(np.sum(q * k, axis=0))),
            ("it takes the variance over the wrong axis: one variance per coordinate (axis 0 of "
             "q * k). Take the dot product of each pair of rows first, then one variance over "
             "the n dot products", np.var(q * k, axis=0)),
            ("it adds up one variance per coordinate (the variance of a sum equals the sum of "
             "the variances only in expectation, for independent terms); take the dot products "
             "first, then the variance of those n numbers", np.sum(np.var(q * k, axis=0))),
            ("it takes the variance over the wrong axis: one variance per pair of vectors, over "
             "its d_k products. Add the products up to one dot product per pair, then take the "
             "variance over the n pairs", np.var(q * k, axis=-1)),
            ("it pairs every q with every k (q @ k.T, n * n dot products); pair row i of q with "
             "row i of k only", np.var(q @ k.T)),
        ]
        asked.append(Question((q, k), lambda got, s=s, what=what, mistakes=mistakes:
                              judge(got, np.var(s), what, mistakes)))
    return asked


@exercise("scaling-scaled_scores", "scaled_scores")
def scaled_scores_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for q_shape, k_shape in [((4, 9), (5, 9)), ((2, 3, 4, 6), (2, 3, 5, 6))]:
        queries, keys = rng.normal(size=q_shape), rng.normal(size=k_shape)

        def verify(got, queries=queries, keys=keys, q_shape=q_shape, k_shape=k_shape) -> None:
            what = f"scaled_scores(queries, keys) for queries {q_shape} and keys {k_shape}"
            try:
                value(got, "scaled_scores")
            except CheckFailed as error:
                if len(q_shape) > 2:
                    raise CheckFailed(
                        f"{error}. It fails with batch and head axes in front: transpose only "
                        "the last two axes of keys (np.swapaxes(keys, -1, -2) or "
                        "keys.transpose(-2, -1) in torch); keys.T reverses every axis") from None
                raise
            d_k = queries.shape[-1]
            raw = queries @ _t(keys)
            expected = raw / np.sqrt(d_k)
            judge(got, expected, what, mistakes=[
                ("it returns Q K^T unscaled; divide by sqrt(d_k), with d_k = queries.shape[-1]", raw),
                ("it divides by d_k; divide by its square root, sqrt(d_k) (or multiply by "
                 "d_k**-0.5)", raw / d_k),
                ("it multiplies by sqrt(d_k); divide by it", raw * np.sqrt(d_k)),
                ("it divides by the square root of the number of queries (queries.shape[-2]); "
                 "d_k is the size of the last axis, queries.shape[-1]", raw / np.sqrt(queries.shape[-2])),
                ("it divides by the square root of the number of keys (keys.shape[-2]); d_k is "
                 "the size of the last axis, queries.shape[-1]", raw / np.sqrt(keys.shape[-2])),
                ("it computes K Q^T, so row i belongs to key i; row i must hold query i's scores "
                 "against every key: Q K^T, transposing the last two axes of keys",
                 _t(expected)),
                ("it applies the softmax; scaled_scores returns the scaled scores, before any "
                 "softmax", _softmax(expected)),
            ], hints=[lambda x: "it is off by a constant factor: divide Q K^T by sqrt(d_k), "
                      "d_k = queries.shape[-1], the length of each query and key vector"
                      if _proportional(x, expected) else None])

        asked.append(Question((queries, keys), verify))
    return asked


def _weights_and_grad(scores: np.ndarray, target: int) -> tuple[np.ndarray, np.ndarray]:
    """softmax over the last axis and the gradient of w[..., target] w.r.t. the scores."""
    w = _softmax(scores)
    onehot = np.zeros(scores.shape[-1])
    onehot[target] = 1.0
    return w, w[..., target:target + 1] * (onehot - w)


@exercise("scaling-softmax_saturation", "softmax_saturation")
def softmax_saturation_questions(rng: np.random.Generator) -> list[Question]:
    # A batch of rows from mild to saturated (each row its own spread of scores), then
    # one plain row: a target hard-wired to one key, or an axis mix-up, shows.
    batch = rng.normal(size=(2, 3, 5)) * np.array([0.3, 1.0, 2.0, 4.0, 8.0, 25.0]).reshape(2, 3, 1)
    row = rng.normal(scale=1.5, size=6)
    return [Question((batch, 1), lambda got: _verify_saturation(got, batch, 1)),
            Question((row, 4), lambda got: _verify_saturation(got, row, 4))]


def _verify_saturation(got: object, scores: np.ndarray, target: int) -> None:
    name = f"softmax_saturation(scores, target) for scores of shape {scores.shape}"
    got = value(got, "softmax_saturation")
    if not isinstance(got, tuple) or len(got) != 2:
        kind = f"a tuple of {len(got)} items" if isinstance(got, tuple) else "one array"
        raise CheckFailed(f"{name} should return a tuple (max_weight, grad_norm), but it returns {kind}")
    max_weight, grad_norm = got
    if isinstance(max_weight, tuple):
        raise CheckFailed(f"max_weight of {name} is a pair of arrays: torch's max(dim=...) returns "
                          "(values, indices); return the values (.values)")
    w, grad = _weights_and_grad(scores, target)
    rows = scores.shape[:-1]
    max_mistakes = [
        ("it returns the index of the largest weight (argmax); return the weight itself",
         w.argmax(axis=-1)),
        ("it returns the largest score; return the largest softmax weight", scores.max(axis=-1)),
    ]
    if rows:
        max_mistakes += [
            ("it takes the softmax over the wrong axis: each row, over the last axis (the keys), "
             "must sum to 1 (dim=-1)", _softmax(scores, axis=axis).max(axis=-1))
            for axis in range(scores.ndim - 1)]
        max_mistakes.append(("it takes one maximum for the whole batch; take the maximum over "
                             "the last axis, one per row", np.max(w)))
    judge(max_weight, w.max(axis=-1), f"max_weight of {name}", mistakes=max_mistakes)
    got_norm = to_array(grad_norm, f"grad_norm of {name}")
    expected = np.linalg.norm(grad, axis=-1)
    if rows and got_norm.shape == ():
        raise CheckFailed(f"grad_norm of {name} is one number for the whole batch; return one "
                          "norm per row: the norm over the last axis (dim=-1) of the gradient")
    if got_norm.shape == scores.shape and expected.shape != scores.shape:
        raise CheckFailed(f"grad_norm of {name} has the shape of the scores: it is the gradient "
                          "itself; return its Euclidean norm over the last axis (dim=-1)")
    onehot = np.zeros(scores.shape[-1])
    onehot[target] = 1.0
    w_max = w.max(axis=-1, keepdims=True)
    max_onehot = (w == w_max).astype(float)
    mistakes = [
        ("it is 0 everywhere: it differentiates a sum of whole softmax rows, which is always 1, "
         "so its gradient is 0 (for example w.sum().backward(), or w[target] instead of "
         "w[..., target]); differentiate only the weight of key target, w[..., target]",
         np.zeros(rows)),
        ("it differentiates the largest weight; the docstring asks for the weight of key "
         "target, w[..., target]", np.linalg.norm(w_max * (max_onehot - w), axis=-1)),
        ("it differentiates log w[..., target] (as a cross-entropy loss would); differentiate "
         "the weight itself", np.linalg.norm(onehot - w, axis=-1)),
        ("its norm is 1 for every row: it is the gradient of the score s[..., target] (or of "
         "w[..., target] with respect to the weights), not of the softmax weight with respect "
         "to the scores", np.ones(rows)),
        ("it returns the squared norm; take the square root (torch.linalg.vector_norm)",
         expected ** 2),
        ("it returns the sum of absolute values (L1 norm); the docstring asks for the "
         "Euclidean (L2) norm", np.abs(grad).sum(axis=-1)),
        ("it differentiates the weight of the wrong key, a neighbour of key target: keys "
         "count from 0, so the weight to differentiate is w[..., target]", _norm_for_key(w, target + 1)),
        ("it differentiates the weight of the wrong key, a neighbour of key target: keys "
         "count from 0, so the weight to differentiate is w[..., target]", _norm_for_key(w, target - 1)),
    ]
    judge(got_norm, expected, f"grad_norm of {name}",
          mistakes=[(m, wrong) for m, wrong in mistakes if wrong is not None])


def _norm_for_key(w: np.ndarray, key: int) -> np.ndarray | None:
    if not 0 <= key < w.shape[-1]:
        return None
    onehot = np.zeros(w.shape[-1])
    onehot[key] = 1.0
    return np.linalg.norm(w[..., key:key + 1] * (onehot - w), axis=-1)


@exercise("scaling-self_attention_weights", "self_attention_weights")
def self_attention_weights_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # (seq_len 5, d_model 7, d_k 3), then a batch of 2 with d_k 9 wider than d_model 6
    for x_shape, d_k in [((5, 7), 3), ((2, 4, 6), 9)]:
        d_model = x_shape[-1]
        x = rng.normal(scale=1.5, size=x_shape)
        w_q = rng.normal(scale=d_model ** -0.5, size=(d_model, d_k))
        w_k = rng.normal(scale=d_model ** -0.5, size=(d_model, d_k))
        asked.append(Question((x, w_q, w_k), lambda got, x=x, w_q=w_q, w_k=w_k:
                              _verify_self_attention(got, x, w_q, w_k)))
    return asked


def _verify_self_attention(got: object, x: np.ndarray, w_q: np.ndarray, w_k: np.ndarray) -> None:
    d_model, d_k = w_q.shape
    what = (f"self_attention_weights(x, w_q, w_k) for x of shape {x.shape} "
            f"(d_model = {d_model}) and w_q, w_k of shape {w_q.shape} (d_k = {d_k})")
    raw = (x @ w_q) @ _t(x @ w_k)
    expected = _softmax(raw / np.sqrt(d_k))
    judge(got, expected, what, mistakes=[
        ("it divides by sqrt(d_model), the width of the embeddings x (x.shape[-1] or "
         "w_q.shape[0]); the dot products are taken between queries and keys of width d_k = "
         "w_q.shape[-1]: divide by sqrt(d_k)", _softmax(raw / np.sqrt(d_model))),
        ("it divides by d_model, the width of the embeddings; divide by sqrt(d_k), the square "
         "root of the width of the queries and keys (w_q.shape[-1])", _softmax(raw / d_model)),
        ("it divides the scores by d_k, not sqrt(d_k) (did you scale both Q and K by "
         "1/sqrt(d_k)? Scale the scores once)", _softmax(raw / d_k)),
        ("it does not scale the scores; divide Q K^T by sqrt(d_k) before the softmax", _softmax(raw)),
        ("it multiplies the scores by sqrt(d_k); divide by it", _softmax(raw * np.sqrt(d_k))),
        ("it scales after the softmax, so the rows sum to 1/sqrt(d_k); divide the scores by "
         "sqrt(d_k) first, then take the softmax", _softmax(raw) / np.sqrt(d_k)),
        ("it takes the softmax over the query axis (each column sums to 1); take it over the "
         "last axis, the keys, so that each query's row sums to 1", _softmax(raw / np.sqrt(d_k), axis=-2)),
        ("it computes K Q^T, so row i holds the scores of key i; row i must be query i's "
         "weights over every key: (x W_Q)(x W_K)^T", _softmax(_t(raw) / np.sqrt(d_k))),
        ("it uses w_q for the keys too; the keys are x @ w_k",
         _softmax((x @ w_q) @ _t(x @ w_q) / np.sqrt(d_k))),
        ("it returns the scaled scores; apply the softmax over the keys (last axis)",
         raw / np.sqrt(d_k)),
    ], hints=[lambda a: "each query's row should be positive and sum to 1 (a softmax over the "
              "keys, the last axis): scale the scores before the softmax, never the weights after it"
              if not np.allclose(a.sum(axis=-1), 1.0, atol=1e-4) or np.any(a < 0) else None])
