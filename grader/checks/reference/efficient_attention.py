"""References of notebook 14, efficient_attention.

The online softmax and the sliding-window mask are numpy, as notebook 04's softmax and
notebook 03's masks; the attention functions are PyTorch, as the notebook (tensors in,
tensors out). A mask is boolean, True = may attend.
"""
from __future__ import annotations

import numpy as np
import torch

from .multi_head import scaled_dot_product_attention


def online_softmax(x: np.ndarray, block_size: int) -> np.ndarray:
    """(..., n) -> (..., n): softmax over the last axis, the running max m and running sum l
    updated block by block (l rescaled by exp(m_old - m_new)), then exp(x - m) / l.

    Raises:
        ValueError: block_size < 1.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, got {block_size}")
    m = np.full(x.shape[:-1] + (1,), -np.inf)
    l = np.zeros(x.shape[:-1] + (1,))
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        m_new = np.maximum(m, block.max(axis=-1, keepdims=True))
        l = l * np.exp(m - m_new) + np.exp(block - m_new).sum(axis=-1, keepdims=True)
        m = m_new
    return np.exp(x - m) / l


def tiled_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_block: int, k_block: int,
                    causal: bool = False) -> torch.Tensor:
    """(..., q_len, d_k), (..., k_len, d_k), (..., k_len, d_v) -> (..., q_len, d_v): softmax(Q K^T / sqrt(d_k)) V
    one (q_block, k_block) tile of scores at a time, with the online softmax (FlashAttention's forward).
    causal: key j <= query i; tiles wholly above the diagonal are skipped, tiles crossing it masked
    entry by entry at the absolute positions.

    Raises:
        ValueError: q_block or k_block < 1.
    """
    if q_block < 1 or k_block < 1:
        raise ValueError(f"block sizes must be at least 1, got q_block={q_block}, k_block={k_block}")
    q_len, k_len = query.shape[-2], key.shape[-2]
    out = query.new_empty(query.shape[:-1] + value.shape[-1:])
    for qs in range(0, q_len, q_block):
        q = query[..., qs:qs + q_block, :] / query.shape[-1] ** 0.5
        rows = q.shape[-2]
        m = q.new_full(q.shape[:-1] + (1,), float("-inf"))
        l = q.new_zeros(q.shape[:-1] + (1,))
        acc = q.new_zeros(q.shape[:-1] + value.shape[-1:])
        for ks in range(0, k_len, k_block):
            if causal and ks > qs + rows - 1:
                break  # this tile and every later one lie wholly above the diagonal
            s = q @ key[..., ks:ks + k_block, :].transpose(-1, -2)
            if causal and ks + s.shape[-1] - 1 > qs:  # the tile crosses the diagonal
                allowed = torch.arange(qs, qs + rows)[:, None] >= torch.arange(ks, ks + s.shape[-1])[None, :]
                s = s.masked_fill(~allowed, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            alpha, p = torch.exp(m - m_new), torch.exp(s - m_new)
            l = l * alpha + p.sum(dim=-1, keepdim=True)
            acc = acc * alpha + p @ value[..., ks:ks + k_block, :]
            m = m_new
        out[..., qs:qs + rows, :] = acc / l
    return out


def grouped_query_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            mask: torch.Tensor | None = None) -> torch.Tensor:
    """(batch, heads, q_len, d_k), (batch, kv_heads, k_len, d_k), (batch, kv_heads, k_len, d_v) -> (batch,
    heads, q_len, d_v): query head h attends with key/value head h // (heads // kv_heads); the expanded
    multi-head equivalent (repeat_interleave) through notebook 06's attention.

    Raises:
        ValueError: kv_heads does not divide heads.
    """
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % kv_heads:
        raise ValueError(f"kv_heads = {kv_heads} does not divide heads = {heads}")
    key, value = (t.repeat_interleave(heads // kv_heads, dim=1) for t in (key, value))
    return scaled_dot_product_attention(query, key, value, mask)[0]


def kv_cache_bytes(tokens: int, layers: int, d_model: int, heads: int, kv_heads: int, bytes_per_value: int) -> int:
    """Bytes of a decoder's KV cache: a key and a value of d_model // heads numbers per token, layer and
    key/value head.

    Raises:
        ValueError: heads does not divide d_model, or kv_heads does not divide heads.
    """
    if d_model % heads or heads % kv_heads:
        raise ValueError(f"heads = {heads} must divide d_model = {d_model}, kv_heads = {kv_heads} must divide heads")
    return 2 * tokens * layers * kv_heads * (d_model // heads) * bytes_per_value


def sliding_window_mask(seq_len: int, window: int) -> np.ndarray:
    """(seq_len, seq_len) bool: query i may attend to key j when i - window < j <= i (window keys, itself included).

    Raises:
        ValueError: window < 1.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    i, j = np.arange(seq_len)[:, None], np.arange(seq_len)[None, :]
    return (j <= i) & (j > i - window)


def causal_lower_right(q_len: int, k_len: int) -> torch.Tensor:
    """(q_len, k_len) bool, True = may attend: query i sees key j <= i + k_len - q_len, the causal mask
    aligned to the bottom-right corner (torch.nn.attention.bias.causal_lower_right, FlashAttention 2's
    causal=True): the last query sees every key, and q_len = k_len gives the lower triangle."""
    return torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + (k_len - q_len)


def flash_forward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, q_block: int, k_block: int,
                  causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """tiled_attention that also returns the log-sum-exp of each query's scores, L = m + log(l)
    ((..., q_len)), what FlashAttention's forward saves for the backward; causal aligned bottom-right."""
    q_len, k_len = query.shape[-2], key.shape[-2]
    mask = causal_lower_right(q_len, k_len) if causal else None
    scores = query @ key.transpose(-2, -1) / query.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    return torch.exp(scores - lse[..., None]) @ value, lse


def flash_backward(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, out: torch.Tensor,
                   lse: torch.Tensor, grad_out: torch.Tensor, q_block: int, k_block: int,
                   causal: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) of O = softmax(Q K^T / sqrt(d_k)) V for the upstream gradient dO, tile by tile from
    Q, K, V, O, the log-sum-exp L and dO (FlashAttention's backward, Dao et al. 2022, Algorithm 4;
    D = rowsum(dO * O) as in FlashAttention-2, Algorithm 2). causal: key j <= query i + k_len - q_len.

    Raises:
        ValueError: q_block or k_block < 1.
    """
    if q_block < 1 or k_block < 1:
        raise ValueError(f"block sizes must be at least 1, got q_block={q_block}, k_block={k_block}")
    q_len, k_len = query.shape[-2], key.shape[-2]
    scale = query.shape[-1] ** -0.5
    d = (grad_out * out).sum(dim=-1, keepdim=True)
    grad_query, grad_key, grad_value = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    for ks in range(0, k_len, k_block):
        k, v = key[..., ks:ks + k_block, :], value[..., ks:ks + k_block, :]
        for qs in range(0, q_len, q_block):
            q, do = query[..., qs:qs + q_block, :], grad_out[..., qs:qs + q_block, :]
            p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., qs:qs + q_block, None])
            if causal:
                rows, cols = p.shape[-2:]
                allowed = torch.arange(ks, ks + cols)[None, :] <= torch.arange(qs, qs + rows)[:, None] + k_len - q_len
                p = p.masked_fill(~allowed, 0.0)
            grad_value[..., ks:ks + k_block, :] += p.transpose(-2, -1) @ do
            ds = p * (do @ v.transpose(-2, -1) - d[..., qs:qs + q_block, :])
            grad_query[..., qs:qs + q_block, :] += ds @ k * scale
            grad_key[..., ks:ks + k_block, :] += ds.transpose(-2, -1) @ q * scale
    return grad_query, grad_key, grad_value


def rolling_cache_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(..., seq_len, d_k), (..., seq_len, d_k), (..., seq_len, d_v) -> (output (..., seq_len, d_v), key_cache
    (..., window, d_k), value_cache (..., window, d_v)): decoding one token at a time with a rolling buffer of
    `window` slots (Jiang et al. 2023, Mistral 7B, Sec. 2: position i is written at slot i % window); step t
    attends over the slots filled so far, the same as attention with sliding_window_mask(seq_len, window).
    The caches are those after the last step (slots never written are 0).

    Raises:
        ValueError: window < 1.
    """
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    key_cache = key.new_zeros(key.shape[:-2] + (window, key.shape[-1]))
    value_cache = value.new_zeros(value.shape[:-2] + (window, value.shape[-1]))
    output = query.new_empty(query.shape[:-1] + value.shape[-1:])
    for t in range(query.shape[-2]):
        key_cache[..., t % window, :] = key[..., t, :]
        value_cache[..., t % window, :] = value[..., t, :]
        filled = min(t + 1, window)
        scores = key_cache[..., :filled, :] @ query[..., t, :, None] / query.shape[-1] ** 0.5
        output[..., t, :] = (torch.softmax(scores, dim=-2) * value_cache[..., :filled, :]).sum(dim=-2)
    return output, key_cache, value_cache
