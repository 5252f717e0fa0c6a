"""Hidden checks of notebook 02, scaling: the specs of its four exercises.

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

from ._core import ATOL, RTOL, Call, Case, CheckFailed, Hint, Mistake, Raises, Rule, Spec, _describe, _equal, judge_case
from ._softmax_kinds import no_keepdims_max, no_keepdims_sum, softmax_axis_hints
from .reference import scaling as ref
from .reference.similarity import dot_product, score_matrix
from .reference.softmax import stable_softmax


# ------------------------------------------------------------------------------ dot_variance
def _variance_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for n, d_k in [(7, 6), (5, 9)]:
        # Shifted entries, drawn again until the dot products have a mean far from 0.
        while True:
            q = rng.normal(loc=0.6, size=(n, d_k))
            k = rng.normal(loc=0.4, scale=1.5, size=(n, d_k))
            if abs(np.mean(dot_product(q, k))) > 0.5:
                break
        calls.append(Call((q, k), what=f"dot_variance(q, k) for q and k of shape (n, d_k) = ({n}, {d_k})"))
    return calls


DOT_VARIANCE = Spec(
    id="scaling-dot_variance",
    function="dot_variance",
    inputs=_variance_inputs,
    reference=ref.dot_variance,
    rules=(Rule("n != d_k: pair rows, sum over the last axis", lambda call: call.args[0].shape[0] != call.args[0].shape[1]),
           Rule("dot products whose mean is far from 0 (subtract it)",
                lambda call: abs(float(np.mean(dot_product(*call.args)))) > 0.5)),
    equivalent=(("L3 dot_product(q, k) -> dot_product(k, q)", "a dot product is symmetric: q.k = k.q"),),
    by_call=True,
    mistakes=(
        Mistake("sample_variance", "it is the sample variance (ddof=1, what torch.var and Tensor.var compute by "
                "default); the docstring asks for the population variance, ddof=0: np.var(s) or "
                "torch.var(s, correction=0)", lambda q, k: np.var(dot_product(q, k), ddof=1)),
        Mistake("std", "it returns the standard deviation; the variance is its square",
                lambda q, k: np.std(dot_product(q, k))),
        Mistake("no_mean", "it does not subtract the mean of the dot products: the variance is the mean of "
                "(s - mean(s))**2, not the mean of s**2", lambda q, k: np.mean(dot_product(q, k) ** 2)),
        Mistake("mean", "it returns the mean of the dot products; return their variance",
                lambda q, k: np.mean(dot_product(q, k))),
        Mistake("single_products", "it takes the variance of the single products q[i, j] * k[i, j]; first add "
                "them up over the last axis (one dot product per pair of rows), then take the variance of "
                "those n numbers", lambda q, k: np.var(q * k)),
        Mistake("sum_over_samples", "it takes the variance over the wrong axis: it sums over the n samples "
                "(axis 0) and takes the variance across the d_k coordinates. Sum over the last axis (the d_k "
                "entries of each vector), then take the variance over the n dot products",
                lambda q, k: np.var(np.sum(q * k, axis=0))),
        Mistake("per_coordinate", "it takes the variance over the wrong axis: one variance per coordinate "
                "(axis 0 of q * k). Take the dot product of each pair of rows first, then one variance over "
                "the n dot products", lambda q, k: np.var(q * k, axis=0)),
        Mistake("sum_of_variances", "it adds up one variance per coordinate (the variance of a sum equals the "
                "sum of the variances only in expectation, for independent terms); take the dot products "
                "first, then the variance of those n numbers", lambda q, k: np.sum(np.var(q * k, axis=0))),
        Mistake("per_pair", "it takes the variance over the wrong axis: one variance per pair of vectors, over "
                "its d_k products. Add the products up to one dot product per pair, then take the variance "
                "over the n pairs", lambda q, k: np.var(q * k, axis=-1)),
        Mistake("all_pairs", "it pairs every q with every k (q @ k.T, n * n dot products); pair row i of q with "
                "row i of k only", lambda q, k: np.var(q @ k.T)),
    ),
)


# ----------------------------------------------------------------------------- scaled_scores
def _scores_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for q_shape, k_shape in [((4, 9), (5, 9)), ((2, 3, 4, 6), (2, 3, 5, 6))]:
        calls.append(Call((rng.normal(size=q_shape), rng.normal(size=k_shape)),
                          what=f"scaled_scores(queries, keys) for queries {q_shape} and keys {k_shape}"))
    return calls


def _proportional(got: np.ndarray, call: Call) -> bool:
    """``got`` is a constant multiple (not 1) of the right scores."""
    expected = ref.scaled_scores(*call.args)
    if got.shape != expected.shape or not np.all(np.isfinite(got)):
        return False
    flat_e, flat_g = expected.ravel(), got.ravel()
    factor = flat_g @ flat_e / (flat_e @ flat_e)
    return not np.isclose(factor, 1.0) and np.allclose(got, factor * expected, rtol=1e-4, atol=1e-5)


SCALED_SCORES = Spec(
    id="scaling-scaled_scores",
    function="scaled_scores",
    inputs=_scores_inputs,
    reference=ref.scaled_scores,
    rules=(Rule("d_k, q_len and k_len distinct", lambda call: len({*call.args[0].shape[-2:], call.args[1].shape[-2]}) == 3),
           Rule("batch and heads axes in front", lambda call: call.args[0].ndim == 4)),
    mistakes=(
        Mistake("unscaled", "it returns Q K^T unscaled; divide by sqrt(d_k), with d_k = queries.shape[-1]",
                score_matrix),
        Mistake("by_d_k", "it divides by d_k; divide by its square root, sqrt(d_k) (or multiply by d_k**-0.5)",
                lambda q, k: score_matrix(q, k) / q.shape[-1]),
        Mistake("times_sqrt", "it multiplies by sqrt(d_k); divide by it",
                lambda q, k: score_matrix(q, k) * np.sqrt(q.shape[-1])),
        Mistake("sqrt_queries", "it divides by the square root of the number of queries (queries.shape[-2]); "
                "d_k is the size of the last axis, queries.shape[-1]",
                lambda q, k: score_matrix(q, k) / np.sqrt(q.shape[-2])),
        Mistake("sqrt_keys", "it divides by the square root of the number of keys (keys.shape[-2]); d_k is the "
                "size of the last axis, queries.shape[-1]", lambda q, k: score_matrix(q, k) / np.sqrt(k.shape[-2])),
        Mistake("keys_times_queries", "it computes K Q^T, so row i belongs to key i; row i must hold query i's "
                "scores against every key: Q K^T, transposing the last two axes of keys",
                lambda q, k: score_matrix(k, q) / np.sqrt(q.shape[-1])),
        Mistake("softmax", "it applies the softmax; scaled_scores returns the scaled scores, before any softmax",
                lambda q, k: stable_softmax(ref.scaled_scores(q, k))),
    ),
    errors=(
        Raises("scaled_scores raised {error}. It fails with batch and head axes in front: transpose only the "
               "last two axes of keys (np.swapaxes(keys, -1, -2) or keys.transpose(-2, -1) in torch); "
               "keys.T reverses every axis", example=lambda q, k: q @ np.transpose(k) / np.sqrt(q.shape[-1]),
               when=lambda call: call.args[0].ndim > 2),
    ),
    hints=(
        Hint("it is off by a constant factor: divide Q K^T by sqrt(d_k), d_k = queries.shape[-1], the length "
             "of each query and key vector", _proportional,
             example=lambda q, k: score_matrix(q, k) / np.sqrt(q.shape[1])),  # = d_k only without a batch
    ),
)


# ------------------------------------------------------------------------ softmax_saturation
def _saturation_inputs(rng: np.random.Generator) -> list[Call]:
    # A batch of rows from mild to saturated (each row its own spread of scores), then
    # one plain row: a target hard-wired to one key, or an axis mix-up, shows.
    batch = rng.normal(size=(2, 3, 5)) * np.array([0.3, 1.0, 2.0, 4.0, 8.0, 25.0]).reshape(2, 3, 1)
    batch[1, 2, np.argmax(batch[1, 2])] += 10.0  # the last row saturated: one weight above 0.999
    row = rng.normal(scale=1.5, size=6)
    return [Call((scores, target), what=f"softmax_saturation(scores, target) for scores of shape {scores.shape}")
            for scores, target in [(batch, 1), (row, 4)]]


def _gradient(w: np.ndarray, key: int) -> np.ndarray:
    """d w[..., key] / d scores, for softmax weights w: w_key (delta_key,j - w_j)."""
    return w[..., key:key + 1] * (np.eye(w.shape[-1])[key] - w)


def _saturation(max_weight=None, grad_norm=None):
    """A learner's softmax_saturation (the closed form) with one part done differently:
    ``max_weight(scores, w)`` or ``grad_norm(w, target)``."""
    def softmax_saturation(scores, target):
        w = stable_softmax(scores)
        return ((w.max(axis=-1) if max_weight is None else max_weight(scores, w)),
                (np.linalg.norm(_gradient(w, target), axis=-1) if grad_norm is None else grad_norm(w, target)))
    return softmax_saturation


def _norm_of_largest(w: np.ndarray, target: int) -> np.ndarray:
    w_max = w.max(axis=-1, keepdims=True)
    return np.linalg.norm(w_max * ((w == w_max) - w), axis=-1)


_WRONG_KEY = ("it differentiates the weight of the wrong key, a neighbour of key target: keys count from 0, "
              "so the weight to differentiate is w[..., target]")


_WRONG_DELTA = ("the delta of d w_t / d s_j = w_t (delta_tj - w_j) sits on a neighbour of key target (keys count "
                "from 0): it is 1 at j = target only")


def _delta_at(w: np.ndarray, target: int, key: int) -> np.ndarray:
    """The norm of w_target (delta_key,j - w_j): the delta on another key."""
    return np.linalg.norm(w[..., target:target + 1] * (np.eye(w.shape[-1])[key] - w), axis=-1)


def _judge_saturation(case: Case) -> None:
    """(max_weight, grad_norm): a pair for max_weight and the gradient's shapes first, then
    each part against the same part of every catalogued mistake, then the default judgement."""
    answer, (max_expected, norm_expected) = case.answer, case.expected
    scores = case.call.args[0]
    if isinstance(answer, tuple) and len(answer) == 2:
        if isinstance(answer[0], tuple):
            raise CheckFailed(f"max_weight of {case.what} is a pair of arrays: torch's max(dim=...) returns "
                              "(values, indices); return the values (.values)")
        for i, (label, right) in enumerate([("max_weight", max_expected), ("grad_norm", norm_expected)]):
            part = answer[i]
            if not isinstance(part, np.ndarray) or _equal(part, right, RTOL, ATOL):
                continue
            what = f"{label} of {case.what}"
            if i == 1 and scores.ndim > 1 and part.shape == ():
                raise CheckFailed(f"{what} is one number for the whole batch; return one norm per row: the "
                                  "norm over the last axis (dim=-1) of the gradient")
            if i == 1 and part.shape == scores.shape:
                raise CheckFailed(f"{what} has the shape of the scores: it is the gradient itself; return its "
                                  "Euclidean norm over the last axis (dim=-1)")
            for mistake, wrong in case.mistaken():
                if isinstance(wrong, tuple) and len(wrong) == 2 and _equal(part, wrong[i], RTOL, ATOL):
                    raise CheckFailed(f"{what}: {mistake.diagnosis}")
            _describe(case, part.astype(np.float64), right, what, i)
    judge_case(case)


def _values_and_indices(scores, target):
    import torch

    w = torch.softmax(torch.as_tensor(scores), dim=-1)
    return w.max(dim=-1), np.linalg.norm(_gradient(w.numpy(), target), axis=-1)


SOFTMAX_SATURATION = Spec(
    id="scaling-softmax_saturation",
    function="softmax_saturation",
    inputs=_saturation_inputs,
    reference=ref.softmax_saturation,
    rules=(Rule("target neither the first key nor the last", lambda call: 0 < call.args[1] < call.args[0].shape[-1] - 1),
           Rule("a batch of rows, one saturated (a weight above 0.999)", lambda call: call.args[0].ndim > 1 and bool(
               np.any(stable_softmax(call.args[0]).max(axis=-1) > 0.999)))),
    equivalent=(("L4 stable_softmax(scores, axis=-1) -> stable_softmax(scores)", "stable_softmax's axis defaults to -1, the axis the reference passes"),),
    parts=("max_weight", "grad_norm"),
    judge=_judge_saturation,
    mistakes=(
        Mistake("argmax", "it returns the index of the largest weight (argmax); return the weight itself",
                _saturation(max_weight=lambda s, w: w.argmax(axis=-1))),
        Mistake("largest_score", "it returns the largest score; return the largest softmax weight",
                _saturation(max_weight=lambda s, w: s.max(axis=-1))),
        Mistake("softmax_axis_0", "it takes the softmax over the wrong axis: each row, over the last axis (the "
                "keys), must sum to 1 (dim=-1)", _saturation(max_weight=lambda s, w: stable_softmax(s, 0).max(-1))),
        Mistake("softmax_axis_1", "it takes the softmax over the wrong axis: each row, over the last axis (the "
                "keys), must sum to 1 (dim=-1)",
                _saturation(max_weight=lambda s, w: stable_softmax(s, 1 % s.ndim).max(-1))),
        Mistake("batch_max", "it takes one maximum for the whole batch; take the maximum over the last axis, "
                "one per row", _saturation(max_weight=lambda s, w: np.max(w))),
        Mistake("smallest_weight", "it returns the smallest weight (min); return the largest, the max over the last "
                "axis", _saturation(max_weight=lambda s, w: w.min(axis=-1))),
        Mistake("mean_weight", "it returns the mean weight, which is 1 / n for every row; return the largest, the max "
                "over the last axis", _saturation(max_weight=lambda s, w: w.mean(axis=-1))),
        Mistake("plus_w", "the sign of w_j: d w_t / d s_j = w_t (delta_tj - w_j), with a minus; it adds w_j",
                _saturation(grad_norm=lambda w, t: np.linalg.norm(w[..., t:t + 1] * (np.eye(w.shape[-1])[t] + w),
                                                                  axis=-1))),
        Mistake("delta_only", "it keeps only the delta term, w_t delta_tj, whose norm is w_t: the gradient also has "
                "-w_t w_j for every key j, d w_t / d s_j = w_t (delta_tj - w_j)",
                _saturation(grad_norm=lambda w, t: w[..., t])),
        Mistake("delta_next", _WRONG_DELTA, _saturation(grad_norm=lambda w, t: _delta_at(w, t, t + 1))),
        Mistake("delta_previous", _WRONG_DELTA, _saturation(grad_norm=lambda w, t: _delta_at(w, t, t - 1))),
        Mistake("sum_of_rows", "it is 0 everywhere: it differentiates a sum of whole softmax rows, which is "
                "always 1, so its gradient is 0 (for example w.sum().backward(), or w[target] instead of "
                "w[..., target]); differentiate only the weight of key target, w[..., target]",
                _saturation(grad_norm=lambda w, t: np.zeros(w.shape[:-1]))),
        Mistake("largest_weight", "it differentiates the largest weight; the docstring asks for the weight of "
                "key target, w[..., target]", _saturation(grad_norm=_norm_of_largest)),
        Mistake("log_weight", "it differentiates log w[..., target] (as a cross-entropy loss would); "
                "differentiate the weight itself",
                _saturation(grad_norm=lambda w, t: np.linalg.norm(np.eye(w.shape[-1])[t] - w, axis=-1))),
        Mistake("score_gradient", "its norm is 1 for every row: it is the gradient of the score s[..., target] "
                "(or of w[..., target] with respect to the weights), not of the softmax weight with respect "
                "to the scores", _saturation(grad_norm=lambda w, t: np.ones(w.shape[:-1]))),
        Mistake("squared_norm", "it returns the squared norm; take the square root (torch.linalg.vector_norm)",
                _saturation(grad_norm=lambda w, t: np.sum(_gradient(w, t) ** 2, axis=-1))),
        Mistake("l1_norm", "it returns the sum of absolute values (L1 norm); the docstring asks for the "
                "Euclidean (L2) norm", _saturation(grad_norm=lambda w, t: np.abs(_gradient(w, t)).sum(axis=-1))),
        Mistake("next_key", _WRONG_KEY,
                _saturation(grad_norm=lambda w, t: np.linalg.norm(_gradient(w, t + 1), axis=-1))),
        Mistake("previous_key", _WRONG_KEY,
                _saturation(grad_norm=lambda w, t: np.linalg.norm(_gradient(w, t - 1), axis=-1))),
    ),
    diagnosed=(
        Mistake("values_and_indices", "torch's max(dim=...) returns (values, indices)", _values_and_indices),
        Mistake("batch_norm", "is one number for the whole batch; return one norm per row",
                _saturation(grad_norm=lambda w, t: np.linalg.norm(_gradient(w, t)))),
        Mistake("gradient_itself", "it is the gradient itself", _saturation(grad_norm=_gradient)),
    ),
)


# -------------------------------------------------------------------- self_attention_weights
def _embedding_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (seq_len 5, d_model 7, d_k 3), then a batch of 2 with d_k 9 wider than d_model 6
    for x_shape, d_k in [((5, 7), 3), ((2, 4, 6), 9)]:
        d_model = x_shape[-1]
        x = rng.normal(scale=1.5, size=x_shape)
        w_q = rng.normal(scale=d_model ** -0.5, size=(d_model, d_k))
        w_k = rng.normal(scale=d_model ** -0.5, size=(d_model, d_k))
        calls.append(Call((x, w_q, w_k), what=f"self_attention_weights(x, w_q, w_k) for x of shape {x.shape} "
                          f"(d_model = {d_model}) and w_q, w_k of shape {w_q.shape} (d_k = {d_k})"))
    return calls


def _weights(scale=None, after=None, axis=-1, same_weights=False, softmax=True, transpose=False):
    """A learner's self_attention_weights with one thing changed: the scores divided by
    ``scale(d_model, d_k)`` (default sqrt(d_k)), the weights divided by ``after(d_k)``,
    the softmax ``axis``, w_q for the keys too, no softmax, or K Q^T."""
    def self_attention_weights(x, w_q, w_k):
        d_model, d_k = w_q.shape
        queries, keys = x @ w_q, x @ (w_q if same_weights else w_k)
        scores = score_matrix(keys, queries) if transpose else score_matrix(queries, keys)
        scores = scores / (np.sqrt(d_k) if scale is None else scale(d_model, d_k))
        if not softmax:
            return scores
        weights = stable_softmax(scores, axis=axis) if softmax is True else softmax(scores)
        return weights if after is None else weights / after(d_k)
    return self_attention_weights


_NO_KEEPDIMS = ("the {which} over the keys lost its axis (keepdims=True forgotten): on square scores (seq, seq) it "
                "broadcasts along the other axis, so each row is {effect}. Keep the axis: np.max(s, axis=-1, "
                "keepdims=True) and np.sum(e, axis=-1, keepdims=True) (torch: keepdim=True)")

SELF_ATTENTION_WEIGHTS = Spec(
    id="scaling-self_attention_weights",
    function="self_attention_weights",
    depends=("scaling-scaled_scores",),  # its solution calls them
    inputs=_embedding_inputs,
    reference=ref.self_attention_weights,
    rules=(Rule("d_k < d_model", lambda call: call.args[1].shape[1] < call.args[1].shape[0]),
           Rule("d_k > d_model, with a batch axis", lambda call: call.args[1].shape[1] > call.args[1].shape[0]
                and call.args[0].ndim == 3)),
    equivalent=(("L4 stable_softmax(scaled_scores(x @ w_q, x @ w_k), axis=-1) -> "
                 "stable_softmax(scaled_scores(x @ w_q, x @ w_k))", "stable_softmax's axis defaults to -1, the axis the reference passes"),),
    by_call=True,
    mistakes=(
        Mistake("sqrt_d_model", "it divides by sqrt(d_model), the width of the embeddings x (x.shape[-1] or "
                "w_q.shape[0]); the dot products are taken between queries and keys of width d_k = "
                "w_q.shape[-1]: divide by sqrt(d_k)", _weights(scale=lambda d_model, d_k: np.sqrt(d_model))),
        Mistake("by_d_model", "it divides by d_model, the width of the embeddings; divide by sqrt(d_k), the "
                "square root of the width of the queries and keys (w_q.shape[-1])",
                _weights(scale=lambda d_model, d_k: d_model)),
        Mistake("by_d_k", "it divides the scores by d_k, not sqrt(d_k) (did you scale both Q and K by "
                "1/sqrt(d_k)? Scale the scores once)", _weights(scale=lambda d_model, d_k: d_k)),
        Mistake("unscaled", "it does not scale the scores; divide Q K^T by sqrt(d_k) before the softmax",
                _weights(scale=lambda d_model, d_k: 1.0)),
        Mistake("times_sqrt", "it multiplies the scores by sqrt(d_k); divide by it",
                _weights(scale=lambda d_model, d_k: d_k ** -0.5)),
        Mistake("scale_after", "it scales after the softmax, so the rows sum to 1/sqrt(d_k); divide the scores "
                "by sqrt(d_k) first, then take the softmax",
                _weights(scale=lambda d_model, d_k: 1.0, after=np.sqrt)),
        Mistake("query_axis", "it takes the softmax over the query axis (each column sums to 1); take it over "
                "the last axis, the keys, so that each query's row sums to 1", _weights(axis=-2)),
        Mistake("keys_times_queries", "it computes K Q^T, so row i holds the scores of key i; row i must be "
                "query i's weights over every key: (x W_Q)(x W_K)^T", _weights(transpose=True)),
        Mistake("w_q_for_keys", "it uses w_q for the keys too; the keys are x @ w_k", _weights(same_weights=True)),
        Mistake("no_softmax", "it returns the scaled scores; apply the softmax over the keys (last axis)",
                _weights(softmax=False)),
        Mistake("no_keepdims_sum", _NO_KEEPDIMS.format(which="sum", effect="divided by another row's sums"),
                _weights(softmax=no_keepdims_sum)),
        Mistake("no_keepdims_max", _NO_KEEPDIMS.format(which="max", effect="shifted by another row's maxima"),
                _weights(softmax=no_keepdims_max)),
    ),
    hints=softmax_axis_hints(lambda softmax: _weights(softmax=lambda s: np.asarray(softmax(s))), other=False) + (
        Hint("each query's row should be positive and sum to 1 (a softmax over the keys, the last axis): scale "
             "the scores before the softmax, never the weights after it",
             lambda w, call: bool(np.all(np.isfinite(w))) and (
                 not np.allclose(w.sum(axis=-1), 1.0, atol=1e-4) or bool(np.any(w < 0))),
             example=_weights(scale=lambda d_model, d_k: 1.0, after=lambda d_k: d_k)),
    ),
)

SPECS = (DOT_VARIANCE, SCALED_SCORES, SOFTMAX_SATURATION, SELF_ATTENTION_WEIGHTS)
