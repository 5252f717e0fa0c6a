"""References of notebook 03, masking (numpy). A mask is boolean, True = may attend."""
from __future__ import annotations

import numpy as np

from .softmax import stable_softmax


def padding_mask_from_lengths(lengths: np.ndarray, max_len: int) -> np.ndarray:
    """(batch,) -> (batch, max_len): position j of sequence b is real when j < lengths[b]."""
    return np.arange(max_len)[None, :] < np.asarray(lengths)[:, None]


def padding_mask_from_ids(token_ids: np.ndarray, pad_id: int) -> np.ndarray:
    """(batch, seq_len) -> (batch, seq_len): True where the token is not padding."""
    return token_ids != pad_id


def causal_mask(size: int) -> np.ndarray:
    """(size, size): query i may attend to keys j <= i."""
    return np.tril(np.ones((size, size), dtype=bool))


def combine_masks(padding: np.ndarray, causal: np.ndarray | None) -> np.ndarray:
    """(batch, k_len), (q_len, k_len) or None -> (batch, 1, q_len or 1, k_len): both allow."""
    keys = padding[:, None, None, :]
    return keys if causal is None else keys & causal


def apply_mask(scores: np.ndarray, mask: np.ndarray, fill: float = -1e9) -> np.ndarray:
    """scores with ``fill`` where the (broadcasting) mask is False."""
    return np.where(mask, scores, fill)


def masked_softmax(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """softmax over the keys (last axis) with the masked keys given weight 0."""
    return stable_softmax(np.where(mask, scores, -np.inf), axis=-1)
