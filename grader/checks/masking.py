"""Hidden checks of notebook 03, masking.

One convention throughout: a mask is boolean and **True = may attend** (False = masked
out), as in ``torch.nn.functional.scaled_dot_product_attention``'s boolean
``attn_mask``, and the opposite of ``torch.nn.MultiheadAttention``'s
``key_padding_mask`` (True = ignore). A mask answer is judged by its values: bool, or
0/1 numbers of any dtype, are accepted.

Sizes are pairwise distinct (batch 2 or 3 or 4, heads 3, query length 4, key length 5
or 6) so that a swapped axis either raises or shows. Every row of every mask given to
``apply_mask`` and ``masked_softmax`` has at least one True and one False entry: no
fully masked rows (their result is a convention, see the notebook), and an inverted
mask has none either, so that it is diagnosed rather than hidden behind NaN.
"""
from __future__ import annotations

import numpy as np

from ._core import CheckFailed, Question, close, exercise, judge, to_array, value

# Masked scores must be at most this (or -inf) when the default fill is used: e^-1e4
# is 0 in float64, so the masked keys get no weight after the softmax.
LARGE_NEGATIVE = -1e4

INVERTED = ("it is inverted: True marks the positions to ignore (the convention of PyTorch's "
            "nn.MultiheadAttention key_padding_mask); in this course True = may attend")


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _mask_values(answer: object, what: str) -> np.ndarray:
    """A mask answer as float64 0/1, or a diagnosis when it holds other values."""
    got = to_array(answer, what)
    if np.any(np.isneginf(got)):
        raise CheckFailed(
            f"{what} holds -inf: that is an additive float mask (0 where allowed, -inf where "
            "masked, like torch.nn.Transformer.generate_square_subsequent_mask); here a mask "
            "is boolean, True = may attend")
    if not np.all((got == 0) | (got == 1)):
        raise CheckFailed(f"{what} should hold only True/False (or 1/0), but it holds other values")
    return got


def _lengths(rng: np.random.Generator, batch: int, low: int, high: int, must: tuple = ()) -> np.ndarray:
    """``batch`` distinct lengths in [low, high], including the values in ``must``."""
    rest = [n for n in range(low, high + 1) if n not in must]
    picked = list(must) + list(rng.choice(rest, size=batch - len(must), replace=False))
    return rng.permutation(np.array(picked, dtype=np.int64))


def _prefix(lengths: np.ndarray, size: int) -> np.ndarray:
    return np.arange(size)[None, :] < lengths[:, None]


# ---------------------------------------------------------------------------------------
@exercise("masking-padding_mask_from_lengths", "padding_mask_from_lengths")
def padding_mask_from_lengths_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # batch 3 padded to 7, every sequence shorter than max_len; then batch 4 padded to 5,
    # with one full-length sequence and one of length 1, max_len passed by keyword.
    for batch, max_len, must, by_keyword in [(3, 7, (), False), (4, 5, (1, 5), True)]:
        lengths = _lengths(rng, batch, 1, max_len if must else max_len - 1, must)
        expected = _prefix(lengths, max_len)
        what = f"padding_mask_from_lengths(lengths, max_len) for {batch} lengths and max_len {max_len}"
        mistakes = [
            (INVERTED, ~expected),
            ("one True too many in each row (lengths off by one): a sequence of length n fills "
             "positions 0 .. n-1, so position n is already padding: compare position < length, "
             "not <=", _prefix(lengths + 1, max_len)),
            ("one True too few in each row (lengths off by one): the last real token is masked; "
             "positions are 0-based, a sequence of length n fills positions 0 .. n-1",
             _prefix(lengths - 1, max_len)),
            ("it has one row per position and one column per sequence; the mask is "
             "(batch, max_len): one row per sequence, np.arange(max_len)[None, :] < "
             "lengths[:, None]", expected.T),
        ]
        if lengths.max() < max_len:
            mistakes.append(("it has only max(lengths) columns; the mask must have max_len "
                             "columns, the padded length of the batch, which can be longer "
                             "than the longest sequence", expected[:, :lengths.max()]))

        def verify(got, expected=expected, what=what, mistakes=mistakes) -> None:
            judge(_mask_values(got, what), expected, what, mistakes)

        kwargs = {"max_len": max_len} if by_keyword else {}
        args = (lengths,) if by_keyword else (lengths, max_len)
        asked.append(Question(args, verify, kwargs))
    return asked


# ---------------------------------------------------------------------------------------
def _token_ids(rng: np.random.Generator, lengths: np.ndarray, seq_len: int, pad_id: int,
               left: bool) -> np.ndarray:
    """Token ids with pad_id after (or before) each sequence; 0 is a real token in each row."""
    vocab = np.array([t for t in range(10) if t != pad_id])
    ids = np.full((len(lengths), seq_len), pad_id, dtype=np.int64)
    for b, n in enumerate(lengths):
        tokens = rng.choice(vocab, size=n)
        tokens[rng.integers(n)] = 0  # token id 0 is a real word here, not padding
        if left:
            ids[b, seq_len - n:] = tokens
        else:
            ids[b, :n] = tokens
    return ids


@exercise("masking-padding_mask_from_ids", "padding_mask_from_ids")
def padding_mask_from_ids_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # right padding (batch 3, length 6), then left padding (batch 2, length 5) with
    # pad_id by keyword; pad_id is never 0 and id 0 is a real token.
    for batch, seq_len, left in [(3, 6, False), (2, 5, True)]:
        pad_id = int(rng.integers(1, 4))
        lengths = _lengths(rng, batch, 2, seq_len - 1)
        ids = _token_ids(rng, lengths, seq_len, pad_id, left)
        expected = ids != pad_id
        side = "left" if left else "right"
        what = f"padding_mask_from_ids(token_ids, pad_id) for {side}-padded token ids {ids.shape}"
        mistakes = [
            (INVERTED + ": token_ids != pad_id", ~expected),
            ("it treats token id 0 as padding; the padding token is pad_id, which need not "
             "be 0 (id 0 is a real token here): compare with pad_id", ids != 0),
            ("it treats token id 0 as padding and marks pad tokens as real; compare with "
             "pad_id: token_ids != pad_id", ids == 0),
        ]
        if left:
            mistakes += [
                ("it assumes the padding is at the end of each row (it builds a prefix from a "
                 "count or from the first pad); pads can sit anywhere, for example on the "
                 "left: compare every position with pad_id", _prefix(expected.sum(axis=1), seq_len)),
                ("it assumes the padding is at the end of each row (everything after the first "
                 "pad is masked); pads can sit anywhere, for example on the left: compare "
                 "every position with pad_id", np.cumprod(expected, axis=1)),
            ]

        def verify(got, expected=expected, what=what, mistakes=mistakes) -> None:
            judge(_mask_values(got, what), expected, what, mistakes)

        asked.append(Question((ids,), verify, {"pad_id": pad_id}) if left
                     else Question((ids, pad_id), verify))
    return asked


# ---------------------------------------------------------------------------------------
@exercise("masking-causal_mask", "causal_mask")
def causal_mask_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for size in [5, int(rng.integers(6, 9))]:
        ones = np.ones((size, size), dtype=bool)
        expected = np.tril(ones)
        what = f"causal_mask({size})"
        mistakes = [
            ("it masks the diagonal (off by one on the diagonal, a strict triangle): every "
             "token may attend to itself, so keep j <= i: np.tril(..., k=0)", np.tril(ones, k=-1)),
            ("it lets each token see the next one (off by one on the diagonal): query i may "
             "attend to keys j <= i only: np.tril(..., k=0)", np.tril(ones, k=1)),
            ("it is inverted: True marks the future positions to hide (the convention of "
             "PyTorch's nn.MultiheadAttention attn_mask); in this course True = may attend: "
             "the lower triangle with its diagonal", np.triu(ones, k=1)),
            ("it is the upper triangle, transposed: row i is query i and may attend to keys "
             "(columns) j <= i, on and below the diagonal", np.triu(ones)),
            ("it allows everything; a causal mask hides the future (above the diagonal)", ones),
        ]

        def verify(got, expected=expected, what=what, mistakes=mistakes) -> None:
            judge(_mask_values(got, what), expected, what, mistakes)

        asked.append(Question((size,), verify))
    return asked


# ---------------------------------------------------------------------------------------
@exercise("masking-combine_masks", "combine_masks")
def combine_masks_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    # 1. decoder self-attention: batch 3, sequences of length 5, a square causal mask;
    # 2. a block of 4 queries at the end of 6 keys (q_len != k_len), batch 2;
    # 3. no causal mask (an encoder): batch 4, 6 keys.
    for batch, q_len, k_len in [(3, 5, 5), (2, 4, 6), (4, None, 6)]:
        padding = _prefix(_lengths(rng, batch, 1, k_len, (k_len,) if batch < k_len else ()), k_len)
        causal = None if q_len is None else np.tril(np.ones((k_len, k_len), dtype=bool))[k_len - q_len:]
        keys = padding[:, None, None, :]
        expected = keys if causal is None else keys & causal
        if causal is None:
            what = f"combine_masks(padding, None) for padding {padding.shape}"
            mistakes = [
                (INVERTED, ~expected),
                ("the padding mask is on the query axis: it must mask the keys, the last axis "
                 "(padding[:, None, None, :] has shape (batch, 1, 1, k_len))", padding[:, None, :, None]),
                ("it has no heads axis: (batch, 1, k_len) would broadcast its batch axis against "
                 "the heads of scores (batch, heads, q_len, k_len); return (batch, 1, 1, k_len)",
                 padding[:, None, :]),
                ("it returns the padding mask unchanged, shape (batch, k_len); it must broadcast "
                 "over (batch, heads, q_len, k_len): padding[:, None, None, :]", padding),
            ]
            if batch != k_len:
                mistakes.append(("it spreads the padding mask over k_len queries; with no causal "
                                 "mask there is no q_len to know (in cross-attention q_len != k_len): "
                                 "return (batch, 1, 1, k_len), which broadcasts over every query",
                                 np.broadcast_to(keys, (batch, 1, k_len, k_len))))
        else:
            what = (f"combine_masks(padding, causal) for padding {padding.shape} "
                    f"and causal {causal.shape}")
            mistakes = [
                (INVERTED, ~expected),
                ("it combines the masks with OR; a key may be attended only if both masks allow "
                 "it: use & (logical and)", keys | causal),
                ("the padding mask is on the query axis: it must mask the keys, the last axis: "
                 "padding[:, None, None, :]", padding[:, None, :, None] & causal
                 if q_len == k_len else None),
                ("the padding mask is on the query axis (batch, q_len, 1) and there is no heads "
                 "axis: padding masks the keys, padding[:, None, None, :] of shape "
                 "(batch, 1, 1, k_len)", padding[:, :, None] & causal if q_len == k_len else None),
                ("it has no heads axis: (batch, q_len, k_len) would broadcast its batch axis "
                 "against the heads of scores (batch, heads, q_len, k_len); insert axis 1 to get "
                 "(batch, 1, q_len, k_len)", padding[:, None, :] & causal),
                ("it ignores the causal mask", np.broadcast_to(keys, expected.shape)),
                ("it ignores the causal mask", keys),
                ("it ignores the padding mask", np.broadcast_to(causal, expected.shape)),
                ("it ignores the padding mask", causal),
            ]
            mistakes = [(m, w) for m, w in mistakes if w is not None]

        def verify(got, expected=expected, what=what, mistakes=mistakes, square=q_len == k_len,
                   q_len=q_len) -> None:
            try:
                value(got, "combine_masks")
            except CheckFailed as error:
                if q_len is None:
                    raise CheckFailed(f"{error}. causal may be None (an encoder has no look-ahead "
                                      "mask): then return the padding mask alone as "
                                      "(batch, 1, 1, k_len)") from None
                if not square:
                    raise CheckFailed(f"{error}. It fails when q_len != k_len (causal of shape "
                                      "(q_len, k_len)): the padding mask covers the keys, the "
                                      "last axis: padding[:, None, None, :]") from None
                raise
            judge(_mask_values(got, what), expected, what, mistakes)

        asked.append(Question((padding, causal), verify))
    return asked


# ---------------------------------------------------------------------------------------
def _attention_mask(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """A random mask with at least one True and one False in every row and column."""
    while True:
        mask = rng.random(shape) < 0.6
        if all(np.any(mask, axis=a).all() and np.any(~mask, axis=a).all() for a in (-1, -2)):
            return mask


def _mask_questions(rng: np.random.Generator) -> list[tuple]:
    """(scores, mask, label) for apply_mask and masked_softmax: batch 2, heads 3, q 4, k 5."""
    shape = (2, 3, 4, 5)
    lengths = _lengths(rng, 2, 2, 4)
    return [
        (rng.normal(scale=3.0, size=shape), _attention_mask(rng, (2, 1, 4, 5)),
         "a combined mask (2, 1, 4, 5)"),
        (rng.normal(scale=3.0, size=shape), _prefix(lengths, 5)[:, None, None, :],
         "a padding mask (2, 1, 1, 5)"),
        (rng.normal(scale=3.0, size=shape), np.tril(np.ones((4, 5), dtype=bool)),
         "a mask (4, 5) with no batch or heads axis"),
    ]


@exercise("masking-apply_mask", "apply_mask")
def apply_mask_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for index, (scores, mask, label) in enumerate(_mask_questions(rng)):
        fill = -1e4 if index == 2 else None  # the last question passes its own fill
        name = f"apply_mask(scores, mask{'' if fill is None else ', fill=-1e4'})"
        what = f"{name} for scores {scores.shape} and {label}"

        def verify(got, scores=scores, mask=mask, fill=fill, what=what, name=name) -> None:
            try:
                got = to_array(got, name)
            except CheckFailed as error:
                raise CheckFailed(f"{error}. The mask broadcasts against the scores (it can have "
                                  "fewer or length-1 axes): np.where(mask, scores, fill) handles "
                                  "that, boolean indexing scores[~mask] does not") from None
            if got.shape != scores.shape:
                raise CheckFailed(f"{what} has shape {got.shape}; expected the shape of the scores "
                                  f"{scores.shape} (the mask broadcasts against them)")
            keep = np.broadcast_to(mask, scores.shape)
            kept, masked = got[keep], got[~keep]
            if np.any(np.isnan(kept)):
                raise CheckFailed(f"{what} has NaN where the mask is True: 0 * -inf is nan, so "
                                  "multiplying the mask by -inf spoils the kept scores; use "
                                  "np.where(mask, scores, fill)")

            def filled(x: np.ndarray, where: np.ndarray) -> np.ndarray:
                if fill is None:
                    return np.isneginf(x) | (x <= LARGE_NEGATIVE)
                return (np.isclose(x, fill, rtol=0, atol=1e-3)
                        | np.isclose(x, scores[where] + fill, rtol=0, atol=1e-3))

            if close(masked, scores[~keep]) and np.all(filled(kept, keep) | (kept == 0)):
                raise CheckFailed(f"{what}: {INVERTED}: fill where the mask is False")
            if not close(kept, scores[keep]):
                raise CheckFailed(f"{what}: the scores where the mask is True must pass through "
                                  "unchanged; only the masked positions (False) change")
            if np.all(filled(masked, ~keep)):
                return
            if np.allclose(masked, 0):
                raise CheckFailed(f"{what}: it fills the masked positions with 0; a score of 0 "
                                  "still gets weight e^0 = 1 in the softmax: use a large negative "
                                  "number (fill) or -inf")
            if close(masked, scores[~keep]):
                raise CheckFailed(f"{what}: it leaves the masked positions unchanged; set them "
                                  "to fill where the mask is False")
            if fill is not None and (np.all(np.isneginf(masked)) or np.all(masked <= -1e6)):
                raise CheckFailed(f"{what}: it ignores the fill argument (the check passed "
                                  "fill=-1e4, as for float16): write fill at the masked positions")
            raise CheckFailed(f"{what}: the masked positions should hold "
                              + ("a large negative number (the fill, -1e9 by default) or -inf"
                                 if fill is None else "the given fill"))

        asked.append(Question((scores, mask), verify, {} if fill is None else {"fill": fill}))
    return asked


# ---------------------------------------------------------------------------------------
@exercise("masking-masked_softmax", "masked_softmax")
def masked_softmax_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for scores, mask, label in _mask_questions(rng):
        name = "masked_softmax(scores, mask)"
        what = f"{name} for scores {scores.shape} and {label}"
        keep = np.broadcast_to(mask, scores.shape)
        expected = _softmax(np.where(keep, scores, -np.inf))
        mistakes = [
            ("it masks after the softmax: the masked weights are 0 but each row no longer sums "
             "to 1; fill the masked scores with a large negative number before the softmax",
             _softmax(scores) * keep),
            ("it sets the masked scores to 0 before the softmax; a score of 0 still gets weight "
             "e^0 = 1: fill with a large negative number or -inf", _softmax(np.where(keep, scores, 0.0))),
            (INVERTED + ": keep the scores where the mask is True", _softmax(np.where(keep, -np.inf, scores))),
            ("each column sums to 1 instead of each row: take the softmax over the key axis "
             "(axis=-1)", _softmax(np.where(keep, scores, -1e9), axis=-2)),
            ("it ignores the mask: masked keys still get weight", _softmax(scores)),
        ]

        def hint(w: np.ndarray, keep=keep) -> str | None:
            if np.any(np.abs(w[~keep]) > 1e-6):
                return "masked keys (mask False) get weight; their weight must be 0"
            if not np.allclose(w.sum(axis=-1), 1.0, atol=1e-4):
                return "each query's weights over the keys must sum to 1"
            return None

        def verify(got, expected=expected, what=what, mistakes=mistakes, hint=hint) -> None:
            try:
                value(got, "masked_softmax")
            except CheckFailed as error:
                raise CheckFailed(f"{error}. The mask broadcasts against the scores (it can have "
                                  "fewer or length-1 axes): np.where(mask, scores, fill) handles "
                                  "that") from None
            judge(got, expected, what, mistakes, hints=[hint])

        asked.append(Question((scores, mask), verify))
    return asked
