"""Mistake and variant cases of notebook 03's checks, run in process (no kernel).

Every mistake must be rejected with its own diagnosis; every valid alternative must
score full marks (exercise-standard.md, item 6). The course's mask convention is
True = may attend; PyTorch's nn.MultiheadAttention key_padding_mask (True = ignore)
is the inverted mistake.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from grader.checks import CheckFailed, check
from tests.conftest import solution_namespace
from tests.check_cases import _verdict_for_seed, shared_tests
from tests.scope import student_seeds


@pytest.fixture(scope="module")
def masking() -> dict:
    """The reference functions of notebook 03 (padding_mask_from_lengths, ...)."""
    return solution_namespace("03_masking")


def stub(*args, **kwargs):
    raise NotImplementedError()


def _softmax(x, axis=-1):
    with np.errstate(invalid="ignore"):  # a wrong axis may softmax a column of -inf
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)


def _positions(max_len):
    return np.arange(max_len)[None, :]


# --- combine_masks: learner-style functions that handle causal=None --------------------
def _with_causal(keys, causal, op=np.logical_and):
    return keys if causal is None else op(keys, causal)


def _combine_query_axis(padding, causal):
    return _with_causal(padding[:, None, :, None], causal)


def _combine_q_by_1(padding, causal):
    return _with_causal(padding[:, :, None], causal)


def _combine_no_heads(padding, causal):
    return _with_causal(padding[:, None, :], causal)


def _combine_or(padding, causal):
    return _with_causal(padding[:, None, None, :], causal, np.logical_or)


def _combine_inverted(padding, causal):
    return ~_with_causal(padding[:, None, None, :], causal)


def _combine_torch_style_ignore(padding, causal):
    # PyTorch's convention: build "ignore" masks and OR them
    ignore = ~torch.as_tensor(padding)[:, None, None, :]
    return ignore if causal is None else ignore | ~torch.as_tensor(causal)


def _combine_ignores_causal(padding, causal):
    return padding[:, None, None, :]


def _combine_ignores_padding(padding, causal):
    return causal if causal is not None else padding[:, None, None, :]


def _combine_without_none(padding, causal):
    return padding[:, None, None, :] & causal


def _combine_square_when_none(padding, causal):
    keys = padding[:, None, None, :]
    if causal is None:
        k = padding.shape[-1]
        return np.broadcast_to(keys, (padding.shape[0], 1, k, k))
    return keys & causal


def _gpt2_masked_bias(scores, mask):
    # GPT-2's attention (Hugging Face transformers): torch.where(causal, w, self.masked_bias), -1e4
    w = torch.as_tensor(scores)
    w = torch.where(torch.as_tensor(mask), w, torch.tensor(-1e4, dtype=w.dtype))
    return torch.nn.functional.softmax(w, dim=-1)


def ref_combine(padding, causal):
    keys = padding[:, None, None, :]
    return keys if causal is None else keys & causal


# The mistakes of grader/checks/masking.py's catalogue are asserted by tests/test_catalogue.py;
# these are the others (torch code, stubs, and implementations the catalogue does not hold).
MISTAKES = {
    "masking-padding_mask_from_lengths": [
        (lambda lengths, max_len: np.arange(1, max_len + 1)[None, :] < lengths[:, None], "one True too few"),
        (lambda lengths, max_len: torch.arange(max_len)[None, :] >= torch.as_tensor(lengths)[:, None],
         "key_padding_mask"),
        (lambda lengths, max_len: np.where(_positions(max_len) < lengths[:, None], 1.0, -np.inf), "holds -inf"),
        (lambda lengths, max_len: str(lengths), "should be a numpy array or torch tensor"),
        (lambda lengths, maxlen: _positions(maxlen) < lengths[:, None], "unexpected keyword argument 'max_len'"),
        (stub, "not answered yet"),
    ],
    "masking-padding_mask_from_ids": [
        (lambda ids, pad_id: ids > 0, "treats token id 0 as padding"),
        (lambda ids, pad_id: ids.astype(bool), "treats token id 0 as padding"),
        (lambda ids, pad_id: np.cumprod(ids != pad_id, axis=1).astype(bool), "padding is at the end"),
        (stub, "not answered yet"),
    ],
    "masking-causal_mask": [
        (lambda size: np.tril(np.ones((size, size), dtype=bool), k=-1), "off by one on the diagonal"),
        (lambda size: torch.ones(size, size, dtype=torch.bool).triu(diagonal=1), "attn_mask"),
        (lambda size: torch.nn.Transformer.generate_square_subsequent_mask(size), "additive float mask"),
        (lambda size: np.where(np.tril(np.ones((size, size))), 0.0, -1e9), "holds 0 and -1e+09: that is an additive"),
        (lambda size: np.tril(np.ones((size, size - 1), dtype=bool)), "has shape"),
        (stub, "not answered yet"),
    ],
    "masking-combine_masks": [
        (_combine_query_axis, "on the query axis"),
        (_combine_q_by_1, "query axis (batch, q_len, 1)"),
        (_combine_no_heads, "no heads axis"),
        (_combine_or, "with OR"),
        (_combine_inverted, "inverted"),
        (_combine_torch_style_ignore, "key_padding_mask"),
        (_combine_ignores_causal, "ignores the causal mask"),
        (_combine_ignores_padding, "ignores the padding mask"),
        (_combine_without_none, "causal may be None"),
        (_combine_square_when_none, "no q_len to know"),
        (lambda padding, causal: (1.0 - ref_combine(padding, causal)) * -10000.0, "holds 0 and -10000: that is an additive"),
        (stub, "not answered yet"),
    ],
    "masking-apply_mask": [
        (lambda scores, mask, fill=-1e4: np.where(mask, scores, fill), "hold -10000, a finite fill"),
        (lambda scores, mask, fill=-1e9: torch.as_tensor(scores).masked_fill(~torch.as_tensor(mask), -1e5)
         if fill == -1e9 else np.where(mask, scores, fill), "hold -100000, a finite fill"),
        (lambda scores, mask, fill=-1e9: scores * mask, "fills the masked positions with 0"),
        (lambda scores, mask, fill=-1e9: torch.as_tensor(scores).masked_fill(torch.as_tensor(mask), fill),
         "inverted"),
        (lambda scores, mask, fill=-1e9: _softmax(np.where(mask, scores, fill)), "pass through unchanged"),
        (stub, "not answered yet"),
    ],
    "masking-masked_softmax": [
        (lambda scores, mask: torch.softmax(torch.as_tensor(scores).masked_fill(~torch.as_tensor(mask), float("inf")),
                                            dim=-1), "NaN in every row that masks a key"),
        (lambda scores, mask: _softmax(scores * mask + (~mask) * -np.inf), "NaN in every row that masks a key"),
        (lambda scores, mask: torch.nn.functional.softmax(
            torch.as_tensor(scores).masked_fill(~torch.as_tensor(mask), float("-inf"))), "an implicit dim"),
        (lambda scores, mask: np.exp(np.where(mask, scores, -np.inf)) / np.exp(np.where(mask, scores, -np.inf)).sum(),
         "over the whole array at once"),
        (lambda scores, mask: (lambda e: e / e.sum(axis=-1))(np.exp(np.where(mask, scores, -np.inf))),
         "keepdims=True forgotten"),
        (lambda scores, mask: _softmax(np.where(mask, scores, -np.inf), axis=0), "over another axis than the keys"),
        (_gpt2_masked_bias, "of order -1e4 (GPT-2's masked_bias is -1e4)"),
        (lambda scores, mask: _softmax(np.where(mask, scores, np.finfo(np.float16).min)), "of order -1e5"),
        (lambda scores, mask: _softmax(np.where(mask, scores, -1e8)), "of order -1e8"),
        (lambda scores, mask: _softmax(np.where(mask, scores, -100.0)), "filled with a finite number (such as -1e4"),
        (lambda scores, mask: _softmax(scores * mask), "sets the masked scores to 0"),
        (lambda scores, mask: _softmax(np.where(mask, -1e9, scores)), "inverted"),
        (lambda scores, mask: _softmax(np.where(mask, scores, -np.inf), axis=-2), "each column sums to 1"),
        (stub, "not answered yet"),
    ],
}


def _lengths_loop(lengths, max_len):
    return np.array([[1 if j < n else 0 for j in range(max_len)] for n in lengths])


def _torch_masked_softmax(scores, mask):
    scores = torch.as_tensor(scores, dtype=torch.float32)
    return torch.softmax(scores.masked_fill(~torch.as_tensor(mask), float("-inf")), dim=-1)


def _renormalized(scores, mask):
    w = _softmax(scores) * mask
    return w / w.sum(axis=-1, keepdims=True)


def _apply_mask_neg_inf_default(scores, mask, fill=-np.inf):
    return np.where(mask, scores, fill)


def _combine_torch(padding, causal):
    keys = torch.as_tensor(padding)[:, None, None, :]
    return keys if causal is None else torch.logical_and(keys, torch.as_tensor(causal))


def _combine_int(padding, causal):
    keys = padding.astype(np.int64).reshape(padding.shape[0], 1, 1, -1)
    return keys if causal is None else keys * causal.astype(np.int64)


VARIANTS = {
    "masking-padding_mask_from_lengths": [
        lambda lengths, max_len: _positions(max_len) < lengths[:, None],
        lambda lengths, max_len: np.arange(1, max_len + 1)[None, :] <= lengths[:, None],
        lambda lengths, max_len: torch.arange(max_len)[None, :] < lengths[:, None],  # torch retry
        _lengths_loop,
        lambda lengths, max_len: (_positions(max_len) < lengths[:, None]).astype(np.float32),
    ],
    "masking-padding_mask_from_ids": [
        lambda ids, pad_id: ids != pad_id,
        lambda ids, pad_id: ~(ids == pad_id),
        lambda ids, pad_id: ids.ne(pad_id),  # torch-only code: the check retries with tensors
        lambda ids, pad_id: np.not_equal(ids, pad_id).astype(np.int64),
    ],
    "masking-causal_mask": [
        lambda size: np.tril(np.ones((size, size), dtype=bool)),
        lambda size: np.arange(size)[None, :] <= np.arange(size)[:, None],
        lambda size: ~np.triu(np.ones((size, size), dtype=bool), k=1),
        lambda size: torch.tril(torch.ones(size, size)),  # float 0/1, as in many tutorials
        lambda size: torch.ones(size, size, dtype=torch.bool).tril(),
    ],
    "masking-combine_masks": [
        lambda padding, causal: _with_causal(padding[:, None, None, :], causal),
        lambda padding, causal: padding[:, None, None, :] & (True if causal is None else causal),
        _combine_torch,
        _combine_int,
        lambda padding, causal: _with_causal(padding.reshape(len(padding), 1, 1, -1), causal, np.multiply),
    ],
    "masking-apply_mask": [
        lambda scores, mask, fill=-1e9: np.where(mask, scores, fill),
        _apply_mask_neg_inf_default,
        lambda scores, mask, fill=-1e9: torch.as_tensor(scores).masked_fill(~torch.as_tensor(mask), fill),
        lambda scores, mask, fill=-1e9: scores.masked_fill(~mask, fill),  # torch-only code
        lambda scores, mask, fill=-1e9: scores + np.where(mask, 0.0, fill),  # additive
        lambda scores, mask, fill=-1e9: np.where(mask, scores.astype(np.float32), np.float32(fill)),
        lambda scores, mask, fill=torch.finfo(torch.float32).min: torch.as_tensor(
            scores, dtype=torch.float32).masked_fill(~torch.as_tensor(mask), fill),
    ],
    "masking-masked_softmax": [
        lambda scores, mask: _softmax(np.where(mask, scores, -np.inf)),
        lambda scores, mask: _softmax(np.where(mask, scores, -1e9)),
        _torch_masked_softmax,
        _renormalized,
        lambda scores, mask: torch.softmax(scores.masked_fill(~mask, -1e9), dim=-1),  # torch-only
        lambda scores, mask: _softmax(np.where(mask, scores, -1e30)),
        lambda scores, mask: _softmax(np.where(mask, scores, np.finfo(scores.dtype).min)),
        lambda scores, mask: torch.softmax(torch.as_tensor(scores, dtype=torch.float32).masked_fill(
            ~torch.as_tensor(mask), torch.finfo(torch.float32).min), dim=-1),
        lambda scores, mask: _softmax(scores + np.where(mask, 0.0, -1e9)),  # additive
    ],
}


globals().update(shared_tests("masking", MISTAKES, VARIANTS, solutions="masking"))


def test_masked_softmax_built_on_apply_mask_passes(masking):
    """The notebook suggests masked_softmax = softmax(apply_mask(...)); with either fill."""
    apply_mask = masking["apply_mask"]
    check("masking-masked_softmax", lambda s, m: _softmax(apply_mask(s, m)))
    check("masking-masked_softmax", lambda s, m: _softmax(apply_mask(s, m, fill=-np.inf)))


def test_checks_do_not_modify_or_trust_learner_inputs():
    """A function that changes its inputs in place is judged on what it returns."""
    def in_place(scores, mask, fill=-1e9):
        scores[...] = np.where(mask, scores, fill)
        return scores
    check("masking-apply_mask", in_place)


def test_diagnoses_do_not_print_hidden_inputs():
    """A diagnosis names the mistake, not the hidden lengths, ids or scores."""
    with pytest.raises(CheckFailed) as failure:
        check("masking-padding_mask_from_lengths", MISTAKES["masking-padding_mask_from_lengths"][0][0])
    assert "[" not in str(failure.value)


FINITE_FILLS = [-1e3, -1e4, -3e4, -65504.0, -1e5, -1e6, -1e7, -1e8, -2e8]


@pytest.mark.parametrize("fill", FINITE_FILLS)
def test_every_seed_rejects_a_finite_fill_that_real_scores_go_below(fill):
    """A finite fill above some real scores (GPT-2's masked_bias, -1e4, and the whole kind up to
    -2e8) is rejected on every seed, with a diagnosis that names a finite fill; -1e9 (the
    docstring's default) and -inf pass (VARIANTS)."""
    def masked_softmax(scores, mask):
        return _softmax(np.where(mask, scores, fill))

    def apply_mask(scores, mask, fill_=None):
        return np.where(mask, scores, fill if fill_ is None else fill_)

    for seed in student_seeds(10):
        message = _verdict_for_seed("masking-masked_softmax", masked_softmax, seed)
        assert message and "filled with a finite number" in message, (seed, message)
        message = _verdict_for_seed("masking-apply_mask", lambda s, m, fill=None: apply_mask(s, m, fill), seed)
        assert message and f"hold {fill:g}, a finite fill" in message, (seed, message)
