"""Mistake and variant cases of notebook 14's checks, run in process (no kernel).

The catalogues of grader/checks/efficient_attention.py are asserted by tests/test_catalogue.py;
here are the learner-style answers written independently of them: wrong ones that must get
their diagnosis, and valid alternatives (numpy or torch, float32 or float64, other loop orders,
an accumulator kept normalized, a grouped view instead of a copy) that must score full marks.
Then what the notebook's measurements rest on: coursekit.measure counts bytes and keeps
time in turns.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from coursekit.measure import fastest_seconds, peak_bytes
from grader.checks import check
# (the check the docstrings ask for first, ValueError for a block size below 1, put on every
# learner-style answer here that is about something else)
from grader.checks.efficient_attention import _blocks_checked as blocks_checked
from tests.check_cases import shared_tests
from tests.conftest import solution_namespace

# The mistakes overflow and divide 0 by 0 on purpose.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@pytest.fixture(scope="module")
def efficient_attention_notebook() -> dict:
    """The reference functions of notebook 14 (online_softmax, tiled_attention, ...)."""
    return solution_namespace("14_efficient_attention")


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- online_softmax

@blocks_checked
def _online_torch_float32(x, block_size):
    x = torch.as_tensor(x, dtype=torch.float32)
    m = torch.full(x.shape[:-1] + (1,), float("-inf"))
    s = torch.zeros(x.shape[:-1] + (1,))
    for block in torch.split(x, block_size, dim=-1):
        new = torch.maximum(m, block.amax(dim=-1, keepdim=True))
        s = s * torch.exp(m - new) + torch.exp(block - new).sum(dim=-1, keepdim=True)
        m = new
    return torch.exp(x - m) / s


@blocks_checked
def _online_log_sum_exp(x, block_size):
    """A running log-sum-exp instead of a running maximum and sum."""
    lse = np.full(x.shape[:-1] + (1,), -np.inf)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start:start + block_size]
        top = block.max(axis=-1, keepdims=True)
        lse = np.logaddexp(lse, top + np.log(np.exp(block - top).sum(axis=-1, keepdims=True)))
    return np.exp(x - lse)


def online_from_first_block(factor="m - new"):
    """The running maximum and sum started from the first block, not from -inf and 0, then rescaled by
    exp(factor): valid with exp(m - new), the rescaling factor inverted with exp(new - m)."""
    @blocks_checked
    def online_softmax(x, block_size):
        first = x[..., :block_size]
        m = first.max(axis=-1, keepdims=True)
        s = np.exp(first - m).sum(axis=-1, keepdims=True)
        for start in range(block_size, x.shape[-1], block_size):
            block = x[..., start:start + block_size]
            new = np.maximum(m, block.max(axis=-1, keepdims=True))
            s = s * np.exp(m - new if factor == "m - new" else new - m) + np.exp(block - new).sum(axis=-1, keepdims=True)
            m = new
        return np.exp(x - m) / s
    return online_softmax


@blocks_checked
def _online_entry_by_entry(x, block_size):
    """Milakov & Gimelshein's Algorithm 3 as written: one entry at a time (the blocks ignored,
    the same weights)."""
    m = np.full(x.shape[:-1], -np.inf)
    d = np.zeros(x.shape[:-1])
    for j in range(x.shape[-1]):
        new = np.maximum(m, x[..., j])
        d = d * np.exp(m - new) + np.exp(x[..., j] - new)
        m = new
    return np.exp(x - m[..., None]) / d[..., None]


@blocks_checked
def _online_torch_no_rescale(x, block_size):
    x = torch.as_tensor(x)
    m, s = torch.tensor(float("-inf")).expand(x.shape[:-1] + (1,)), torch.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
    for block in x.split(block_size, dim=-1):
        m = torch.maximum(m, block.max(dim=-1, keepdim=True).values)
        s = s + torch.exp(block - m).sum(dim=-1, keepdim=True)
    return torch.exp(x - m) / s


@blocks_checked
def _online_torch_no_division(x, block_size):
    x = torch.as_tensor(x)
    m = x[..., :1].clone()
    for block in x.split(block_size, dim=-1):
        m = torch.maximum(m, block.max(dim=-1, keepdim=True).values)
    return torch.exp(x - m)


@blocks_checked
def _online_inverted_torch(x, block_size):
    """torch, the running maximum from -inf, the rescaling factor exp(m_new - m_old)."""
    x = torch.as_tensor(x)
    m = torch.full(x.shape[:-1] + (1,), -math.inf, dtype=x.dtype)
    d = torch.zeros_like(m)
    for block in x.split(block_size, dim=-1):
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        d = d * (m_new - m).exp() + (block - m_new).exp().sum(-1, keepdim=True)
        m = m_new
    return (x - m).exp() / d


def _online_split_unchecked(x, block_size):
    """No check of its own: torch.split raises RuntimeError at 0 and a negative block is an empty loop."""
    return _online_torch_float32.__wrapped__(x, block_size)


# ---------------------------------------------------------------- tiled_attention

def flash_algorithm_1(slip=None):
    """Dao et al. (2022), FlashAttention, Algorithm 1 as printed: key/value blocks in the outer
    loop, the query blocks inside; l and m per row kept for every query; the tile's own row maximum
    m~, P~ = exp(S - m~), l~ its row sums; O_i <- diag(l_new)^-1 (diag(l) e^(m - m_new) O_i +
    e^(m~ - m_new) P~ V_j): O normalised after every tile. With the scale 1 / sqrt(d_k) and the
    causal mask of the docstring (a row wholly masked in a tile has m~ = -inf: measured from 0
    instead, its P~ is 0). ``slip`` is a transcription slip."""
    @blocks_checked
    def tiled_attention(query, key, value, q_block, k_block, causal=False):
        n, d = query.shape[-2], query.shape[-1]
        O = torch.zeros(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)
        l = torch.zeros(query.shape[:-1] + (1,), dtype=query.dtype)
        m = torch.full(query.shape[:-1] + (1,), -math.inf, dtype=query.dtype)
        for j in range(0, key.shape[-2], k_block):
            K_j, V_j = key[..., j:j + k_block, :], value[..., j:j + k_block, :]
            for i in range(0, n, q_block):
                rows = slice(i, min(i + q_block, n))
                if causal and j > rows.stop - 1:
                    continue
                S = query[..., rows, :] @ K_j.transpose(-2, -1) / math.sqrt(d)
                if causal:
                    S = S.masked_fill(torch.arange(i, rows.stop)[:, None] < torch.arange(j, j + K_j.shape[-2]),
                                      -math.inf)
                m_t = S.amax(-1, keepdim=True)
                P_t = torch.exp(S - m_t.nan_to_num(neginf=0.0))
                l_t = P_t.sum(-1, keepdim=True)
                m_i, l_i = m[..., rows, :], l[..., rows, :]
                m_new = torch.maximum(m_i, m_t)
                new = 1.0 if slip == "block max only" else torch.exp(m_t.nan_to_num(neginf=0.0) - m_new)
                old = 1.0 if slip == "O not rescaled" else torch.exp(m_i - m_new)
                l_new = torch.exp(m_i - m_new) * l_i + new * l_t
                kept = l_i * l_i if slip == "l twice" else l_i
                O[..., rows, :] = (kept * old * O[..., rows, :] + new * (P_t @ V_j)) / l_new
                l[..., rows, :] = l_new
                m[..., rows, :] = m_t if slip == "block max kept" else m_new
        return O / l if slip == "divided again" else O
    return tiled_attention


def tiled_flash2(scale=lambda d_k: d_k ** -0.5, skipped=lambda k_start, last_query: k_start > last_query):
    """FlashAttention-2's loop (query blocks outside), the scores multiplied by ``scale(d_k)``, a key
    block skipped under the causal mask when ``skipped(k_start, last query of the block)``."""
    @blocks_checked
    def tiled_attention(query, key, value, q_block, k_block, causal=False):
        out = torch.empty(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)
        for qs in range(0, query.shape[-2], q_block):
            q = query[..., qs:qs + q_block, :] * scale(query.shape[-1])
            last = qs + q.shape[-2] - 1
            m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
            l, acc = torch.zeros_like(m), torch.zeros(q.shape[:-1] + value.shape[-1:], dtype=q.dtype)
            for ks in range(0, key.shape[-2], k_block):
                if causal and skipped(ks, last):
                    break
                scores = q @ key[..., ks:ks + k_block, :].transpose(-2, -1)
                if causal:
                    scores = scores.masked_fill(torch.arange(qs, last + 1)[:, None]
                                                < torch.arange(ks, ks + scores.shape[-1]), -math.inf)
                m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
                alpha, p = torch.exp(m - m_new), torch.exp(scores - m_new)
                l, acc, m = l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ value[..., ks:ks + k_block, :], m_new
            out[..., qs:last + 1, :] = acc / l
        return out
    return tiled_attention


@blocks_checked
def _tiled_inverted_factor(query, key, value, q_block, k_block, causal=False):
    """FlashAttention-2's loop with exp(m_new - m) where exp(m - m_new) is due."""
    out = torch.empty(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :] / math.sqrt(query.shape[-1])
        m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        l, acc = torch.zeros_like(m), torch.zeros(q.shape[:-1] + value.shape[-1:], dtype=q.dtype)
        for ks in range(0, key.shape[-2], k_block):
            scores = q @ key[..., ks:ks + k_block, :].transpose(-2, -1)
            if causal:
                scores = scores.masked_fill(torch.arange(qs, qs + q.shape[-2])[:, None]
                                            < torch.arange(ks, ks + scores.shape[-1]), -math.inf)
            m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
            alpha, p = torch.exp(m_new - m), torch.exp(scores - m_new)
            l, acc, m = l * alpha + p.sum(-1, keepdim=True), acc * alpha + p @ value[..., ks:ks + k_block, :], m_new
        out[..., qs:qs + q_block, :] = acc / l
    return out



@blocks_checked
def _tiled_normalized(query, key, value, q_block, k_block, causal=False):
    """FlashAttention-1's bookkeeping: the output kept normalized after every tile."""
    out = torch.empty(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)
    scale = query.shape[-1] ** -0.5
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :]
        rows = q.shape[-2]
        m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        s = torch.zeros_like(m)
        o = torch.zeros(q.shape[:-1] + value.shape[-1:], dtype=q.dtype)
        for ks in range(0, key.shape[-2], k_block):
            if causal and ks >= qs + rows:
                continue
            scores = torch.einsum("...qd,...kd->...qk", q, key[..., ks:ks + k_block, :]) * scale
            if causal:
                visible = torch.arange(qs, qs + rows)[:, None] >= torch.arange(ks, ks + scores.shape[-1])
                scores = torch.where(visible, scores, -math.inf)
            new = torch.maximum(m, scores.max(dim=-1, keepdim=True).values)
            p = torch.exp(scores - new)
            s_new = s * torch.exp(m - new) + p.sum(dim=-1, keepdim=True)
            o = (o * s * torch.exp(m - new) + p @ value[..., ks:ks + k_block, :]) / s_new
            m, s = new, s_new
        out[..., qs:qs + rows, :] = o
    return out


@blocks_checked
def _tiled_float32_full_mask(query, key, value, q_block, k_block, causal=False):
    """float32 throughout, the causal mask built once (q_len, k_len) and cut into tiles."""
    query, key, value = (t.float() for t in (query, key, value))
    allowed = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril()
    out = torch.zeros(query.shape[:-1] + value.shape[-1:])
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :] / math.sqrt(query.shape[-1])
        m = torch.full(q.shape[:-1] + (1,), -math.inf)
        total, acc = torch.zeros_like(m), torch.zeros(q.shape[:-1] + value.shape[-1:])
        last = qs + q.shape[-2] - 1
        for ks in range(0, key.shape[-2] if not causal else last + 1, k_block):
            scores = q @ key[..., ks:ks + k_block, :].mT
            if causal:
                scores = scores.masked_fill(~allowed[qs:qs + q_block, ks:ks + k_block], -math.inf)
            new = torch.maximum(m, scores.amax(-1, keepdim=True))
            f = (m - new).exp()
            p = (scores - new).exp()
            total, acc, m = total * f + p.sum(-1, keepdim=True), acc * f + p @ value[..., ks:ks + k_block, :], new
        out[..., qs:qs + q_block, :] = acc / total
    return out


@blocks_checked
def _tiled_keys_outside(query, key, value, q_block, k_block, causal=False):
    """FlashAttention-1's loop order: key blocks outside, every query's running state kept."""
    q_len = query.shape[-2]
    m = torch.full(query.shape[:-1] + (1,), -math.inf, dtype=query.dtype)
    total = torch.zeros_like(m)
    acc = torch.zeros(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)
    for ks in range(0, key.shape[-2], k_block):
        k, v = key[..., ks:ks + k_block, :], value[..., ks:ks + k_block, :]
        for qs in range(0, q_len, q_block):
            rows = min(q_block, q_len - qs)
            if causal and ks > qs + rows - 1:
                continue
            scores = query[..., qs:qs + rows, :] @ k.transpose(-2, -1) / math.sqrt(query.shape[-1])
            if causal:
                scores = scores.masked_fill(torch.arange(qs, qs + rows)[:, None] < torch.arange(ks, ks + k.shape[-2]),
                                            -math.inf)
            part = slice(qs, qs + rows)
            new = torch.maximum(m[..., part, :], scores.amax(-1, keepdim=True))
            f, p = torch.exp(m[..., part, :] - new), torch.exp(scores - new)
            total[..., part, :] = total[..., part, :] * f + p.sum(-1, keepdim=True)
            acc[..., part, :] = acc[..., part, :] * f + p @ v
            m[..., part, :] = new
    return acc / total


@blocks_checked
def _tiled_trimmed_diagonal(query, key, value, q_block, k_block, causal=False):
    """Under the causal mask, a tile that crosses the diagonal is cut to the keys its last query
    may see before its scores are computed: fewer wasted scores, the same answer."""
    out = query.new_empty(query.shape[:-1] + value.shape[-1:])
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :] * query.shape[-1] ** -0.5
        last = qs + q.shape[-2] - 1
        m = q.new_full(q.shape[:-1] + (1,), -math.inf)
        total, acc = q.new_zeros(q.shape[:-1] + (1,)), q.new_zeros(q.shape[:-1] + value.shape[-1:])
        for ks in range(0, key.shape[-2], k_block):
            ke = min(ks + k_block, key.shape[-2], last + 1) if causal else min(ks + k_block, key.shape[-2])
            if ke <= ks:
                break
            scores = q @ key[..., ks:ke, :].transpose(-1, -2)
            if causal:
                scores = scores.masked_fill(torch.arange(qs, last + 1)[:, None] < torch.arange(ks, ke), -math.inf)
            new = torch.maximum(m, scores.amax(-1, keepdim=True))
            p = torch.exp(scores - new)
            total = total * torch.exp(m - new) + p.sum(-1, keepdim=True)
            acc = acc * torch.exp(m - new) + p @ value[..., ks:ke, :]
            m = new
        out[..., qs:last + 1, :] = acc / total
    return out


@blocks_checked
def _tiled_no_acc_rescale(query, key, value, q_block, k_block, causal=False):
    out = torch.empty(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :] / math.sqrt(query.shape[-1])
        m = torch.full(q.shape[:-1] + (1,), -math.inf, dtype=q.dtype)
        total = torch.zeros_like(m)
        acc = torch.zeros(q.shape[:-1] + value.shape[-1:], dtype=q.dtype)
        for ks in range(0, key.shape[-2], k_block):
            if causal and ks > qs + q.shape[-2] - 1:
                break
            scores = q @ key[..., ks:ks + k_block, :].transpose(-2, -1)
            if causal:
                scores = scores.masked_fill(torch.arange(qs, qs + q.shape[-2])[:, None]
                                            < torch.arange(ks, ks + scores.shape[-1]), -math.inf)
            new = torch.maximum(m, scores.amax(-1, keepdim=True))
            total = total * torch.exp(m - new) + torch.exp(scores - new).sum(-1, keepdim=True)
            acc = acc + torch.exp(scores - new) @ value[..., ks:ks + k_block, :]
            m = new
        out[..., qs:qs + q_block, :] = acc / total
    return out


@blocks_checked
def _tiled_causal_tiles_only(query, key, value, q_block, k_block, causal=False):
    """Under the causal mask, each query block attends, unmasked, to every key of the tiles it
    keeps: up to the end of the key block that holds its last query."""
    outputs = []
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :]
        end = key.shape[-2] if not causal else min(key.shape[-2], ((qs + q.shape[-2] - 1) // k_block + 1) * k_block)
        outputs.append(F.scaled_dot_product_attention(q, key[..., :end, :], value[..., :end, :]))
    return torch.cat(outputs, dim=-2)


@blocks_checked
def _tiled_masks_every_tile(query, key, value, q_block, k_block, causal=False):
    """Right values from every tile computed and masked: nothing skipped."""
    mask = torch.ones(query.shape[-2], key.shape[-2], dtype=torch.bool).tril() if causal else None
    out = []
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :]
        scores = q @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask[qs:qs + q_block], -math.inf)
        out.append(torch.softmax(scores, dim=-1) @ value)
    return torch.cat(out, dim=-2)


def _tiled_numpy(query, key, value, q_block, k_block, causal=False):
    scores = np.asarray(query) @ np.swapaxes(np.asarray(key), -1, -2) / math.sqrt(query.shape[-1])
    e = np.exp(scores - scores.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)) @ np.asarray(value)


def _tiled_no_return(query, key, value, q_block, k_block, causal=False):
    _tiled_normalized(query, key, value, q_block, k_block, causal)


# ---------------------------------------------------------------- grouped_query_attention

def _gqa_grouped_view(query, key, value, mask=None):
    """No copy: the query heads viewed as (batch, kv_heads, group, q_len, d_k), keys broadcast."""
    b, heads, q_len, d_k = query.shape
    kv_heads = key.shape[1]
    if heads % kv_heads:
        raise ValueError("heads must be a multiple of kv_heads")
    q = query.reshape(b, kv_heads, heads // kv_heads, q_len, d_k)
    scores = q @ key.unsqueeze(2).transpose(-2, -1) / math.sqrt(d_k)        # (b, kv, g, q, k)
    if mask is not None:
        mask = torch.as_tensor(mask)
        full = mask.expand(b, heads, q_len, key.shape[2]) if mask.dim() == 4 else mask.expand(b, heads, *mask.shape[-2:])
        scores = scores.masked_fill(~full.reshape(scores.shape), float("-inf"))
    return (torch.softmax(scores, dim=-1) @ value.unsqueeze(2)).reshape(b, heads, q_len, -1)


def _gqa_per_head(query, key, value, mask=None):
    heads, kv_heads = query.shape[1], key.shape[1]
    if heads % kv_heads != 0:
        raise ValueError(f"{kv_heads} key/value heads cannot serve {heads} query heads")
    outputs = []
    for h in range(heads):
        g = h // (heads // kv_heads)
        scores = torch.einsum("bqd,bkd->bqk", query[:, h], key[:, g]) / query.shape[-1] ** 0.5
        if mask is not None:
            m = mask if mask.dim() < 4 else mask[:, 0]
            scores = scores.masked_fill(~m, -1e9)
        outputs.append(torch.softmax(scores, dim=-1) @ value[:, g])
    return torch.stack(outputs, dim=1)


def _gqa_expand(query, key, value, mask=None):
    b, kv_heads, k_len, d_k = key.shape
    group, rest = divmod(query.shape[1], kv_heads)
    if rest:
        raise ValueError("kv_heads must divide heads")
    k = key[:, :, None].expand(b, kv_heads, group, k_len, d_k).reshape(b, -1, k_len, d_k)
    v = value[:, :, None].expand(b, kv_heads, group, k_len, value.shape[-1]).reshape(b, -1, k_len, value.shape[-1])
    return F.scaled_dot_product_attention(query.float(), k.float(), v.float(), attn_mask=mask)


def _gqa_builtin(query, key, value, mask=None):
    if query.shape[1] % key.shape[1]:
        raise ValueError("kv_heads must divide heads")
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)


def _gqa_repeat(query, key, value, mask=None):
    group = query.shape[1] // key.shape[1]
    if query.shape[1] % key.shape[1]:
        raise ValueError("kv_heads must divide heads")
    return F.scaled_dot_product_attention(query, key.repeat(1, group, 1, 1), value.repeat(1, group, 1, 1),
                                          attn_mask=mask)


def _gqa_modulo_loop(query, key, value, mask=None):
    """A per-head loop that pairs head h with key/value head h % kv_heads."""
    if query.shape[1] % key.shape[1]:
        raise ValueError("kv_heads must divide heads")
    kv = key.shape[1]
    return torch.stack([F.scaled_dot_product_attention(query[:, h], key[:, h % kv], value[:, h % kv],
                                                       attn_mask=None if mask is None else
                                                       (mask if mask.dim() < 4 else mask[:, 0]))
                        for h in range(query.shape[1])], dim=1)


def _gqa_unchecked(query, key, value, mask=None):
    group = query.shape[1] // key.shape[1]
    return F.scaled_dot_product_attention(query, key.repeat_interleave(group, 1), value.repeat_interleave(group, 1),
                                          attn_mask=mask)


def _gqa_no_mask(query, key, value, mask=None):
    return _gqa_builtin(query, key, value)


def _gqa_expand_groups_first(query, key, value, mask=None):
    """The key/value heads expanded along a new axis in front of them, (batch, group, kv_heads, ...),
    then flattened: head h gets key/value head h % kv_heads, as .repeat would."""
    b, kv_heads, k_len, d_k = key.shape
    group, rest = divmod(query.shape[1], kv_heads)
    if rest:
        raise ValueError("kv_heads must divide heads")
    k = key[:, None].expand(b, group, kv_heads, k_len, d_k).reshape(b, -1, k_len, d_k)
    v = value[:, None].expand(b, group, *value.shape[1:]).reshape(b, -1, k_len, value.shape[-1])
    return F.scaled_dot_product_attention(query, k, v, attn_mask=mask)


# ---------------------------------------------------------------- kv_cache_bytes

def _kv_prod(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
    if d_model % heads or heads % kv_heads:
        raise ValueError("the heads do not divide evenly")
    return math.prod([2, tokens, layers, kv_heads, d_model // heads, bytes_per_value])


def _kv_float(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
    if d_model % heads != 0:
        raise ValueError("heads must divide d_model")
    if heads % kv_heads != 0:
        raise ValueError("kv_heads must divide heads")
    per_token = 2 * layers * kv_heads * (d_model / heads) * bytes_per_value
    return np.float64(per_token * tokens)


def _kv_keys_only(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
    if d_model % heads or heads % kv_heads:
        raise ValueError("no")
    return tokens * layers * kv_heads * (d_model // heads) * bytes_per_value


def _kv_mha(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
    if d_model % heads or heads % kv_heads:
        raise ValueError("no")
    return 2 * tokens * layers * d_model * bytes_per_value


def _kv_unchecked(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
    return 2 * tokens * layers * kv_heads * (d_model // heads) * bytes_per_value


def _kv_per_group(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
    """The group size heads // kv_heads taken for the number of key/value heads."""
    if d_model % heads or heads % kv_heads:
        raise ValueError("the heads do not divide evenly")
    d_head = d_model // heads
    return 2 * tokens * layers * (heads // kv_heads) * d_head * bytes_per_value


def _kv_one_layer(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
    if d_model % heads or heads % kv_heads:
        raise ValueError("the heads do not divide evenly")
    per_token = 2 * kv_heads * (d_model // heads) * bytes_per_value
    return tokens * per_token


# ---------------------------------------------------------------- sliding_window_mask

def _window_torch(seq_len, window):
    if window < 1:
        raise ValueError("window must be positive")
    return torch.ones(seq_len, seq_len).tril().triu(-(window - 1)).bool()


def _window_difference(seq_len, window):
    if window <= 0:
        raise ValueError("a window holds at least one key")
    ones = np.ones((seq_len, seq_len), dtype=bool)
    return np.tril(ones) & ~np.tril(ones, k=-window)


def _window_lists(seq_len, window):
    if window < 1:
        raise ValueError("window < 1")
    return [[i - window < j <= i for j in range(seq_len)] for i in range(seq_len)]


def _window_torch_plus_one(seq_len, window):
    if window < 1:
        raise ValueError("window must be positive")
    return torch.ones(seq_len, seq_len).tril().triu(-window).bool()


def _window_one_too_few(seq_len, window):
    """np.triu's diagonal -window + 1 taken one too far: window - 1 keys per query."""
    if window < 1:
        raise ValueError("window must be positive")
    ones = np.ones((seq_len, seq_len), dtype=bool)
    return np.tril(ones) & np.triu(ones, k=-window + 2)


def _window_strictly_before(seq_len, window):
    """np.tril's diagonal -1: the keys strictly before the query, within the window."""
    if window < 1:
        raise ValueError("window must be positive")
    ones = np.ones((seq_len, seq_len), dtype=bool)
    return np.tril(ones, k=-1) & np.triu(ones, k=-(window - 1))


def _window_symmetric(seq_len, window):
    if window < 1:
        raise ValueError("window must be positive")
    i = np.arange(seq_len)
    return np.abs(i[:, None] - i[None, :]) < window


def _window_no_check(seq_len, window):
    i = np.arange(seq_len)
    return (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - window)


# ---------------------------------------------------------------- flash_backward

def flash2_backward(slip=None):
    """FlashAttention-2's loop order written out (Dao 2023, Algorithm 2): the query blocks outside, the key
    blocks inside, D of the query block first, float32 throughout, an einsum for every product, the tiles
    wholly above the diagonal skipped. ``slip`` is one learner's mistake."""
    @blocks_checked
    def flash_backward(query, key, value, out, lse, grad_out, q_block, k_block, causal=False):
        query, key, value, out, lse, grad_out = (t.float() for t in (query, key, value, out, lse, grad_out))
        n_q, n_k, d_k = query.size(-2), key.size(-2), query.size(-1)
        shift = n_k - n_q if slip != "top-left" else 0
        dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
        for qs in range(0, n_q, q_block):
            qe = min(qs + q_block, n_q)
            q, o, do, L = query[..., qs:qe, :], out[..., qs:qe, :], grad_out[..., qs:qe, :], lse[..., qs:qe]
            D = (do * o).sum(-1) if slip != "no D" else torch.zeros_like(L)
            for ks in range(0, n_k, k_block):
                ke = min(ks + k_block, n_k)
                if causal and slip != "no mask" and ks > qe - 1 + shift:
                    break                                   # every later key block is hidden from these queries
                k, v = key[..., ks:ke, :], value[..., ks:ke, :]
                s = torch.einsum("...id,...jd->...ij", q, k) / math.sqrt(d_k)
                p = torch.exp(s - L.unsqueeze(-1)) if slip != "no L" else torch.exp(s)
                if causal and slip != "no mask":
                    hidden = torch.arange(ks, ke)[None, :] > torch.arange(qs, qe)[:, None] + shift
                    p = p.masked_fill(hidden, 0.0)
                dv[..., ks:ke, :] += torch.einsum("...ij,...id->...jd", p, do)
                dp = torch.einsum("...id,...jd->...ij", do, v)
                ds = p * (dp - D.unsqueeze(-1))
                dq[..., qs:qe, :] += torch.einsum("...ij,...jd->...id", ds, k) / math.sqrt(d_k)
                dk[..., ks:ke, :] += torch.einsum("...ij,...id->...jd", ds, q) / (
                    math.sqrt(d_k) if slip != "dK unscaled" else 1.0)
        return dq, dk, dv
    return flash_backward


@blocks_checked
def _backward_algorithm_4(query, key, value, out, lse, grad_out, q_block, k_block, causal=False):
    """Dao et al. (2022), Algorithm 4's loop order: the key blocks outside; D_i = rowsum(dO_i * O_i)
    recomputed in every tile (as FlashAttention-1 does); the scale put on Q once, so that dQ is
    dS K times the scale; the causal mask from a bottom-right tril."""
    scale = 1 / math.sqrt(query.shape[-1])
    q_scaled = query * scale
    dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    n_q, n_k = query.shape[-2], key.shape[-2]
    visible = torch.ones(n_q, n_k, dtype=torch.bool).tril(diagonal=n_k - n_q)
    for j in range(0, n_k, k_block):
        K_j, V_j = key[..., j:j + k_block, :], value[..., j:j + k_block, :]
        for i in range(0, n_q, q_block):
            S = q_scaled[..., i:i + q_block, :] @ K_j.mT
            P = torch.exp(S - lse[..., i:i + q_block].unsqueeze(-1))
            if causal:
                P = P * visible[i:i + q_block, j:j + k_block]
            dO_i = grad_out[..., i:i + q_block, :]
            dv[..., j:j + k_block, :] += P.mT @ dO_i
            D_i = (dO_i * out[..., i:i + q_block, :]).sum(-1, keepdim=True)
            dS = P * (dO_i @ V_j.mT - D_i)
            dq[..., i:i + q_block, :] += dS @ K_j * scale
            dk[..., j:j + k_block, :] += dS.mT @ q_scaled[..., i:i + q_block, :]
    return dq, dk, dv


@blocks_checked
def _backward_dv_wrong_side(query, key, value, out, lse, grad_out, q_block, k_block, causal=False):
    """dV's tile as dO^T P: its axes swapped."""
    grads = list(flash2_backward()(query, key, value, out, lse, grad_out, q_block, k_block, causal))
    for ks in range(0, key.shape[-2], k_block):
        for qs in range(0, query.shape[-2], q_block):
            s = query[..., qs:qs + q_block, :] @ key[..., ks:ks + k_block, :].mT / math.sqrt(query.shape[-1])
            grads[2][..., ks:ks + k_block, :] += grad_out[..., qs:qs + q_block, :].mT @ torch.exp(
                s - lse[..., qs:qs + q_block, None])
    return tuple(grads)


# ---------------------------------------------------------------- rolling_cache_attention

def rolling_sdpa(slip=None):
    """One step at a time through PyTorch's attention over the slots written so far, float32, the slot
    from a write pointer that wraps round (ring buffer). ``slip`` is one learner's mistake."""
    def rolling_cache_attention(query, key, value, window):
        if window < 1:
            raise ValueError("the buffer needs at least one slot")
        query, key, value = query.float(), key.float(), value.float()
        k_buf = torch.zeros(*key.shape[:-2], window, key.shape[-1])
        v_buf = torch.zeros(*value.shape[:-2], window, value.shape[-1])
        outputs, pointer, written = [], 0, 0
        for t in range(query.shape[-2]):
            if slip == "roll":                          # shift everything left, newest at the end
                k_buf, v_buf = k_buf.roll(-1, dims=-2), v_buf.roll(-1, dims=-2)
                k_buf[..., -1, :], v_buf[..., -1, :] = key[..., t, :], value[..., t, :]
            else:
                k_buf[..., pointer, :], v_buf[..., pointer, :] = key[..., t, :], value[..., t, :]
                pointer = (pointer + 1) % window
            written = min(written + 1, window)
            held = slice(window - written, window) if slip == "roll" else slice(0, window if slip == "zeros" else written)
            outputs.append(F.scaled_dot_product_attention(query[..., t:t + 1, :], k_buf[..., held, :], v_buf[..., held, :]))
        return torch.cat(outputs, dim=-2), k_buf, v_buf
    return rolling_cache_attention


def _rolling_einsum(query, key, value, window):
    """numpy-like indexing of the slot, einsum scores, float64."""
    if window <= 0:
        raise ValueError("window must be positive")
    *lead, n, d_k = query.shape
    kc, vc = key.new_zeros(*lead, window, d_k), value.new_zeros(*lead, window, value.shape[-1])
    out = []
    for t in range(n):
        kc[..., t % window, :] = key[..., t, :]
        vc[..., t % window, :] = value[..., t, :]
        n_held = t + 1 if t < window else window
        w = torch.softmax(torch.einsum("...d,...jd->...j", query[..., t, :], kc[..., :n_held, :]) / math.sqrt(d_k), -1)
        out.append(torch.einsum("...j,...jd->...d", w, vc[..., :n_held, :]))
    return torch.stack(out, dim=-2), kc, vc


def _rolling_growing(query, key, value, window):
    """The cache as a list that grows; the window applied by slicing the last window entries."""
    if window < 1:
        raise ValueError("window must be positive")
    keys, values, out = [], [], []
    for t in range(query.shape[-2]):
        keys.append(key[..., t, :])
        values.append(value[..., t, :])
        k, v = torch.stack(keys[-window:], -2), torch.stack(values[-window:], -2)
        out.append(F.scaled_dot_product_attention(query[..., t:t + 1, :], k, v)[..., 0, :])
    return torch.stack(out, -2), torch.stack(keys, -2), torch.stack(values, -2)


MISTAKES = {
    "efficient_attention-online_softmax": [
        (_online_torch_no_rescale, "not rescaled when the running maximum grows"),
        (_online_torch_no_division, "the final division is missing"),
        (stub, "not answered yet"),
        (lambda x, block_size: None, "returns nothing (None)"),
        (online_from_first_block("new - m"), "the rescaling factor is inverted"),
        (_online_inverted_torch, "NaN or infinity at moderate scores: the rescaling factor is inverted"),
        (_online_split_unchecked, "it should raise ValueError, as the docstring says"),
    ],
    "efficient_attention-tiled_attention": [
        (_tiled_no_acc_rescale, "accumulator is not rescaled"),
        (_tiled_causal_tiles_only, "applied to whole tiles only"),
        (_tiled_masks_every_tile, "tiles that lie wholly above the diagonal are computed"),
        (_tiled_numpy, "the tensors are PyTorch here"),
        (_tiled_no_return, "returns nothing (None)"),
        (stub, "not answered yet"),
        (flash_algorithm_1("O not rescaled"), "the output accumulator is not rescaled"),
        (flash_algorithm_1("l twice"), "the accumulator is multiplied by the running sum l"),
        (flash_algorithm_1("divided again"), "the output is divided by the running sum l twice"),
        (flash_algorithm_1("block max only"), "measured from the tile's own row maximum"),
        (flash_algorithm_1("block max kept"), "the running maximum is replaced by the tile's own row maximum"),
        (_tiled_inverted_factor, "NaN or infinity at moderate scores, no mask: the rescaling factor is inverted"),
        (tiled_flash2(scale=lambda d_k: d_k ** 0.5), "it multiplies the scores by sqrt(d_k)"),
        (tiled_flash2(skipped=lambda k_start, last_query: k_start >= last_query), "it skips one tile too many"),
    ],
    "efficient_attention-flash_backward": [
        (flash2_backward("no D"), "D is missing from dS"),
        (flash2_backward("no L"), "without subtracting the log-sum-exp"),
        (flash2_backward("dK unscaled"), "dK is missing the scale"),
        (flash2_backward("no mask"), "the causal mask is not applied in the backward"),
        (flash2_backward("top-left"), "the causal mask is aligned top-left"),
        (_backward_dv_wrong_side, "A product of a tile has the wrong axes"),
        (stub, "not answered yet"),
    ],
    "efficient_attention-grouped_query_attention": [
        (_gqa_repeat, "reads key/value head h % kv_heads"),
        (_gqa_modulo_loop, "reads key/value head h % kv_heads"),
        (_gqa_expand_groups_first, "reads key/value head h % kv_heads"),
        (_gqa_unchecked, "it should raise ValueError"),
        (_gqa_no_mask, "it ignores the mask"),
        (stub, "not answered yet"),
    ],
    "efficient_attention-kv_cache_bytes": [
        (_kv_keys_only, "a factor 2"),
        (_kv_mha, "counts every query head"),
        (_kv_per_group, "it counts heads // kv_heads heads"),
        (_kv_one_layer, "it leaves out the layers"),
        (_kv_unchecked, "it should raise ValueError"),
        (stub, "not answered yet"),
    ],
    "efficient_attention-sliding_window_mask": [
        (_window_torch_plus_one, "window + 1 keys"),
        (_window_symmetric, "both sides of the diagonal"),
        (_window_one_too_few, "window - 1 keys"),
        (_window_strictly_before, "a query does not see itself (j < i, off by one at the diagonal)"),
        (_window_no_check, "it should raise ValueError"),
        (stub, "not answered yet"),
    ],
    "efficient_attention-rolling_cache_attention": [
        (rolling_sdpa("roll"), "the buffer is shifted by one slot at every step"),
        (rolling_sdpa("zeros"), "the slots not yet written (zeros) take part in the softmax"),
        (_rolling_growing, "the cache keeps every token"),
        (stub, "not answered yet"),
    ],
}

VARIANTS = {
    "efficient_attention-online_softmax": [
        _online_torch_float32,
        _online_log_sum_exp,
        online_from_first_block(),
        _online_entry_by_entry,
    ],
    "efficient_attention-tiled_attention": [
        _tiled_normalized,
        _tiled_float32_full_mask,
        _tiled_keys_outside,
        _tiled_trimmed_diagonal,
        flash_algorithm_1(),
        tiled_flash2(),
    ],
    "efficient_attention-flash_backward": [
        flash2_backward(),
        _backward_algorithm_4,
    ],
    "efficient_attention-grouped_query_attention": [
        _gqa_grouped_view,
        _gqa_per_head,
        _gqa_expand,
        _gqa_builtin,
    ],
    "efficient_attention-kv_cache_bytes": [
        _kv_prod,
        _kv_float,
    ],
    "efficient_attention-sliding_window_mask": [
        _window_torch,
        _window_difference,
        _window_lists,
    ],
    "efficient_attention-rolling_cache_attention": [
        rolling_sdpa(),
        _rolling_einsum,
    ],
}


globals().update(shared_tests("efficient_attention", MISTAKES, VARIANTS, solutions="efficient_attention_notebook",
                              seeds=8))


def test_tiled_reference_matches_pytorch_for_many_tile_shapes(efficient_attention_notebook):
    """The notebook's claim, beyond the hidden questions: any tile shape gives PyTorch's attention."""
    tiled = efficient_attention_notebook["tiled_attention"]
    torch.manual_seed(3)
    q, k, v = torch.randn(2, 3, 13, 6, dtype=torch.float64), torch.randn(2, 3, 13, 6, dtype=torch.float64), \
        torch.randn(2, 3, 13, 4, dtype=torch.float64)
    for q_block, k_block in [(1, 13), (13, 1), (2, 5), (5, 2), (7, 7), (20, 3)]:
        for causal in (False, True):
            torch.testing.assert_close(tiled(q, k, v, q_block, k_block, causal=causal),
                                       F.scaled_dot_product_attention(q, k, v, is_causal=causal))


def test_peak_bytes_counts_what_a_call_holds_at_once():
    n = 1000
    x = torch.ones(n)
    assert peak_bytes(lambda: None) == 0
    # one temporary of n float32 numbers, then a result of n: at most two held at once
    assert 2 * 4 * n <= peak_bytes(lambda: (x * 2) + 1) <= 2 * 4 * n + 64
    # a score matrix of (heads, n, n) float32 numbers held with its softmax: twice its size at least
    heads, length = 2, 256
    q = torch.randn(1, heads, length, 8)
    held = peak_bytes(lambda: torch.softmax(q @ q.transpose(-2, -1), dim=-1))
    assert 2 * heads * length * length * 4 <= held <= 3 * heads * length * length * 4
    assert peak_bytes(lambda: torch.softmax(q @ q.transpose(-2, -1), dim=-1)) == held, "a count, the same every time"


def test_fastest_seconds_runs_every_call_in_turns_and_keeps_the_fastest():
    order = []
    best = fastest_seconds({"a": lambda: order.append("a"), "b": lambda: order.append("b")}, repeats=3, at_least=0)
    assert order == ["a", "b"] * 3 and list(best) == ["a", "b"] and all(0 <= s < 1 for s in best.values())
    calls = []
    fastest_seconds({"quick": lambda: calls.append(1)}, repeats=1, at_least=10.0, most=7)
    assert len(calls) == 7, "a quick call runs until it has spent at_least seconds, or most rounds"
    with pytest.raises(ValueError, match="at least 1"):
        fastest_seconds({"a": lambda: None}, repeats=0)


def test_checks_do_not_trust_inputs_changed_in_place():
    def in_place(x, block_size):
        if block_size < 1:
            raise ValueError("block_size must be at least 1")
        x -= x.max(axis=-1, keepdims=True)
        np.exp(x, out=x)
        x /= x.sum(axis=-1, keepdims=True)
        return x
    check("efficient_attention-online_softmax", in_place)


def test_the_bottom_right_causal_mask_is_pytorch_s_causal_lower_right():
    """The mask flash_backward's docstring and the hidden checks use (key j <= i + k_len - q_len) is
    torch.nn.attention.bias.causal_lower_right's: the same attention through SDPA, for q_len below, at and
    (with fully masked rows left out) equal to k_len; and is_causal=True's upper-left one when q_len = k_len."""
    from torch.nn.attention.bias import causal_lower_right

    from grader.checks.reference.efficient_attention import causal_lower_right as mask_of

    torch.manual_seed(4)
    for q_len, k_len in [(1, 6), (3, 5), (5, 13), (7, 7)]:
        q, k, v = torch.randn(2, 3, q_len, 4), torch.randn(2, 3, k_len, 4), torch.randn(2, 3, k_len, 5)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, attn_mask=mask_of(q_len, k_len)),
                                   F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q_len, k_len)))
    assert torch.equal(mask_of(7, 7), torch.ones(7, 7, dtype=torch.bool).tril())
    assert mask_of(3, 5)[-1].all() and not mask_of(3, 5)[0, 4], "the last query sees every key, the first not the last"


def test_flash_backward_matches_autograd_for_many_tile_shapes(efficient_attention_notebook):
    """The notebook's claim, beyond the hidden questions: its flash_backward, given O and L of the forward
    (the reference's, as the hidden checks give them), gives autograd's gradients through PyTorch's attention
    for any tiles, with the mask aligned bottom-right."""
    from torch.nn.attention.bias import causal_lower_right

    from grader.checks.reference.efficient_attention import flash_forward as forward

    backward = efficient_attention_notebook["flash_backward"]
    torch.manual_seed(5)
    for q_len, k_len in [(9, 9), (5, 12)]:
        leaves = [torch.randn(2, 2, n, d, dtype=torch.float64, requires_grad=True)
                  for n, d in ((q_len, 6), (k_len, 6), (k_len, 3))]
        grad_out = torch.randn(2, 2, q_len, 3, dtype=torch.float64)
        for causal in (False, True):
            mask = causal_lower_right(q_len, k_len) if causal else None
            want = torch.autograd.grad(F.scaled_dot_product_attention(*leaves, attn_mask=mask), leaves, grad_out)
            for q_block, k_block in [(1, 12), (12, 1), (2, 5), (5, 2), (20, 3)]:
                out, lse = forward(*(t.detach() for t in leaves), q_block, k_block, causal=causal)
                got = backward(*(t.detach() for t in leaves), out, lse, grad_out, q_block, k_block, causal=causal)
                for g, w in zip(got, want):
                    torch.testing.assert_close(g, w)
