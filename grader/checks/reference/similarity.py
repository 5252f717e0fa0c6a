"""References of notebook 01, similarity (numpy; shapes as in the notebook)."""
from __future__ import annotations

import numpy as np

from .softmax import stable_softmax


def dot_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(..., d), (..., d) -> (...): one dot product per pair of vectors."""
    return np.einsum("...d,...d->...", a, b)


def norm(x: np.ndarray) -> np.ndarray:
    """(..., d) -> (...): the Euclidean length of each vector."""
    return np.sqrt(dot_product(x, x))


def cosine_similarity(a: np.ndarray, b: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """(..., d), (..., d) -> (...): a.b / max(|a||b|, eps), so a zero vector gives 0."""
    return dot_product(a, b) / np.maximum(norm(a) * norm(b), eps)


def score_matrix(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(..., q_len, d), (..., k_len, d) -> (..., q_len, k_len): Q K^T."""
    return queries @ np.swapaxes(keys, -1, -2)


def soft_lookup(scores: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(..., q_len, k_len), (..., k_len, d_v) -> (output (..., q_len, d_v), weights)."""
    weights = stable_softmax(scores, axis=-1)
    return weights @ values, weights
