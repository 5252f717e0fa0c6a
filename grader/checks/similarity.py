"""Hidden checks of notebook 01, similarity: the specs of its four exercises.

Sizes are pairwise distinct (batch 2, queries 4, keys 5, d 3) so that a swapped
axis either raises or shows, and inputs are random so that no tie hides a mistake.
"""
from __future__ import annotations

import numpy as np

from ._core import Call, Hint, Mistake, Raises, Rule, Spec
from ._softmax_kinds import keepdims_rule, no_keepdims_sum, softmax_axis_hints
from .reference import similarity as ref
from .reference.softmax import stable_softmax


def _pairs(rng: np.random.Generator) -> list[Call]:
    # One pair of plain vectors, then a batch of (2, 4) pairs of 3-vectors.
    calls = []
    for shape in [(5,), (2, 4, 3)]:
        a, b = rng.normal(size=shape), rng.normal(size=shape)
        calls.append(Call((a, b), what=f"dot_product(a, b) for a and b of shape {shape}"))
    return calls


def _all_pairs(a, b):
    return a @ np.swapaxes(b, -1, -2) if a.ndim > 1 else a @ b


DOT_PRODUCT = Spec(
    id="similarity-dot_product",
    function="dot_product",
    inputs=_pairs,
    reference=ref.dot_product,
    rules=(Rule("plain vectors (d,): one number", lambda call: call.args[0].ndim == 1),
           Rule("a batch of pairs (..., d): one dot product per pair, over the last axis",
                lambda call: call.args[0].ndim > 1 and len(set(call.args[0].shape)) == call.args[0].ndim)),
    mistakes=(
        Mistake("elementwise", "it returns the element-wise products; add them up over the last axis "
                "(np.sum(a * b, axis=-1))", lambda a, b: a * b),
        Mistake("sum_all", "it sums over every axis; a batch needs one dot product per pair of "
                "vectors: sum over the last axis only (axis=-1)", lambda a, b: np.sum(a * b)),
        Mistake("sum_first_axis", "it sums over the first axis; the vector entries are on the last axis "
                "(axis=-1)", lambda a, b: np.sum(a * b, axis=0)),
        Mistake("lengths", "it returns |a||b|, the lengths only; the dot product multiplies "
                "matching entries and adds them up (|a||b|cos(theta))", lambda a, b: ref.norm(a) * ref.norm(b)),
        Mistake("all_pairs", "it pairs every vector of a with every vector of b (a matrix "
                "product); dot_product pairs a[i] with b[i] only", _all_pairs),
    ),
)


def _lengths_apart(rng: np.random.Generator) -> list[Call]:
    # Vectors of very different lengths, so that forgetting to divide by a length shows;
    # then a zero vector: the docstring promises 0 (not NaN) for it.
    a = rng.normal(size=(2, 4, 3)) * rng.uniform(0.2, 5.0, size=(2, 4, 1))
    b = rng.normal(size=(2, 4, 3)) * rng.uniform(0.2, 5.0, size=(2, 4, 1))
    return [Call((a, b), what="cosine_similarity(a, b) for a and b of shape (2, 4, 3)"),
            Call((np.zeros(3), rng.normal(size=3)), what="cosine_similarity(zero vector, b)")]


def _no_eps(a, b, eps=1e-8):
    return ref.dot_product(a, b) / (ref.norm(a) * ref.norm(b))


COSINE_SIMILARITY = Spec(
    id="similarity-cosine_similarity",
    function="cosine_similarity",
    depends=("similarity-dot_product",),  # its solution calls them
    inputs=_lengths_apart,
    reference=ref.cosine_similarity,
    rules=(Rule("a zero vector gives 0, not NaN (eps guards the division)",
                lambda call: not np.any(call.args[0]) or not np.any(call.args[1])),
           Rule("vectors of different lengths: divide by both", lambda call: call.args[0].ndim > 1 and not np.allclose(
               ref.norm(call.args[0]), ref.norm(call.args[1])))),
    equivalent=(("L3 dot_product(a, b) -> dot_product(b, a)", "a dot product is symmetric: a.b = b.a"),),
    mistakes=(
        Mistake("no_division", "it returns the plain dot product; divide by the lengths |a| and |b|",
                lambda a, b, eps=1e-8: ref.dot_product(a, b)),
        Mistake("only_a", "it divides by |a| only; divide by |b| as well",
                lambda a, b, eps=1e-8: ref.dot_product(a, b) / ref.norm(a)),
        Mistake("only_b", "it divides by |b| only; divide by |a| as well",
                lambda a, b, eps=1e-8: ref.dot_product(a, b) / ref.norm(b)),
        Mistake("squared_lengths", "it divides by the squared lengths |a|^2 |b|^2; take square roots "
                "(np.linalg.norm(x, axis=-1))",
                lambda a, b, eps=1e-8: ref.dot_product(a, b) / (ref.dot_product(a, a) * ref.dot_product(b, b))),
        Mistake("whole_array_length", "it divides by the length of the whole array; take one length per "
                "vector (norm over axis=-1)",
                lambda a, b, eps=1e-8: ref.dot_product(a, b) / (np.linalg.norm(a) * np.linalg.norm(b))),
    ),
    hints=(
        Hint("should be 0.0; it divides by a zero length: guard the denominator with eps as the docstring says",
             lambda got, call: call.what.endswith("(zero vector, b)") and not np.all(np.isfinite(got)),
             example=_no_eps),
        Hint("a cosine lies in [-1, 1]; check the division by the lengths",
             lambda got, call: bool(np.any(np.abs(got) > 1 + 1e-6)),
             example=lambda a, b, eps=1e-8: ref.dot_product(a, b) / (ref.norm(a) * ref.norm(b)) ** 0.5),
    ),
)


def _queries_and_keys(rng: np.random.Generator) -> list[Call]:
    calls = []
    for q_shape, k_shape in [((4, 3), (5, 3)), ((2, 4, 3), (2, 5, 3))]:
        calls.append(Call((rng.normal(size=q_shape), rng.normal(size=k_shape)),
                          what=f"score_matrix(queries, keys) for queries {q_shape} and keys {k_shape}"))
    return calls


SCORE_MATRIX = Spec(
    id="similarity-score_matrix",
    function="score_matrix",
    inputs=_queries_and_keys,
    reference=ref.score_matrix,
    rules=(Rule("q_len != k_len (rows are queries, columns keys)",
                lambda call: call.args[0].shape[-2] != call.args[1].shape[-2]),
           Rule("a batch axis in front: transpose only the last two axes of keys", lambda call: call.args[0].ndim > 2)),
    mistakes=(
        Mistake("keys_times_queries", "it computes keys @ queries^T, so rows are keys; the row of query i "
                "must hold its scores against every key: queries @ keys^T",
                lambda q, k: k @ np.swapaxes(q, -1, -2)),
        Mistake("scaled", "it scales the scores by sqrt(d_k); scaling comes in notebook 02, here "
                "return the raw dot products", lambda q, k: ref.score_matrix(q, k) / np.sqrt(q.shape[-1])),
        Mistake("cosine", "it normalizes the vectors (cosine similarity); the score matrix holds "
                "raw dot products",
                lambda q, k: ref.score_matrix(q / ref.norm(q)[..., None], k / ref.norm(k)[..., None])),
    ),
    errors=(
        Raises("score_matrix raised {error}. It fails on a batch: transpose only the last two axes of "
               "keys (np.swapaxes(keys, -1, -2)); .T reverses every axis",
               example=lambda q, k: q @ k.T, when=lambda call: call.args[0].ndim == 3),
    ),
)


def _scores_and_values(rng: np.random.Generator) -> list[Call]:
    return [Call((rng.normal(scale=2.0, size=(2, 4, 5)), rng.normal(size=(2, 5, 3))),
                 what="soft_lookup(scores, values) for scores (2, 4, 5) and values (2, 5, 3)")]


def _weighted(weights):
    """A soft_lookup that averages the values with ``weights(scores)``."""
    return lambda s, v: (weights(s) @ v, weights(s))


SOFT_LOOKUP = Spec(
    id="similarity-soft_lookup",
    function="soft_lookup",
    inputs=_scores_and_values,
    reference=ref.soft_lookup,
    rules=(Rule("q_len != k_len != d_v, with a batch axis: each query's weights over the keys (last axis)",
                lambda call: len({*call.args[0].shape, call.args[1].shape[-1]}) == 4),),
    equivalent=(("L3 stable_softmax(scores, axis=-1) -> stable_softmax(scores)", "stable_softmax's axis defaults to -1, the axis the reference passes"),),
    parts=("output", "weights"),
    order=(1, 0),  # the output follows from the weights: judge the weights first
    mistakes=(
        Mistake("query_axis", "each column sums to 1 instead of each row: take the softmax over the key "
                "axis (axis=-1), so that every query spreads weight 1 over the keys",
                _weighted(lambda s: stable_softmax(s, axis=-2))),
        Mistake("no_exp", "it divides the scores by their sum without exponentiating: softmax is "
                "exp(s) / sum(exp(s))", _weighted(lambda s: s / s.sum(axis=-1, keepdims=True))),
        Mistake("hard_lookup", "it puts all the weight on the best key (a hard lookup); a soft lookup "
                "uses softmax weights", _weighted(lambda s: (s == s.max(axis=-1, keepdims=True)) * 1.0)),
        Mistake("raw_scores", "it returns the scores themselves; turn them into weights with softmax",
                _weighted(lambda s: s)),
        Mistake("output_with_raw_scores", "the output averages the values with the raw scores; use the "
                "softmax weights", lambda s, v: (s @ v, stable_softmax(s))),
        Mistake("plain_mean", "the output is the plain mean of the values; weight each value by its "
                "query's softmax weight",
                lambda s, v: (np.broadcast_to(v.mean(axis=-2, keepdims=True), (*s.shape[:-1], v.shape[-1])),
                              stable_softmax(s))),
    ),
    errors=(keepdims_rule("soft_lookup", _weighted(no_keepdims_sum)),),
    hints=softmax_axis_hints(lambda softmax: _weighted(lambda s: np.asarray(softmax(s))), part=1, other=False) + (
        Hint("each query's weights over the keys should be positive and sum to 1",
             lambda w, call: not np.allclose(w.sum(axis=-1), 1.0, atol=1e-4) or bool(np.any(w < 0)),
             example=_weighted(lambda s: np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True).max()), part=1),
    ),
)

SPECS = (DOT_PRODUCT, COSINE_SIMILARITY, SCORE_MATRIX, SOFT_LOOKUP)
