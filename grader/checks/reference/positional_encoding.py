"""References of notebook 05, positional_encoding (numpy; shapes as in the notebook)."""
from __future__ import annotations

import numpy as np

from .softmax import stable_softmax

BASE = 10000.0


def self_attention(x: np.ndarray) -> np.ndarray:
    """The notebook's read-only helper: softmax(x x^T / sqrt(d_model)) x for one sentence (seq_len, d_model)."""
    x = np.asarray(x, dtype=np.float64)
    return stable_softmax(x @ x.T / np.sqrt(x.shape[-1])) @ x


def order_gap(x: np.ndarray, order: np.ndarray, pe: np.ndarray | None = None) -> float:
    """max |self_attention(x[order] + pe[:n]) - self_attention(x + pe[:n])[order]|."""
    positions = 0.0 if pe is None else pe[: x.shape[0]]
    return float(np.abs(self_attention(x[order] + positions) - self_attention(x + positions)[order]).max())


def frequencies(d_model: int) -> np.ndarray:
    """(d_model // 2,): w_i = 1 / 10000^(2i / d_model) of the (sin, cos) pairs."""
    return BASE ** (-2.0 * np.arange(d_model // 2) / d_model)


def sinusoidal_encoding(max_len: int, d_model: int) -> np.ndarray:
    """(max_len, d_model): sin on the even columns 2i, cos on the odd 2i + 1, frequency w_i.

    Raises:
        ValueError: max_len < 1 or d_model < 1.
    """
    if max_len < 1 or d_model < 1:
        raise ValueError(f"max_len and d_model must be at least 1, got {max_len} and {d_model}")
    column = np.arange(d_model)
    angles = np.arange(max_len)[:, None] * BASE ** (-2.0 * (column // 2) / d_model)
    return np.where(column % 2 == 0, np.sin(angles), np.cos(angles))


def shift_matrix(k: float, d_model: int) -> np.ndarray:
    """(d_model, d_model): PE[pos + k] = M @ PE[pos]; block i is [[cos, sin], [-sin, cos]] of w_i k.

    Raises:
        ValueError: d_model is odd.
    """
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    m = np.zeros((d_model, d_model))
    for i, w in enumerate(frequencies(d_model)):
        c, s = np.cos(w * k), np.sin(w * k)
        m[2 * i:2 * i + 2, 2 * i:2 * i + 2] = [[c, s], [-s, c]]
    return m


def dot_by_offset(offsets: np.ndarray, d_model: int) -> np.ndarray:
    """The shape of offsets: PE[p] . PE[q] = sum_i cos(w_i (p - q)).

    Raises:
        ValueError: d_model is odd.
    """
    if d_model % 2:
        raise ValueError(f"d_model must be even, got {d_model}")
    return np.cos(np.asarray(offsets, dtype=np.float64)[..., None] * frequencies(d_model)).sum(-1)


def embed(token_ids: np.ndarray, table: np.ndarray, pe: np.ndarray) -> np.ndarray:
    """(batch, seq_len, d_model): table[token_ids] + pe[:seq_len]."""
    return table[token_ids] + pe[: token_ids.shape[1]]
