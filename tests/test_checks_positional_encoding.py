"""Mistake and variant cases of notebook 05's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tests.check_cases import shared_tests
from tests.conftest import solution_namespace


@pytest.fixture(scope="module")
def positional_notebook() -> dict:
    """The reference functions of notebook 05 (order_gap, sinusoidal_encoding, ...)."""
    return solution_namespace("05_positional_encoding")


def stub(*args, **kwargs):
    raise NotImplementedError()


# ---------------------------------------------------------------- order_gap

def self_attention(x):
    """The notebook's read-only helper, as the learner's functions see it."""
    x = np.asarray(x, dtype=np.float64)
    scores = x @ x.T / np.sqrt(x.shape[-1])
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return weights / weights.sum(axis=-1, keepdims=True) @ x


def _gap(outputs="reorder", slots=True, use_pe=True, reduce=lambda d: np.abs(d).max(), slice_pe=True):
    """An order_gap with knobs for the mistakes learners make."""
    def order_gap(x, order, pe=None):
        n = x.shape[0]
        p = 0.0 if pe is None or not use_pe else (pe[:n] if slice_pe else pe)
        original = self_attention(x + p)
        if slots:
            shuffled = self_attention(x[order] + p)
        else:
            shuffled = self_attention((x + p)[order])
        target = {"reorder": original[order], "none": original, "inverse": original[np.argsort(order)]}[outputs]
        return reduce(shuffled - target)
    return order_gap


def _gap_if_pe(x, order, pe=None):
    p = pe[: len(x)] if pe else 0.0
    return np.abs(self_attention(x[order] + p) - self_attention(x + p)[order]).max()


def _gap_no_none_check(x, order, pe=None):
    p = pe[: len(x)]
    return np.abs(self_attention(x[order] + p) - self_attention(x + p)[order]).max()


def _gap_pe_on_one_side(x, order, pe=None):
    n = len(x)
    p = 0.0 if pe is None else pe[:n]
    return np.abs(self_attention(x[order] + p) - self_attention(x)[order]).max()


def _gap_unpermute(x, order, pe=None):
    """Put the reordered outputs back in the original order instead: the same differences."""
    p = 0.0 if pe is None else pe[: x.shape[0]]
    back = self_attention(x[order] + p)[np.argsort(order)]
    return np.max(np.abs(back - self_attention(x + p)))


def _gap_matrix(x, order, pe=None):
    """With a permutation matrix P: A(P x + pe) against P A(x + pe)."""
    n = x.shape[0]
    P = np.eye(n)[order]
    p = np.zeros_like(x) if pe is None else pe[:n]
    return np.abs(self_attention(P @ x + p) - P @ self_attention(x + p)).max()


def _gap_loop(x, order, pe=None):
    """Word by word: slot i of the new sentence holds word order[i]."""
    n = len(x)
    p = np.zeros((n, x.shape[1])) if pe is None else pe[:n]
    a, b = self_attention(x + p), self_attention(x[order] + p)
    return max(float(np.max(np.abs(b[i] - a[w]))) for i, w in enumerate(order))


def _torch_attention(x):
    return torch.softmax(x @ x.T / math.sqrt(x.shape[-1]), dim=-1) @ x


def _gap_torch_float32(x, order, pe=None):
    """PyTorch in float32 with its own attention: the gap without positions is about 1e-7."""
    x = torch.as_tensor(x, dtype=torch.float32)
    order = torch.as_tensor(order)
    p = torch.zeros_like(x) if pe is None else torch.as_tensor(pe, dtype=torch.float32)[: x.shape[0]]
    return (_torch_attention(x[order] + p) - _torch_attention(x + p)[order]).abs().max()


# ---------------------------------------------------------------- sinusoidal_encoding

def _pe(base=10000.0, start=0, exponent="2i", swap=False, halves=False, check=True, odd="ok", transpose=False):
    """A numpy table with knobs for the mistakes learners make."""
    def sinusoidal_encoding(max_len, d_model):
        if check and (max_len < 1 or d_model < 1):
            raise ValueError("sizes must be positive")
        if odd == "refuse" and d_model % 2:
            raise ValueError("d_model must be even")
        width = d_model + 1 if odd == "pad" and d_model % 2 else d_model
        pos = np.arange(start, start + max_len)[:, None]
        j = np.arange(width)
        i = j // 2
        power = {"2i": 2 * i / width, "j": j / width, "2j": 2 * j / width, "int": 2 * i // width}[exponent]
        angle = pos / base ** power
        if halves:
            half = angle[:, 0::2]
            pe = np.concatenate([np.sin(half), np.cos(half)], axis=1)[:, :d_model]
        else:
            first, second = (np.cos, np.sin) if swap else (np.sin, np.cos)
            pe = np.where(j % 2 == 0, first(angle), second(angle))[:, :d_model]
        return pe.T if transpose else pe
    return sinusoidal_encoding


def _pe_tutorial_float32(max_len, d_model):
    """The PyTorch tutorial's form in float32 (exp/log frequencies), odd d_model handled."""
    if max_len < 1 or d_model < 1:
        raise ValueError("max_len and d_model must be positive")
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return pe


def _pe_tutorial_odd_bug(max_len, d_model):
    """The tutorial without the odd fix: the cos columns get one frequency too many."""
    if max_len < 1 or d_model < 1:
        raise ValueError("max_len and d_model must be positive")
    position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(position * div_term)
    pe[:, 1::2] = torch.cos(position * div_term)
    return pe


def _pe_numpy_odd_bug(max_len, d_model):
    if max_len < 1 or d_model < 1:
        raise ValueError("max_len and d_model must be positive")
    pos = np.arange(max_len)[:, None]
    angles = pos / 10000 ** (np.arange(0, d_model, 2) / d_model)
    pe = np.zeros((max_len, d_model))
    pe[:, 0::2] = np.sin(angles)
    pe[:, 1::2] = np.cos(angles)
    return pe


def _pe_float32_exp_log(max_len, d_model):
    if max_len <= 0 or d_model <= 0:
        raise ValueError("max_len and d_model must be positive")
    pos = np.arange(max_len, dtype=np.float32)[:, None]
    i = (np.arange(d_model) // 2).astype(np.float32)
    angles = pos * np.exp(-2 * i * np.float32(math.log(10000.0)) / d_model)
    return np.where(np.arange(d_model) % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


def _pe_loops(max_len, d_model):
    if max_len < 1 or d_model < 1:
        raise ValueError("bad size")
    pe = [[0.0] * d_model for _ in range(max_len)]
    for pos in range(max_len):
        for j in range(d_model):
            angle = pos / 10000 ** (2 * (j // 2) / d_model)
            pe[pos][j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return np.array(pe)


def _pe_pad_then_slice(max_len, d_model):
    """Build an even table one column wider, with the exponent over d_model, and drop the last column."""
    if max_len < 1 or d_model < 1:
        raise ValueError("bad size")
    width = d_model + d_model % 2
    pos = np.arange(max_len)[:, None]
    freq = 1.0 / 10000 ** (np.arange(0, width, 2) / d_model)
    pe = np.zeros((max_len, width))
    pe[:, 0::2] = np.sin(pos * freq)
    pe[:, 1::2] = np.cos(pos * freq)
    return pe[:, :d_model]


def _pe_bracket_int(max_len, d_model):
    """pos / 10000 ** (2 * i) / d_model in numpy: 10000 ** (2 * i) overflows int64 (wraps, then 0)."""
    if max_len < 1 or d_model < 1:
        raise ValueError("bad size")
    pos = np.arange(max_len)[:, None]
    i = np.arange(d_model) // 2
    with np.errstate(divide="ignore", invalid="ignore"):
        angles = pos / 10000 ** (2 * i) / d_model
        return np.where(np.arange(d_model) % 2 == 0, np.sin(angles), np.cos(angles))


def _pe_bracket_int_torch(max_len, d_model):
    if max_len < 1 or d_model < 1:
        raise ValueError("bad size")
    position = torch.arange(max_len).unsqueeze(1)
    two_i = torch.arange(0, d_model, 2)
    angles = position / 10000 ** two_i / d_model
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles[:, : d_model // 2])
    return pe


def _pe_bracket_float(max_len, d_model):
    """The same brackets in Python floats, loop by loop."""
    if max_len < 1 or d_model < 1:
        raise ValueError("bad size")
    pe = np.zeros((max_len, d_model))
    for pos in range(max_len):
        for j in range(d_model):
            angle = pos / 10000.0 ** (2 * (j // 2)) / d_model
            pe[pos, j] = math.sin(angle) if j % 2 == 0 else math.cos(angle)
    return pe


# ---------------------------------------------------------------- shift_matrix

def _freqs(d_model, base=10000.0, exponent="2i"):
    i = np.arange(d_model // 2)
    return base ** -({"2i": 2 * i, "i": i, "2j": 4 * i}[exponent] / d_model)


def _shift(transpose=False, exponent="2i", base=10000.0, ignore_k=False, step=2, cos_only=False, check=True):
    def shift_matrix(k, d_model):
        if check and d_model % 2:
            raise ValueError("d_model must be even")
        M = np.zeros((d_model, d_model))
        for i, w in enumerate(_freqs(d_model, base, exponent)):
            a = w * (1 if ignore_k else k)
            c, s = np.cos(a), 0.0 if cos_only else np.sin(a)
            block = np.array([[c, s], [-s, c]])
            r = step * i
            if r + 2 <= d_model:
                M[r:r + 2, r:r + 2] = block.T if transpose else block
        return M
    return shift_matrix


def _shift_torch(k, d_model):
    if d_model % 2 == 1:
        raise ValueError(f"odd d_model {d_model}")
    w = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
    c, s = torch.cos(w * k), torch.sin(w * k)
    return torch.block_diag(*[torch.stack([torch.stack([ci, si]), torch.stack([-si, ci])]) for ci, si in zip(c, s)])


def _shift_vectorized(k, d_model):
    if d_model % 2:
        raise ValueError("odd")
    angle = k * np.exp(-np.arange(0, d_model, 2) * np.log(10000.0) / d_model)
    M = np.zeros((d_model, d_model))
    even = np.arange(0, d_model, 2)
    M[even, even] = M[even + 1, even + 1] = np.cos(angle)
    M[even, even + 1] = np.sin(angle)
    M[even + 1, even] = -np.sin(angle)
    return M


def _shift_kron(k, d_model):
    """Rotation R(-wk) = [[cos, sin], [-sin, cos]] placed with np.kron on unit vectors."""
    if d_model % 2 != 0:
        raise ValueError("d_model must be even")
    M = np.zeros((d_model, d_model))
    for i, w in enumerate(_freqs(d_model)):
        e = np.zeros((d_model // 2, d_model // 2))
        e[i, i] = 1.0
        rotation = np.array([[math.cos(w * k), -math.sin(w * k)], [math.sin(w * k), math.cos(w * k)]])
        M += np.kron(e, rotation.T)
    return M


# ---------------------------------------------------------------- dot_by_offset

def _dots(fn=np.cos, terms="pairs", exponent="2i", base=10000.0, keep_terms=False, check=True):
    def dot_by_offset(offsets, d_model):
        if check and d_model % 2:
            raise ValueError("d_model must be even")
        if terms == "columns":
            w = base ** (-2.0 * np.arange(d_model) / d_model)
        else:
            w = _freqs(d_model, base, exponent)
        each = fn(np.asarray(offsets, dtype=float)[..., None] * w)
        if keep_terms:
            return each
        return 2 * each.sum(-1) if terms == "double" else each.sum(-1)
    return dot_by_offset


def _dots_torch(offsets, d_model):
    if d_model % 2 == 1:
        raise ValueError(f"odd d_model {d_model}")
    w = torch.exp(-torch.arange(0, d_model, 2, dtype=torch.float32) * math.log(10000.0) / d_model)
    return torch.cos(torch.as_tensor(offsets, dtype=torch.float32).unsqueeze(-1) * w).sum(-1)


def _dots_from_table(offsets, d_model):
    """Measure it: PE[|offset|] . PE[0] from a table long enough (cos is even)."""
    if d_model % 2:
        raise ValueError("odd d_model")
    offsets = np.abs(np.asarray(offsets)).astype(int)
    table = _pe()(int(offsets.max()) + 1, d_model)
    return table[offsets] @ table[0]


def _dots_loop(offsets, d_model):
    if d_model % 2 != 0:
        raise ValueError("d_model must be even")
    total = np.zeros(np.shape(offsets))
    for i in range(d_model // 2):
        total = total + np.cos(np.asarray(offsets) / 10000 ** (2 * i / d_model))
    return total


# ---------------------------------------------------------------- embed

def _embed_by_batch(token_ids, table, pe):
    """pe sliced by token_ids.shape[0], the batch, instead of the sequence length."""
    return table[token_ids] + pe[: token_ids.shape[0]]


def _embed_by_batch_torch(token_ids, table, pe):
    words = torch.as_tensor(table)[torch.as_tensor(token_ids)]
    return words + torch.as_tensor(pe)[: len(token_ids)]


def _embed(shift=0, by_id=False, full=False, concat=False, scale=False, use_pe=True):
    def embed(token_ids, table, pe):
        words = table[token_ids]
        n = token_ids.shape[1]
        if by_id:
            positions = pe[token_ids]
        elif full:
            positions = pe
        else:
            positions = pe[shift:shift + n]
        if concat:
            return np.concatenate([words, np.broadcast_to(positions, words.shape)], axis=-1)
        if scale:
            words = words * math.sqrt(table.shape[1])
        return words + positions if use_pe else words
    return embed


def _embed_torch(token_ids, table, pe):
    words = torch.nn.functional.embedding(torch.as_tensor(token_ids), torch.as_tensor(table, dtype=torch.float32))
    return words + torch.as_tensor(pe, dtype=torch.float32)[: words.shape[1]].unsqueeze(0)


def _embed_take(token_ids, table, pe):
    return np.take(table, token_ids, axis=0) + pe[None, : token_ids.shape[-1], :]


def _embed_one_hot(token_ids, table, pe):
    one_hot = np.eye(table.shape[0])[token_ids]              # (batch, seq_len, vocab)
    return one_hot @ table + pe[: token_ids.shape[1]]


MISTAKES = {
    "positional_encoding-order_gap": [
        (_gap(outputs="none"), "without reordering the original outputs"),
        (_gap(outputs="inverse"), "inverse permutation"),
        (_gap(slots=False), "the gap is 0 although positions were given"),
        (_gap(use_pe=False), "the gap is 0 although positions were given"),
        (_gap(slice_pe=False), "pe[:seq_len]"),
        (_gap(reduce=lambda d: np.abs(d).mean()), "mean absolute difference"),
        (_gap(reduce=lambda d: d.max()), "largest signed difference"),
        (_gap(reduce=np.linalg.norm), "norm of the difference"),
        (_gap(reduce=np.abs), "should be one number"),
        (_gap_if_pe, "`if pe is not None:`"),
        (_gap_no_none_check, "pe may be None"),
        (_gap_pe_on_one_side, "to the reordered sentence only"),
        (lambda x, order, pe=None: 0.0, "the gap is 0 although positions were given"),
        (lambda x, order, pe=None: 1.0, "with pe=None the gap should be 0"),
        (stub, "not answered yet"),
    ],
    "positional_encoding-sinusoidal_encoding": [
        (_pe(exponent="j"), "the exponent uses the column index j"),
        (_pe(exponent="2j"), "the exponent is 2j / d_model"),
        (_pe(exponent="int"), "integer division"),
        (_pe(base=1000.0), "it looks like 1000"),
        (_pe(base=100.0), "the same table as base 100"),
        (_pe(base=1 / 10000.0), "multiplied by 10000"),
        (_pe(start=1), "the positions start at 1"),
        (_pe(swap=True), "sin and cos are swapped"),
        (_pe(halves=True), "two halves"),
        (_pe(transpose=True), "the table is transposed"),
        (_pe(check=False), "should raise ValueError"),
        (_pe(odd="refuse"), "an odd d_model is valid"),
        (_pe(odd="pad"), "builds the table for d_model + 1 columns"),
        (_pe_tutorial_odd_bug, "only d_model // 2 cos columns"),
        (_pe_numpy_odd_bug, "only d_model // 2 cos columns"),
        (_pe_bracket_int, "the brackets: the whole 2i / d_model is the exponent"),
        (_pe_bracket_int_torch, "the brackets: the whole 2i / d_model is the exponent"),
        (_pe_bracket_float, "the brackets: the whole 2i / d_model is the exponent"),
        (stub, "not answered yet"),
    ],
    "positional_encoding-shift_matrix": [
        (_shift(transpose=True), "it is the shift by -k"),
        (_shift(ignore_k=True), "it ignores k"),
        (_shift(ignore_k=True, transpose=True), "it ignores k"),
        (_shift(exponent="i"), "wrong frequencies"),
        (_shift(exponent="2j"), "the pair index (not the column index)"),
        (_shift(base=1000.0), "base 1000"),
        (_shift(base=100.0), "or base 100, is wrong"),
        (_shift(step=1), "the blocks are in the wrong place"),
        (_shift(cos_only=True), "only the cos(w k) entries"),
        (_shift(check=False), "should raise ValueError"),
        (lambda k, d_model: np.eye(d_model) * 0.9, "block should be"),
        (stub, "not answered yet"),
    ],
    "positional_encoding-dot_by_offset": [
        (_dots(fn=np.sin), "it sums sin"),
        (_dots(terms="columns"), "it sums d_model terms"),
        (_dots(terms="double"), "counts every (sin, cos) pair twice"),
        (_dots(exponent="i"), "the frequencies are wrong"),
        (_dots(exponent="2j"), "the exponent 4i / d_model"),
        (_dots(base=1 / 10000.0), "multiplies the offsets by 10000"),
        (_dots(base=1000.0), "base 1000"),
        (_dots(keep_terms=True), "sum them over i"),
        (_dots(check=False), "should raise ValueError"),
        (stub, "not answered yet"),
    ],
    "positional_encoding-embed": [
        (_embed(shift=1), "off by one"),
        (_embed(by_id=True), "indexes the positional table with the token ids"),
        (_embed(full=True), "pe[:seq_len]"),
        (_embed(concat=True), "concatenates"),
        (_embed_by_batch, "token_ids.shape[0] is the batch"),
        (_embed_by_batch_torch, "token_ids.shape[0] is the batch"),
        (_embed(scale=True), "sqrt(d_model)"),
        (_embed(use_pe=False), "without the positions"),
        (lambda token_ids, table, pe: pe[: token_ids.shape[1]] + 0 * table[token_ids], "without the word embeddings"),
        (stub, "not answered yet"),
    ],
}

VARIANTS = {
    "positional_encoding-order_gap": [
        _gap(),
        _gap_unpermute,
        _gap_matrix,
        _gap_loop,
        _gap_torch_float32,
    ],
    "positional_encoding-sinusoidal_encoding": [
        _pe(),
        _pe_tutorial_float32,
        _pe_float32_exp_log,
        _pe_loops,
        _pe_pad_then_slice,
    ],
    "positional_encoding-shift_matrix": [
        _shift(),
        _shift_torch,
        _shift_vectorized,
        _shift_kron,
    ],
    "positional_encoding-dot_by_offset": [
        _dots(),
        _dots_torch,
        _dots_from_table,
        _dots_loop,
        lambda offsets, d_model: _dots()(np.abs(np.asarray(offsets)), d_model).astype(np.float32),
    ],
    "positional_encoding-embed": [
        _embed(),
        _embed_torch,
        _embed_take,
        _embed_one_hot,
    ],
}


globals().update(shared_tests("positional_encoding", MISTAKES, VARIANTS, solutions="positional_notebook", seeds=40))


def test_reference_table_has_the_notebook_properties(positional_notebook):
    """The claims of the prose: the shift is a rotation, the dot product a function of p - q."""
    nb = positional_notebook
    table = nb["sinusoidal_encoding"](80, 12)
    for k in (4, -7):
        M = nb["shift_matrix"](k, 12)
        later, earlier = (table[k:], table[:-k]) if k > 0 else (table[:k], table[-k:])
        np.testing.assert_allclose(earlier @ M.T, later, atol=1e-12)
        np.testing.assert_allclose(M @ M.T, np.eye(12), atol=1e-12)
    p, q = np.meshgrid(np.arange(80), np.arange(80), indexing="ij")
    np.testing.assert_allclose(table @ table.T, nb["dot_by_offset"](p - q, 12), atol=1e-10)


def test_order_gap_is_zero_without_positions_for_the_seed_pair(positional_notebook):
    from coursekit.data import word_order_pair

    nb = dict(positional_notebook)
    pair = word_order_pair()
    assert nb["order_gap"](pair["embeddings"], pair["order"]) < 1e-12
    pe = nb["sinusoidal_encoding"](5, 4)
    assert nb["order_gap"](pair["embeddings"], pair["order"], pe) > 0.5


def _lists(fn):
    """The same function returning nested Python lists (what .tolist() gives)."""
    def as_lists(*args, **kwargs):
        out = fn(*args, **kwargs)
        return out.tolist() if hasattr(out, "tolist") else out
    return as_lists


@pytest.mark.parametrize("name", ["sinusoidal_encoding", "shift_matrix", "dot_by_offset", "embed"])
def test_nested_list_answers_pass(positional_notebook, name):
    """A table returned as a list of lists is a valid answer (the visible tests take it too)."""
    from grader.checks import check

    check(f"positional_encoding-{name}", _lists(positional_notebook[name]))
