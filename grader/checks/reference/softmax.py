"""References of notebook 04, softmax (numpy)."""
from __future__ import annotations

import numpy as np


def stable_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Softmax along ``axis`` with the maximum subtracted first (no overflow); an entry of
    -inf gets weight 0 as long as its slice holds a finite entry."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def softmax_with_temperature(scores: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(scores / T) over the last axis.

    Raises:
        ValueError: ``temperature`` is not positive.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    return stable_softmax(scores / temperature, axis=-1)


def scaled_dot_product_attention(query: np.ndarray, key: np.ndarray, value: np.ndarray,
                                 mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(..., q_len, d_k), (..., k_len, d_k), (..., k_len, d_v), mask True = may attend
    (broadcasts against the scores) -> (output (..., q_len, d_v), weights (..., q_len, k_len))."""
    scores = query @ np.swapaxes(key, -1, -2) / np.sqrt(query.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = stable_softmax(scores, axis=-1)
    return weights @ value, weights
