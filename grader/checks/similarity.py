"""Hidden checks of notebook 01, similarity.

Sizes are pairwise distinct (batch 2, queries 4, keys 5, d 3) so that a swapped
axis either raises or shows, and inputs are random so that no tie hides a mistake.
"""
from __future__ import annotations

import numpy as np

from ._core import CheckFailed, Question, exercise, judge, to_array, value


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("...d,...d->...", a, b)


def _norm(x: np.ndarray) -> np.ndarray:
    return np.sqrt(_dot(x, x))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@exercise("similarity-dot_product", "dot_product")
def dot_product_questions(rng: np.random.Generator) -> list[Question]:
    # One pair of plain vectors, then a batch of (2, 4) pairs of 3-vectors.
    asked = []
    for a, b in [(rng.normal(size=5), rng.normal(size=5)),
                 (rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 4, 3)))]:
        what = f"dot_product(a, b) for a and b of shape {a.shape}"
        mistakes = [
            ("it returns the element-wise products; add them up over the last axis "
             "(np.sum(a * b, axis=-1))", a * b),
            ("it sums over every axis; a batch needs one dot product per pair of "
             "vectors: sum over the last axis only (axis=-1)", np.sum(a * b)),
            ("it sums over the first axis; the vector entries are on the last axis "
             "(axis=-1)", np.sum(a * b, axis=0)),
            ("it returns |a||b|, the lengths only; the dot product multiplies "
             "matching entries and adds them up (|a||b|cos(theta))", _norm(a) * _norm(b)),
        ]
        if a.ndim > 1:
            mistakes.append(("it pairs every vector of a with every vector of b (a matrix "
                             "product); dot_product pairs a[i] with b[i] only",
                             a @ np.swapaxes(b, -1, -2)))
        asked.append(Question((a, b), lambda got, a=a, b=b, what=what, mistakes=mistakes:
                              judge(got, _dot(a, b), what, mistakes)))
    return asked


@exercise("similarity-cosine_similarity", "cosine_similarity")
def cosine_similarity_questions(rng: np.random.Generator) -> list[Question]:
    # Vectors of very different lengths, so that forgetting to divide by a length shows.
    a = rng.normal(size=(2, 4, 3)) * rng.uniform(0.2, 5.0, size=(2, 4, 1))
    b = rng.normal(size=(2, 4, 3)) * rng.uniform(0.2, 5.0, size=(2, 4, 1))

    def batch(got: object) -> None:
        judge(
            got,
            _dot(a, b) / (_norm(a) * _norm(b)),
            "cosine_similarity(a, b) for a and b of shape (2, 4, 3)",
            mistakes=[
                ("it returns the plain dot product; divide by the lengths |a| and |b|", _dot(a, b)),
                ("it divides by |a| only; divide by |b| as well", _dot(a, b) / _norm(a)),
                ("it divides by |b| only; divide by |a| as well", _dot(a, b) / _norm(b)),
                ("it divides by the squared lengths |a|^2 |b|^2; take square roots "
                 "(np.linalg.norm(x, axis=-1))", _dot(a, b) / (_dot(a, a) * _dot(b, b))),
                ("it divides by the length of the whole array; take one length per vector "
                 "(norm over axis=-1)", _dot(a, b) / (np.sqrt(np.sum(a * a)) * np.sqrt(np.sum(b * b)))),
            ],
            hints=[lambda x: "a cosine lies in [-1, 1]; check the division by the lengths"
                   if np.any(np.abs(x) > 1 + 1e-6) else None],
        )

    # The docstring promises 0 (not NaN) when a vector is all zeros.
    def zero_vector(got: object) -> None:
        got = to_array(got, "cosine_similarity(zero vector, b)")
        if got.shape != () or not np.isfinite(got) or abs(float(got)) > 1e-6:
            raise CheckFailed(
                "cosine_similarity(zero vector, b) should be 0.0; it divides by a zero length: "
                "guard the denominator with eps as the docstring says")

    return [Question((a, b), batch), Question((np.zeros(3), rng.normal(size=3)), zero_vector)]


@exercise("similarity-score_matrix", "score_matrix")
def score_matrix_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for q_shape, k_shape in [((4, 3), (5, 3)), ((2, 4, 3), (2, 5, 3))]:
        queries, keys = rng.normal(size=q_shape), rng.normal(size=k_shape)

        def verify(got, queries=queries, keys=keys, q_shape=q_shape, k_shape=k_shape) -> None:
            what = f"score_matrix(queries, keys) for queries {q_shape} and keys {k_shape}"
            try:
                value(got, "score_matrix")
            except CheckFailed as error:
                if len(q_shape) == 3:
                    raise CheckFailed(
                        f"{error}. It fails on a batch: transpose only the last two axes of keys "
                        "(np.swapaxes(keys, -1, -2)); .T reverses every axis") from None
                raise
            expected = queries @ np.swapaxes(keys, -1, -2)
            judge(got, expected, what, mistakes=[
                ("it computes keys @ queries^T, so rows are keys; the row of query i must "
                 "hold its scores against every key: queries @ keys^T", np.swapaxes(expected, -1, -2)),
                ("it scales the scores by sqrt(d_k); scaling comes in notebook 02, here "
                 "return the raw dot products", expected / np.sqrt(queries.shape[-1])),
                ("it normalizes the vectors (cosine similarity); the score matrix holds "
                 "raw dot products", expected / (_norm(queries)[..., :, None] * _norm(keys)[..., None, :])),
            ])

        asked.append(Question((queries, keys), verify))
    return asked


@exercise("similarity-soft_lookup", "soft_lookup")
def soft_lookup_questions(rng: np.random.Generator) -> list[Question]:
    scores = rng.normal(scale=2.0, size=(2, 4, 5))
    values = rng.normal(size=(2, 5, 3))
    name = "soft_lookup(scores, values) for scores (2, 4, 5) and values (2, 5, 3)"

    def verify(got: object) -> None:
        got = value(got, "soft_lookup")
        if not isinstance(got, tuple) or len(got) != 2:
            kind = f"a tuple of {len(got)} items" if isinstance(got, tuple) else "one array"
            raise CheckFailed(f"{name} should return a tuple (output, weights), but it returns {kind}")
        weights = _softmax(scores, axis=-1)
        by_query_axis = _softmax(scores, axis=-2)
        judge(
            got[1],
            weights,
            f"the weights of {name}",
            mistakes=[
                ("each column sums to 1 instead of each row: take the softmax over the key "
                 "axis (axis=-1), so that every query spreads weight 1 over the keys", by_query_axis),
                ("it divides the scores by their sum without exponentiating: softmax is "
                 "exp(s) / sum(exp(s))", scores / scores.sum(axis=-1, keepdims=True)),
                ("it puts all the weight on the best key (a hard lookup); a soft lookup "
                 "uses softmax weights", (scores == scores.max(axis=-1, keepdims=True)).astype(float)),
                ("it returns the scores themselves; turn them into weights with softmax", scores),
            ],
            hints=[lambda w: "each query's weights over the keys should be positive and sum to 1"
                   if not np.allclose(w.sum(axis=-1), 1.0, atol=1e-4) or np.any(w < 0) else None],
        )
        judge(
            got[0],
            weights @ values,
            f"the output of {name}",
            mistakes=[
                ("it averages the values with the raw scores; use the softmax weights", scores @ values),
                ("it averages with weights normalized over the query axis; take the softmax "
                 "over the keys (axis=-1)", by_query_axis @ values),
                ("it returns the plain mean of the values; weight each value by its "
                 "query's softmax weight", np.broadcast_to(values.mean(axis=-2, keepdims=True), (2, 4, 3))),
            ],
        )

    return [Question((scores, values), verify)]
