"""Mistake and variant cases of notebook 13's checks, run in process (no kernel).

Every mistake here is written as a learner would write it, apart from the spec's catalogue
(whose own cases tests/test_catalogue.py generates), and must get its diagnosis; every valid
alternative must score full marks (exercise-standard.md, item 6): numpy or torch, float32 or
float64, complex multiplication (torch.view_as_complex) or rotate_half, tables computed once and
sliced. The attention module goes through coursekit.probe's attention_module driver, as while grading.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from grader.checks import CheckFailed, check
from grader.checks.reference import rope as ref
from tests.check_cases import shared_tests
from tests.conftest import solution_namespace

NS = solution_namespace("13_rope")
MultiHeadAttention = NS["MultiHeadAttention"]
split_heads, merge_heads = NS["split_heads"], NS["merge_heads"]


@pytest.fixture(scope="module")
def rope_notebook() -> dict:
    """The reference solutions of notebook 13 (rope_angles, apply_rope, RotaryMultiHeadAttention)."""
    return NS


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- rope_angles

def angles_llama(seq_len, d_k, base=10000.0):
    """Valid: Llama's precompute_freqs_cis without the complex part, float32 torch."""
    if d_k % 2:
        raise ValueError("odd d_k")
    freqs = 1.0 / (base ** (torch.arange(0, d_k, 2)[: d_k // 2].float() / d_k))
    return torch.outer(torch.arange(seq_len).float(), freqs)


@functools.lru_cache(maxsize=None)
def _angle_table(d_k, base):
    return np.array([[m * base ** (-2 * i / d_k) for i in range(d_k // 2)] for m in range(64)])


def angles_cached(seq_len, d_k, base=10000.0):
    """Valid: a table of 64 positions computed once per (d_k, base) in loops, then sliced."""
    if d_k % 2 == 1:
        raise ValueError("d_k must be even")
    return _angle_table(d_k, base)[:seq_len].copy()


def angles_all_columns(seq_len, d_k, base=10000.0):
    if d_k % 2:
        raise ValueError("odd")
    return np.arange(seq_len)[:, None] * base ** (-2 * (np.arange(d_k) // 2) / d_k)


def angles_frequencies_only(seq_len, d_k, base=10000.0):
    """The frequencies theta_i alone, without the positions."""
    if d_k % 2:
        raise ValueError("odd")
    return base ** (-2 * np.arange(d_k // 2) / d_k)


def angles_no_check(seq_len, d_k, base=10000.0):
    return np.arange(seq_len)[:, None] * base ** (-2 * np.arange(d_k // 2) / d_k)


def angles_no_return(seq_len, d_k, base=10000.0):
    if d_k % 2:
        raise ValueError("odd")
    np.arange(seq_len)[:, None] * base ** (-2 * np.arange(d_k // 2) / d_k)


def angles_llama_i(seq_len, d_k, base=10000.0):
    """Llama's arange(0, d_k, 2) divided by d_k, then the 2 put in again."""
    if d_k % 2:
        raise ValueError("odd")
    freqs = 1.0 / base ** (2 * torch.arange(0, d_k, 2).double() / d_k)
    return torch.arange(seq_len).double()[:, None] * freqs


def angles_pair_index_over_d_k(seq_len, d_k, base=10000.0):
    """The exponent -i / d_k with i the pair index: the 2 of 2i / d_k left out."""
    if d_k % 2:
        raise ValueError("odd")
    i = np.arange(d_k // 2)
    return np.outer(np.arange(seq_len), 1.0 / base ** (i / d_k))


# ---------------------------------------------------------------- apply_rope

def apply_complex(x, angles, pairing="interleaved"):
    """Valid: complex multiplication, torch.view_as_complex for interleaved pairs (RoFormer's eq. 34 as Llama
    writes it), torch.complex of the two halves otherwise."""
    if pairing not in ("interleaved", "halves"):
        raise ValueError(pairing)
    x = torch.as_tensor(x)
    rotation = torch.polar(torch.ones_like(torch.as_tensor(angles, dtype=torch.float64)),
                           torch.as_tensor(angles, dtype=torch.float64))
    if pairing == "interleaved":
        z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
        return torch.view_as_real(z * rotation).flatten(-2).to(x.dtype)
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double()) * rotation
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def apply_numpy(x, angles, pairing="interleaved"):
    """Valid: numpy, float64, the pairs written into an empty array by index."""
    x = np.asarray(x, dtype=np.float64)
    cos, sin = np.cos(np.asarray(angles)), np.sin(np.asarray(angles))
    if pairing == "interleaved":
        first, second = np.arange(0, x.shape[-1], 2), np.arange(1, x.shape[-1], 2)
    elif pairing == "halves":
        first, second = np.arange(x.shape[-1] // 2), np.arange(x.shape[-1] // 2, x.shape[-1])
    else:
        raise ValueError(f"unknown pairing {pairing}")
    out = np.empty_like(x)
    out[..., first] = x[..., first] * cos - x[..., second] * sin
    out[..., second] = x[..., first] * sin + x[..., second] * cos
    return out


def apply_rotate_half(x, angles, pairing="interleaved"):
    """Valid: GPT-NeoX's rotate_half with full-width cos/sin tables, float32 throughout."""
    x = torch.as_tensor(x).float()
    angles = torch.as_tensor(angles).float()
    if pairing == "halves":
        cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], -1) * sin
    if pairing == "interleaved":
        cos, sin = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)
        rotated = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
        return x * cos + rotated * sin
    raise ValueError("pairing")


def apply_llama_only(x, angles, pairing="interleaved"):
    """Llama's rotate_half whatever pairing is asked: the halves (i, i + d_k/2) always."""
    if pairing not in ("interleaved", "halves"):
        raise ValueError(pairing)
    x = torch.as_tensor(x).double()
    cos, sin = torch.as_tensor(angles).cos().repeat(1, 2), torch.as_tensor(angles).sin().repeat(1, 2)
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def apply_paper_only(x, angles, pairing="interleaved"):
    """RoFormer's eq. 34 with complex numbers on the pairs (2i, 2i + 1), whatever pairing is asked."""
    if pairing not in ("interleaved", "halves"):
        raise ValueError(pairing)
    return apply_complex(x, angles, "interleaved")


def apply_swapped_names(x, angles, pairing="interleaved"):
    """'interleaved' read as Llama's rotate_half (the halves interleave their roles), 'halves' as (2i, 2i + 1)."""
    if pairing not in ("interleaved", "halves"):
        raise ValueError(pairing)
    return apply_rotate_half(x, angles, "halves" if pairing == "interleaved" else "interleaved")


def apply_conjugate(x, angles, pairing="interleaved"):
    """The complex version multiplied by the conjugate, e^(-i m theta): the inverse rotation."""
    return apply_complex(x, -torch.as_tensor(angles), pairing)


def apply_no_check(x, angles, pairing="interleaved"):
    return apply_numpy(x, angles, "interleaved" if pairing == "interleaved" else "halves")


def apply_halves_as_tables(x, angles, pairing="interleaved"):
    """Llama's tables cat([cos, cos]) with the interleaved pairs of the paper, whatever is asked."""
    x = torch.as_tensor(x).double()
    angles = torch.as_tensor(angles).double()
    if pairing not in ("interleaved", "halves"):
        raise ValueError(pairing)
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    if pairing == "halves":
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-x2, x1], -1) * sin
    return x * cos + torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2) * sin


# ---------------------------------------------------------------- RotaryMultiHeadAttention

def rope_angles(seq_len, d_k):
    return NS["rope_angles"](seq_len, d_k)


class RotaryEinsum(MultiHeadAttention):
    """Valid: the scores and the mixing by einsum, rotation by complex multiplication, float64 inside."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (split_heads(w(x), self.heads).double() for w, x in
                   [(self.W_q, query), (self.W_k, key), (self.W_v, value)])
        q = apply_complex(q, rope_angles(q.shape[-2], self.d_k))
        k = apply_complex(k, rope_angles(k.shape[-2], self.d_k))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.d_k ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~(mask.unsqueeze(1) if mask.dim() == 3 else mask), float("-inf"))
        weights = scores.softmax(-1)
        out = torch.einsum("bhqk,bhkd->bhqd", weights, v).float()
        return self.W_o(merge_heads(out)), weights.float()


class RotaryCachedTables(MultiHeadAttention):
    """Valid: cos and sin tables of 64 positions computed once in __init__ (buffers, not parameters), sliced."""

    def __init__(self, d_model, heads):
        super().__init__(d_model, heads)
        angles = torch.as_tensor(ref.rope_angles(64, self.d_k), dtype=torch.float32)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def rotate(self, x):
        cos, sin = self.cos[: x.shape[-2]], self.sin[: x.shape[-2]]
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

    def forward(self, query, key, value, mask=None):
        q = self.rotate(split_heads(self.W_q(query), self.heads))
        k = self.rotate(split_heads(self.W_k(key), self.heads))
        v = split_heads(self.W_v(value), self.heads)
        if mask is not None and mask.dim() == 3:
            mask = mask[:, None]
        out, weights = NS["scaled_dot_product_attention"](q, k, v, mask)
        return self.W_o(merge_heads(out)), weights


class RotaryWithSDPA(RotaryCachedTables):
    """Valid: torch's fused attention for the output, the weights computed beside it."""

    def forward(self, query, key, value, mask=None):
        q = self.rotate(split_heads(self.W_q(query), self.heads))
        k = self.rotate(split_heads(self.W_k(key), self.heads))
        v = split_heads(self.W_v(value), self.heads)
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return self.W_o(merge_heads(out)), scores.softmax(-1)


class RotaryStub(MultiHeadAttention):
    def forward(self, query, key, value, mask=None):
        raise NotImplementedError()


class RotaryValuesToo(MultiHeadAttention):
    """Rotates everything it splits into heads: q, k and v."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (apply_rotate_half(split_heads(w(x), self.heads), rope_angles(x.shape[1], self.d_k))
                   for w, x in [(self.W_q, query), (self.W_k, key), (self.W_v, value)])
        return self.attend(q, k, v, mask)

    def attend(self, q, k, v, mask):
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        out, weights = NS["scaled_dot_product_attention"](q, k, v, mask)
        return self.W_o(merge_heads(out)), weights


class RotaryBeforeSplit(RotaryValuesToo):
    """Rotates the projections (batch, seq_len, d_model) with d_model frequencies, then splits."""

    def forward(self, query, key, value, mask=None):
        q = apply_complex(self.W_q(query), rope_angles(query.shape[1], self.d_model))
        k = apply_complex(self.W_k(key), rope_angles(key.shape[1], self.d_model))
        return self.attend(split_heads(q, self.heads), split_heads(k, self.heads),
                           split_heads(self.W_v(value), self.heads), mask)


class RotaryInputs(RotaryValuesToo):
    """Rotates the token vectors before the projections, like an encoding added at the input."""

    def forward(self, query, key, value, mask=None):
        angles = rope_angles(query.shape[1], self.d_model)
        q, k = self.W_q(apply_numpy_t(query, angles)), self.W_k(apply_numpy_t(key, angles))
        return self.attend(split_heads(q, self.heads), split_heads(k, self.heads),
                           split_heads(self.W_v(value), self.heads), mask)


class RotaryRotateHalf(RotaryValuesToo):
    """Llama's attention: the queries and keys of every head rotated with rotate_half, pairs (i, i + d_k/2)."""

    def forward(self, query, key, value, mask=None):
        q, k, v = (split_heads(w(x), self.heads) for w, x in [(self.W_q, query), (self.W_k, key), (self.W_v, value)])
        q = apply_llama_only(q, rope_angles(q.shape[-2], self.d_k)).float()
        k = apply_llama_only(k, rope_angles(k.shape[-2], self.d_k)).float()
        return self.attend(q, k, v, mask)


# ---------------------------------------------------------------- rotary_attention_step

sdpa = NS["scaled_dot_product_attention"]


def _bottom_right(new, total):
    return torch.ones(new, total, dtype=torch.bool).tril(diagonal=total - new)


def step_llama(q, k, v, cache=None, base=10000.0):
    """Valid: Llama's way, complex frequencies precomputed for a maximum length and sliced at start_pos, the cache
    a list that grows, F.scaled_dot_product_attention with an explicit bottom-right mask, float64 inside."""
    if not (q.shape[-2] == k.shape[-2] == v.shape[-2]):
        raise ValueError("q, k and v must hold the same number of tokens")
    start_pos, seqlen, d_k = (0 if cache is None else cache[0].shape[2]), q.shape[2], q.shape[-1]
    freqs = 1.0 / (base ** (torch.arange(0, d_k, 2, dtype=torch.float64) / d_k))
    cis = torch.polar(torch.ones(64, d_k // 2, dtype=torch.float64),
                      torch.outer(torch.arange(64, dtype=torch.float64), freqs))[start_pos:start_pos + seqlen]
    rot = lambda x: torch.view_as_real(torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2)) * cis).flatten(-2)
    xq, xk = rot(q), rot(k).to(k.dtype)
    keys = xk if cache is None else torch.cat([cache[0], xk], dim=2)
    values = v if cache is None else torch.cat([cache[1], v], dim=2)
    out = F.scaled_dot_product_attention(xq, keys.double(), values.double(),
                                         attn_mask=_bottom_right(seqlen, keys.shape[2]))
    return out.to(q.dtype), (keys, values)


def step_numpy_loops(q, k, v, cache=None, base=10000.0):
    """Valid: numpy, one new token at a time inside the call (each attends to everything cached so far), the
    score matrix by einsum, the cache a list [keys, values]."""
    q, k, v = (np.asarray(t, dtype=np.float64) for t in (q, k, v))
    if k.shape[-2] != q.shape[-2] or v.shape[-2] != q.shape[-2]:
        raise ValueError("one key and one value per new query")
    keys = np.zeros(q.shape[:2] + (0, q.shape[-1])) if cache is None else np.asarray(cache[0], dtype=np.float64)
    values = np.zeros(keys.shape) if cache is None else np.asarray(cache[1], dtype=np.float64)
    outs = []
    for j in range(q.shape[-2]):
        m = keys.shape[-2]                                     # this token's position
        angles = _np_angles(m + 1, q.shape[-1], base)[m:]
        qj = apply_numpy(q[..., j:j + 1, :], angles)
        keys = np.concatenate([keys, apply_numpy(k[..., j:j + 1, :], angles)], axis=-2)
        values = np.concatenate([values, v[..., j:j + 1, :]], axis=-2)
        w = np.exp(np.einsum("bhqd,bhkd->bhqk", qj, keys) / np.sqrt(q.shape[-1]))
        outs.append((w / w.sum(-1, keepdims=True)) @ values)
    return torch.tensor(np.concatenate(outs, axis=-2)), [torch.tensor(keys), torch.tensor(values)]


def _np_angles(seq_len, d_k, base=10000.0):
    return np.arange(seq_len)[:, None] * base ** (-2 * np.arange(d_k // 2) / d_k)


def step_queries_from_zero(q, k, v, cache=None, base=10000.0):
    """Mistake: the keys at their positions, the queries rotated as in section 5, from 0."""
    past = 0 if cache is None else cache[0].shape[-2]
    q = ref.apply_rope(q, ref.rope_angles(q.shape[-2], q.shape[-1], base))
    k = ref.apply_rope(k, ref.rope_angles(past + k.shape[-2], k.shape[-1], base)[past:])
    keys = k if cache is None else torch.cat([cache[0], k], -2)
    values = v if cache is None else torch.cat([cache[1], v], -2)
    return sdpa(q, keys, values, _bottom_right(q.shape[-2], keys.shape[-2]))[0], (keys, values)


def step_rotates_whole_cache(q, k, v, cache=None, base=10000.0):
    """Mistake: the cached keys (stored rotated) and the new ones rotated together at 0 ... past + new - 1."""
    keys = k if cache is None else torch.cat([cache[0], k], -2)
    values = v if cache is None else torch.cat([cache[1], v], -2)
    angles = ref.rope_angles(keys.shape[-2], q.shape[-1], base)
    keys = ref.apply_rope(keys, angles)
    q = ref.apply_rope(q, angles[keys.shape[-2] - q.shape[-2]:])
    return sdpa(q, keys, values, _bottom_right(q.shape[-2], keys.shape[-2]))[0], (keys, values)


def _at_true_positions(q, k, v, cache, base):
    """The new queries and keys rotated at past ..., appended to the cache: (queries, keys, values)."""
    past = 0 if cache is None else cache[0].shape[-2]
    angles = ref.rope_angles(past + q.shape[-2], q.shape[-1], base)[past:]
    q, k = ref.apply_rope(q, angles), ref.apply_rope(k, angles)
    if cache is None:
        return q, k, v
    return q, torch.cat([cache[0], k], -2), torch.cat([cache[1], v], -2)


def step_top_left(q, k, v, cache=None, base=10000.0):
    """Mistake: notebook 03's causal_mask cut to (new_len, k_len): aligned top-left."""
    q, keys, values = _at_true_positions(q, k, v, cache, base)
    return sdpa(q, keys, values, NS["causal_mask"](keys.shape[-2])[:q.shape[-2]])[0], (keys, values)


def step_cache_not_grown(q, k, v, cache=None, base=10000.0):
    """Mistake: the cache filled on the first call only (`if cache is None: cache = ...`)."""
    q, keys, values = _at_true_positions(q, k, v, cache, base)
    if cache is None:
        cache = (keys, values)
    return sdpa(q, keys, values, _bottom_right(q.shape[-2], keys.shape[-2]))[0], cache


def step_no_return(q, k, v, cache=None, base=10000.0):
    ref.rotary_attention_step(q, k, v, cache, base)


def step_base_ignored(q, k, v, cache=None, base=10000.0):
    """Mistake: the base argument not passed on to rope_angles."""
    return ref.rotary_attention_step(q, k, v, cache)


def apply_numpy_t(x, angles):
    return torch.as_tensor(apply_numpy(x.detach().numpy(), angles), dtype=x.dtype)


MISTAKES = {
    "rope-rope_angles": [
        (stub, "not answered yet"),
        (angles_no_check, "should raise ValueError"),
        (angles_no_return, "is a `return` missing?"),
        (angles_all_columns, "each angle twice"),
        (angles_frequencies_only, "has shape"),
        (angles_llama_i, "the frequencies fall too fast"),
        (angles_pair_index_over_d_k, "the frequencies fall too slowly"),
    ],
    "rope-apply_rope": [
        (stub, "not answered yet"),
        (apply_conjugate, "it rotates the wrong way"),
        (apply_no_check, "should raise ValueError"),
        (apply_halves_as_tables, "the pairing is mixed up"),
        (apply_llama_only, "it always pairs features (i, i + d_k/2)"),
        (apply_paper_only, "it always pairs features (2i, 2i + 1)"),
        (apply_swapped_names, "the pairings are swapped"),
    ],
    "rope-RotaryMultiHeadAttention": [
        (RotaryStub, "not answered yet"),
        (RotaryValuesToo, "it rotates the values too"),
        (RotaryBeforeSplit, "with d_model frequencies before the split"),
        (RotaryInputs, "it rotates the inputs before W_q and W_k"),
        (RotaryRotateHalf, "it rotates pairs (i, i + d_k/2)"),
    ],
    "rope-rotary_attention_step": [
        (stub, "not answered yet"),
        (step_no_return, "is a `return` missing?"),
        (step_queries_from_zero, "the new queries are rotated from position 0"),
        (step_rotates_whole_cache, "the cached keys are rotated again when read"),
        (step_top_left, "the causal mask is aligned top-left"),
        (step_cache_not_grown, "the cache is not updated after the first call"),
        (step_base_ignored, "base"),
    ],
}

VARIANTS = {
    "rope-rope_angles": [angles_llama, angles_cached],
    "rope-apply_rope": [apply_complex, apply_numpy, apply_rotate_half],
    "rope-RotaryMultiHeadAttention": [RotaryEinsum, RotaryCachedTables, RotaryWithSDPA],
    "rope-rotary_attention_step": [step_llama, step_numpy_loops],
}

globals().update(shared_tests("rope", MISTAKES, VARIANTS, solutions="rope_notebook", seeds=4))


def test_the_pairings_are_one_permutation_apart():
    """The reference's two layouts: halves of x[..., perm] is interleaved of x, reordered by perm."""
    x = torch.randn(2, 3, 5, 10, dtype=torch.float64)
    angles = ref.rope_angles(5, 10)
    perm = list(range(0, 10, 2)) + list(range(1, 10, 2))
    torch.testing.assert_close(ref.apply_rope(x[..., perm], angles, "halves"), ref.apply_rope(x, angles)[..., perm])


def test_the_reference_scores_depend_on_the_offset_only():
    """RoFormer's eq. 16 for the reference module: shifting every position by 3 changes no weight."""
    torch.manual_seed(0)
    attn = ref.RotaryMultiHeadAttention(12, 3).eval()
    x = torch.randn(1, 8, 12)
    q, k = (split_heads(w(x), 3) for w in (attn.W_q, attn.W_k))
    angles = ref.rope_angles(11, 4)
    at = lambda t, shift: ref.apply_rope(t, angles[shift:shift + 8])
    torch.testing.assert_close(at(q, 0) @ at(k, 0).transpose(-2, -1), at(q, 3) @ at(k, 3).transpose(-2, -1),
                               rtol=1e-4, atol=1e-5)


def test_a_float32_answer_to_rope_angles_is_within_tolerance():
    """Llama's float32 angles differ from float64 by at most a few ulps of m * theta: within rtol."""
    check("rope-rope_angles", angles_llama)
    with pytest.raises(CheckFailed):
        check("rope-rope_angles", lambda seq_len, d_k, base=10000.0: angles_llama(seq_len, d_k, base) * 1.001)


class RotaryTiledAngles(MultiHeadAttention):
    """Valid: the projections rotated before the split, with each head's d_k angles tiled over the heads (the
    interleaved pairs never cross a head's boundary, so this is the per-head rotation)."""

    def forward(self, query, key, value, mask=None):
        tiled = lambda length: np.tile(np.asarray(rope_angles(length, self.d_k)), (1, self.heads))
        q = apply_numpy_t(self.W_q(query), tiled(query.shape[1]))
        k = apply_numpy_t(self.W_k(key), tiled(key.shape[1]))
        q, k, v = (split_heads(t, self.heads) for t in (q, k, self.W_v(value)))
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)
        out, weights = NS["scaled_dot_product_attention"](q, k, v, mask)
        return self.W_o(merge_heads(out)), weights


def test_rotating_before_the_split_with_tiled_angles_is_valid():
    check("rope-RotaryMultiHeadAttention", RotaryTiledAngles)
