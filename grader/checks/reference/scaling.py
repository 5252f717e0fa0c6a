"""References of notebook 02, scaling (numpy; the notebook's softmax_saturation uses
autograd, its reference here is the closed form, which autograd must equal)."""
from __future__ import annotations

import numpy as np

from .similarity import dot_product, score_matrix
from .softmax import stable_softmax


def dot_variance(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(n, d_k), (n, d_k) -> (): the population variance (ddof=0) of the n dot products q[i].k[i]."""
    return np.var(dot_product(q, k))


def scaled_scores(queries: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """(..., q_len, d_k), (..., k_len, d_k) -> (..., q_len, k_len): Q K^T / sqrt(d_k)."""
    return score_matrix(queries, keys) / np.sqrt(queries.shape[-1])


def softmax_saturation(scores: np.ndarray, target: int) -> tuple[np.ndarray, np.ndarray]:
    """(..., n), key index -> (max_weight (...), grad_norm (...)): the largest softmax weight
    of each row and the L2 norm of d w[..., target] / d scores, = w_t (delta_tj - w_j)."""
    w = stable_softmax(scores, axis=-1)
    grad = w[..., target:target + 1] * (np.eye(scores.shape[-1])[target] - w)
    return w.max(axis=-1), np.linalg.norm(grad, axis=-1)


def self_attention_weights(x: np.ndarray, w_q: np.ndarray, w_k: np.ndarray) -> np.ndarray:
    """(..., seq, d_model), (d_model, d_k), (d_model, d_k) -> (..., seq, seq):
    softmax((x W_Q)(x W_K)^T / sqrt(d_k)) over the keys."""
    return stable_softmax(scaled_scores(x @ w_q, x @ w_k), axis=-1)
