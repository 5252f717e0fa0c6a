"""Hidden checks of notebook 03, masking: the specs of its six exercises.

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

Real scores can lie far below 0, so the masked scores must be filled with something below
every score: -inf, or the default -1e9 (the scores here stay above it). A finite fill above
some real scores (GPT-2's masked_bias of -1e4, -1e5 ...) gives the masked keys the weight
in the rows whose scores all lie below it: every seed asks a question with such rows
(:func:`sunk`), at levels from -10^2.5 to -10^8.5, one decade apart, so that the rows a fill
spoils tell its order of magnitude (:func:`finite_fill_hints`).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ._core import Call, Case, CheckFailed, Hint, Mistake, Raises, Rule, Spec, close, judge_case, to_array
from ._softmax_kinds import keepdims_rule, no_keepdims_sum, softmax_axis_hints
from .reference import masking as ref
from .reference.softmax import stable_softmax

# The docstring's default fill: masked scores must be at most this (or -inf) when no fill
# is given, for the softmax to give the masked keys weight 0 whatever the real scores.
DEFAULT_FILL = -1e9

# The rows of very negative scores (:func:`sunk`): their best kept score is -10^(j + 0.5) for
# each j here, so that a finite fill of order -1e{k} spoils exactly the rows with j >= k.
SUNK_DECADES = range(2, 9)

INVERTED = ("it is inverted: True marks the positions to ignore (the convention of PyTorch's "
            "nn.MultiheadAttention key_padding_mask); in this course True = may attend")


def _mask_values(answer: object, call: Call, what: str) -> np.ndarray:
    """A mask answer as float64 0/1.

    Raises:
        CheckFailed: the answer holds -inf (an additive mask) or values other than 0 and 1.
    """
    got = to_array(answer, what)
    if np.any(np.isneginf(got)):
        raise CheckFailed(
            f"{what} holds -inf: that is an additive float mask (0 where allowed, -inf where "
            "masked, like torch.nn.Transformer.generate_square_subsequent_mask); here a mask "
            "is boolean, True = may attend")
    negative = np.unique(got[got < 0])
    if len(negative) == 1 and np.all((got == 0) | (got == negative[0])):
        raise CheckFailed(
            f"{what} holds 0 and {negative[0]:g}: that is an additive float mask (0 where allowed, a large "
            "negative number where masked, like the extended attention mask of Hugging Face models); here a "
            "mask is boolean, True = may attend")
    if not np.all((got == 0) | (got == 1)):
        raise CheckFailed(f"{what} should hold only True/False (or 1/0), but it holds other values")
    return got


def _lengths(rng: np.random.Generator, batch: int, low: int, high: int, must: tuple = ()) -> np.ndarray:
    """``batch`` distinct lengths in [low, high], including the values in ``must``."""
    rest = [n for n in range(low, high + 1) if n not in must]
    picked = list(must) + list(rng.choice(rest, size=batch - len(must), replace=False))
    return rng.permutation(np.array(picked, dtype=np.int64))


def _max_len(call: Call) -> int:
    return call.kwargs.get("max_len", call.args[-1])


def _pad_id(call: Call) -> int:
    return call.kwargs.get("pad_id", call.args[-1])


def _positions(size: int) -> np.ndarray:
    return np.arange(size)[None, :]


# ------------------------------------------------------------------ padding_mask_from_lengths
def _lengths_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # batch 3 padded to 7, every sequence shorter than max_len; then batch 4 padded to 5,
    # with one full-length sequence, one of length 1 and one of length 0 (all padding, which
    # the docstring allows), max_len passed by keyword.
    for batch, max_len, must, by_keyword in [(3, 7, (), False), (4, 5, (0, 1, 5), True)]:
        lengths = _lengths(rng, batch, 1, max_len if must else max_len - 1, must)
        what = f"padding_mask_from_lengths(lengths, max_len) for {batch} lengths and max_len {max_len}"
        calls.append(Call((lengths,), {"max_len": max_len}, what=what) if by_keyword
                     else Call((lengths, max_len), what=what))
    return calls


PADDING_MASK_FROM_LENGTHS = Spec(
    id="masking-padding_mask_from_lengths",
    function="padding_mask_from_lengths",
    inputs=_lengths_inputs,
    reference=ref.padding_mask_from_lengths,
    rules=(Rule("a sequence of length 0 (an all-False row)", lambda call: 0 in call.args[0]),
           Rule("a sequence of the full length max_len (an all-True row)",
                lambda call: _max_len(call) in call.args[0]),
           Rule("max_len above every length (padding past the longest)",
                lambda call: _max_len(call) > max(call.args[0]))),
    prepare=_mask_values,
    by_call=True,
    mistakes=(
        Mistake("inverted", INVERTED, lambda lengths, max_len: _positions(max_len) >= lengths[:, None]),
        Mistake("one_too_many", "one True too many in each row (lengths off by one): a sequence of length n "
                "fills positions 0 .. n-1, so position n is already padding: compare position < length, "
                "not <=", lambda lengths, max_len: _positions(max_len) <= lengths[:, None]),
        Mistake("one_too_few", "one True too few in each row (lengths off by one): the last real token is "
                "masked; positions are 0-based, a sequence of length n fills positions 0 .. n-1",
                lambda lengths, max_len: _positions(max_len) < lengths[:, None] - 1),
        Mistake("transposed", "it has one row per position and one column per sequence; the mask is "
                "(batch, max_len): one row per sequence, np.arange(max_len)[None, :] < lengths[:, None]",
                lambda lengths, max_len: np.arange(max_len)[:, None] < lengths[None, :]),
        Mistake("longest_only", "it has only max(lengths) columns; the mask must have max_len columns, the "
                "padded length of the batch, which can be longer than the longest sequence",
                lambda lengths, max_len: _positions(lengths.max()) < lengths[:, None]),
    ),
    diagnosed=(
        Mistake("additive", "holds -inf: that is an additive float mask",
                lambda lengths, max_len: np.where(_positions(max_len) < lengths[:, None], 0.0, -np.inf)),
        Mistake("other_values", "should hold only True/False (or 1/0)",
                lambda lengths, max_len: (_positions(max_len) < lengths[:, None]) * 2.0),
    ),
)


# ----------------------------------------------------------------------- padding_mask_from_ids
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


def _ids_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # right padding (batch 3, length 6), then left padding (batch 2, length 5) with
    # pad_id by keyword; pad_id is never 0 and id 0 is a real token.
    for batch, seq_len, left in [(3, 6, False), (2, 5, True)]:
        pad_id = int(rng.integers(1, 4))
        ids = _token_ids(rng, _lengths(rng, batch, 2, seq_len - 1), seq_len, pad_id, left)
        what = (f"padding_mask_from_ids(token_ids, pad_id) for {'left' if left else 'right'}-padded "
                f"token ids {ids.shape}")
        calls.append(Call((ids,), {"pad_id": pad_id}, what=what) if left else Call((ids, pad_id), what=what))
    return calls


_RIGHT_PADDING_ONLY = ("it assumes the padding is at the end of each row ({how}); pads can sit anywhere, for "
                       "example on the left: compare every position with pad_id")

PADDING_MASK_FROM_IDS = Spec(
    id="masking-padding_mask_from_ids",
    function="padding_mask_from_ids",
    inputs=_ids_inputs,
    reference=ref.padding_mask_from_ids,
    rules=(Rule("left padding (pads before the tokens)", lambda call: bool(np.any(call.args[0][:, 0] == _pad_id(call)))),
           Rule("right padding (pads after the tokens)", lambda call: bool(np.any(call.args[0][:, -1] == _pad_id(call)))),
           Rule("pad_id is not 0, and token 0 is a real token",
                lambda call: _pad_id(call) != 0 and bool(np.any(call.args[0] == 0)))),
    prepare=_mask_values,
    by_call=True,
    mistakes=(
        Mistake("inverted", INVERTED + ": token_ids != pad_id", lambda ids, pad_id: ids == pad_id),
        Mistake("zero_is_padding", "it treats token id 0 as padding; the padding token is pad_id, which need not "
                "be 0 (id 0 is a real token here): compare with pad_id", lambda ids, pad_id: ids != 0),
        Mistake("zero_is_padding_inverted", "it treats token id 0 as padding and marks pad tokens as real; "
                "compare with pad_id: token_ids != pad_id", lambda ids, pad_id: ids == 0),
        Mistake("prefix_of_count", _RIGHT_PADDING_ONLY.format(how="it builds a prefix from a count or from the "
                                                                  "first pad"),
                lambda ids, pad_id: _positions(ids.shape[1]) < (ids != pad_id).sum(axis=1, keepdims=True)),
        Mistake("after_first_pad", _RIGHT_PADDING_ONLY.format(how="everything after the first pad is masked"),
                lambda ids, pad_id: np.cumprod(ids != pad_id, axis=1)),
    ),
)


# ------------------------------------------------------------------------------- causal_mask
def _causal_inputs(rng: np.random.Generator) -> list[Call]:
    return [Call((size,), what=f"causal_mask({size})") for size in [5, int(rng.integers(6, 9))]]


def _ones(size: int) -> np.ndarray:
    return np.ones((size, size), dtype=bool)


CAUSAL_MASK = Spec(
    id="masking-causal_mask",
    function="causal_mask",
    inputs=_causal_inputs,
    reference=ref.causal_mask,
    rules=(Rule("two sizes, above 1: the diagonal and both triangles", lambda call: call.args[0] > 1),),
    equivalent=(("L3 np.ones((size, size), dtype=bool) -> np.ones((size, size))",
                 "a mask is judged by its values, and 0/1 floats are accepted (the module's docstring)"),),
    prepare=_mask_values,
    by_call=True,
    mistakes=(
        Mistake("strict", "it masks the diagonal (off by one on the diagonal, a strict triangle): every token may "
                "attend to itself, so keep j <= i: np.tril(..., k=0)", lambda size: np.tril(_ones(size), k=-1)),
        Mistake("sees_next", "it lets each token see the next one (off by one on the diagonal): query i may "
                "attend to keys j <= i only: np.tril(..., k=0)", lambda size: np.tril(_ones(size), k=1)),
        Mistake("inverted", "it is inverted: True marks the future positions to hide (the convention of "
                "PyTorch's nn.MultiheadAttention attn_mask); in this course True = may attend: the lower "
                "triangle with its diagonal", lambda size: np.triu(_ones(size), k=1)),
        Mistake("upper", "it is the upper triangle, transposed: row i is query i and may attend to keys "
                "(columns) j <= i, on and below the diagonal", lambda size: np.triu(_ones(size))),
        Mistake("everything", "it allows everything; a causal mask hides the future (above the diagonal)", _ones),
    ),
)


# ----------------------------------------------------------------------------- combine_masks
def _combine_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # 1. decoder self-attention: batch 3, sequences of length 5, a square causal mask;
    # 2. a block of 4 queries at the end of 6 keys (q_len != k_len), batch 2;
    # 3. no causal mask (an encoder): batch 4, 6 keys.
    # The last has a sequence of length 0: its rows are fully masked, as the docstring's "True where both
    # masks are True" says.
    for batch, q_len, k_len, must in [(3, 5, 5, (5,)), (2, 4, 6, (6,)), (4, None, 6, (0, 6))]:
        padding = ref.padding_mask_from_lengths(_lengths(rng, batch, 1, k_len, must), k_len)
        causal = None if q_len is None else ref.causal_mask(k_len)[k_len - q_len:]
        what = (f"combine_masks(padding, None) for padding {padding.shape}" if causal is None else
                f"combine_masks(padding, causal) for padding {padding.shape} and causal {causal.shape}")
        calls.append(Call((padding, causal), what=what))
    return calls


def _combined(keys_of, op=np.logical_and, alone=None):
    """A learner's combine_masks: ``keys_of(padding)`` combined with the causal mask by ``op``;
    ``alone(padding, keys)`` is what it returns when causal is None (default: the keys part)."""
    def combine_masks(padding, causal):
        keys = keys_of(padding)
        if causal is None:
            return keys if alone is None else alone(padding, keys)
        return op(keys, causal)
    return combine_masks


def _keys(padding):
    return padding[:, None, None, :]


def _right_unless_none(when_none):
    """Right when there is a causal mask; ``when_none(padding)`` when there is none."""
    return lambda padding, causal: when_none(padding) if causal is None else ref.combine_masks(padding, causal)


def _square_causal(padding, causal):
    # The causal part as (k_len, k_len): right for decoder self-attention only.
    k_len = padding.shape[-1]
    return _keys(padding) if causal is None else _keys(padding) & causal.reshape(1, 1, k_len, k_len)


COMBINE_MASKS = Spec(
    id="masking-combine_masks",
    function="combine_masks",
    inputs=_combine_inputs,
    reference=ref.combine_masks,
    rules=(Rule("causal None: the padding mask alone, as (batch, 1, 1, k_len)", lambda call: call.args[1] is None),
           Rule("q_len != k_len (a block of queries at the end of the keys)",
                lambda call: call.args[1] is not None and call.args[1].shape[0] != call.args[1].shape[1]),
           Rule("batch, q_len and k_len distinct", lambda call: call.args[1] is not None and len(
               {len(call.args[0]), *call.args[1].shape}) == 3),
           Rule("a sequence with no real token: its rows fully masked", lambda call: bool(
               np.any(~call.args[0].any(axis=-1))))),
    prepare=_mask_values,
    # (the mistakes that differ only without a causal mask come first: on that question
    # they give the same answer as the general ones, and their diagnosis is the one that fits)
    mistakes=(
        Mistake("query_axis_alone", "the padding mask is on the query axis: it must mask the keys, the last axis "
                "(padding[:, None, None, :] has shape (batch, 1, 1, k_len))",
                _right_unless_none(lambda padding: padding[:, None, :, None])),
        Mistake("no_heads_alone", "it has no heads axis: (batch, 1, k_len) would broadcast its batch axis against "
                "the heads of scores (batch, heads, q_len, k_len); return (batch, 1, 1, k_len)",
                _right_unless_none(lambda padding: padding[:, None, :])),
        Mistake("unchanged", "it returns the padding mask unchanged, shape (batch, k_len); it must broadcast "
                "over (batch, heads, q_len, k_len): padding[:, None, None, :]", _right_unless_none(lambda p: p)),
        Mistake("square_alone", "it spreads the padding mask over k_len queries; with no causal mask there is no "
                "q_len to know (in cross-attention q_len != k_len): return (batch, 1, 1, k_len), which "
                "broadcasts over every query",
                _combined(_keys, alone=lambda padding, keys: np.broadcast_to(
                    keys, (len(padding), 1, padding.shape[-1], padding.shape[-1])))),
        Mistake("inverted", INVERTED, lambda padding, causal: ~ref.combine_masks(padding, causal)),
        Mistake("or", "it combines the masks with OR; a key may be attended only if both masks allow it: use & "
                "(logical and)", _combined(_keys, np.logical_or)),
        Mistake("query_axis", "the padding mask is on the query axis: it must mask the keys, the last axis: "
                "padding[:, None, None, :]", _combined(lambda padding: padding[:, None, :, None])),
        Mistake("query_axis_no_heads", "the padding mask is on the query axis (batch, q_len, 1) and there is no "
                "heads axis: padding masks the keys, padding[:, None, None, :] of shape (batch, 1, 1, k_len)",
                _combined(lambda padding: padding[:, :, None])),
        Mistake("no_heads", "it has no heads axis: (batch, q_len, k_len) would broadcast its batch axis against "
                "the heads of scores (batch, heads, q_len, k_len); insert axis 1 to get (batch, 1, q_len, k_len)",
                _combined(lambda padding: padding[:, None, :])),
        Mistake("ignores_causal", "it ignores the causal mask", lambda padding, causal: _keys(padding)),
        Mistake("ignores_causal_spread", "it ignores the causal mask",
                _combined(_keys, lambda keys, causal: np.broadcast_to(keys, keys.shape[:2] + causal.shape))),
        Mistake("ignores_padding", "it ignores the padding mask",
                lambda padding, causal: _keys(padding) if causal is None else causal),
        Mistake("ignores_padding_spread", "it ignores the padding mask",
                _combined(_keys, lambda keys, causal: np.broadcast_to(causal, keys.shape[:2] + causal.shape))),
    ),
    errors=(
        Raises("combine_masks raised {error}. causal may be None (an encoder has no look-ahead mask): then "
               "return the padding mask alone as (batch, 1, 1, k_len)",
               example=lambda padding, causal: _keys(padding) & causal, when=lambda call: call.args[1] is None),
        Raises("combine_masks raised {error}. It fails when q_len != k_len (causal of shape (q_len, k_len)): "
               "the padding mask covers the keys, the last axis: padding[:, None, None, :]",
               example=_square_causal,
               when=lambda call: call.args[1] is not None and call.args[1].shape[0] != call.args[1].shape[1]),
    ),
)


# ---------------------------------------------------------------- apply_mask, masked_softmax
def _attention_mask(rng: np.random.Generator, shape: tuple) -> np.ndarray:
    """A random mask with at least one True and one False in every row and column."""
    while True:
        mask = rng.random(shape) < 0.6
        if all(np.any(mask, axis=a).all() and np.any(~mask, axis=a).all() for a in (-1, -2)):
            return mask


def sunk(rng: np.random.Generator, shape: tuple, padding: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where to sink scores of shape (batch, heads, q_len, k_len) far below 0, for a padding mask
    (batch, k_len) (:data:`SUNK_DECADES`): (levels, factors). ``levels`` (batch, heads, q_len) is
    -10^(j + 0.5) at one random row per decade j and NaN elsewhere; ``factors`` (batch, k_len) is
    1 + 0.01 r, r = 0, 1, ... over the kept keys in random order, then over the masked ones. A
    sunk row's scores are its level times the factors: its best kept score is the level, the
    other keys 1% of it (at least 30) lower, the masked keys lowest of all, so that every fill
    below the level and every softmax, renormalised after masking or not, gives the same weights
    (all of it on the best kept key), and every finite fill above the level gives them to the
    masked keys."""
    levels = np.full(shape[:3], np.nan)
    rows = rng.choice(levels.size, size=len(SUNK_DECADES), replace=False)
    levels.flat[rows] = [-10.0 ** (j + 0.5) for j in SUNK_DECADES]
    factors = np.empty(padding.shape)
    for b, keep in enumerate(padding):
        order = np.concatenate([rng.permutation(np.flatnonzero(keep)), rng.permutation(np.flatnonzero(~keep))])
        factors[b, order] = 1.0 + 0.01 * np.arange(len(keep))
    return levels, factors


def _sunk_scores(rng: np.random.Generator, shape: tuple, padding: np.ndarray) -> np.ndarray:
    """Random scores with one row per decade sunk far below 0 (:func:`sunk`)."""
    scores = rng.normal(scale=3.0, size=shape)
    levels, factors = sunk(rng, shape, padding)
    return np.where(np.isnan(levels)[..., None], scores, levels[..., None] * factors[:, None, None, :])


def _scores_and_masks(rng: np.random.Generator) -> list[tuple]:
    """(scores, mask, label) for apply_mask and masked_softmax: batch 2, heads 3, q 4, k 5; the
    last has rows of very negative scores (:func:`sunk`)."""
    shape = (2, 3, 4, 5)
    lengths = _lengths(rng, 2, 2, 4)
    found = [
        (rng.normal(scale=3.0, size=shape), _attention_mask(rng, (2, 1, 4, 5)), "a combined mask (2, 1, 4, 5)"),
        (rng.normal(scale=3.0, size=shape), _keys(ref.padding_mask_from_lengths(lengths, 5)),
         "a padding mask (2, 1, 1, 5)"),
        (rng.normal(scale=3.0, size=shape), np.tril(np.ones((4, 5), dtype=bool)),
         "a mask (4, 5) with no batch or heads axis"),
    ]
    padding = ref.padding_mask_from_lengths(_lengths(rng, 2, 2, 4), 5)
    found.append((_sunk_scores(rng, shape, padding), _keys(padding),
                  "a padding mask (2, 1, 1, 5), some rows of scores far below 0"))
    return found


def _fill_bracket(w: np.ndarray, scores: np.ndarray, keep: np.ndarray) -> tuple[float, float] | None:
    """Between which two numbers a finite fill lies, if weights ``w`` show one: (hi, lo) when the
    masked keys take most of the weight in exactly the rows whose best kept score lies below some
    number and none elsewhere (hi is the best kept score of the highest row they take, lo of the
    lowest row they spare); else None (among them: rows that share the weight, as a fill near the
    scores gives)."""
    if w.shape != scores.shape or not np.all(np.isfinite(w)):
        return None
    both = keep.any(axis=-1) & (~keep).any(axis=-1)
    best = np.where(keep, scores, -np.inf).max(axis=-1)[both]
    taken = np.where(keep, 0.0, w).sum(axis=-1)[both]
    spoilt, spared = taken > 0.5, taken <= 1e-6
    if not spoilt.any() or not spared.any() or not np.all(spoilt | spared):
        return None
    hi, lo = best[spoilt].max(), best[spared].min()
    return (float(hi), float(lo)) if hi < lo else None


POSITIVE_FILL = ("the masked scores are filled with +inf (np.inf rather than -np.inf): the softmax's maximum is "
                 "then inf, and exp(inf - inf) is NaN. Fill them with -np.inf")


def _nan_where_masked(w: np.ndarray, call: Call) -> bool:
    """NaN in every row that masks a key, and in no other."""
    keep = np.broadcast_to(call.args[1], call.args[0].shape)
    return w.shape == keep.shape and np.array_equal(np.isnan(w).any(axis=-1), (~keep).any(axis=-1)) and bool(
        np.isnan(w).any())


FILL_FIX = ("fill them with -np.inf (torch: float('-inf')), or with a number below every score: the default "
            "-1e9, or np.finfo(scores.dtype).min")


def finite_fill_hints(scores_and_keep: Callable[[Call], tuple | None], example: Callable[[float], object],
                      part: int | None = None) -> tuple[Hint, ...]:
    """The hints of a finite fill that real scores go below, for weights (item ``part`` of the
    answer): one per order of magnitude -1e{k} the sunk rows tell apart (k of SUNK_DECADES but the
    first), naming it, then one for any fill nearer 0. ``scores_and_keep(call)`` gives the call's
    scores and its mask broadcast to them (None without a mask); ``example(fill)`` is a
    learner-style implementation with that fill."""
    def bracket(w: np.ndarray, call: Call) -> tuple[float, float] | None:
        found = scores_and_keep(call)
        return None if found is None else _fill_bracket(w, *found)

    def of_order(k: int | None) -> Callable[[np.ndarray, Call], bool]:
        def applies(w: np.ndarray, call: Call) -> bool:
            found = bracket(w, call)
            if found is None or found[0] > -10.0 ** (SUNK_DECADES[0] + 0.5):
                return False
            powers = [j for j in SUNK_DECADES[1:] if found[0] < -10.0 ** j < found[1]]
            one = len(powers) == 1 and found[1] < -10.0 ** (powers[0] - 1)  # (nearer 0: not named)
            return one and powers == [k] if k is not None else not one
        return applies

    said = ("the masked keys take the weight in the rows whose scores all lie below {where}: the masked scores are "
            "filled with a finite number{which}, and real scores can be lower than it. The masked weights must be "
            "exactly 0 whatever the scores: " + FILL_FIX)
    named = tuple(Hint(said.format(where=f"about -1e{k}", which=f" of order -1e{k}" + (
                       " (GPT-2's masked_bias is -1e4)" if k == 4 else "")),
                       of_order(k), example=example(-10.0 ** k), part=part)
                  for k in SUNK_DECADES[1:])
    return named + (Hint(said.format(where="some number", which=" (such as -1e4, GPT-2's masked_bias)"),
                         of_order(None), example=example(-100.0), part=part),)


def _apply_mask_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for index, (scores, mask, label) in enumerate(_scores_and_masks(rng)):
        fill = -1e4 if index == 2 else None  # the third question passes its own fill
        name = f"apply_mask(scores, mask{'' if fill is None else ', fill=-1e4'})"
        calls.append(Call((scores, mask), {} if fill is None else {"fill": fill},
                          what=f"{name} for scores {scores.shape} and {label}"))
    # Rows fully masked (a sequence of length 0): the docstring's "fill where it is False" holds there too.
    padding = _keys(ref.padding_mask_from_lengths(_lengths(rng, 2, 0, 4, (0,)), 5))
    calls.append(Call((rng.normal(scale=3.0, size=(2, 3, 4, 5)), padding),
                      what="apply_mask(scores, mask) for scores (2, 3, 4, 5) and a padding mask (2, 1, 1, 5) with "
                           "a sequence of length 0"))
    return calls


def _judge_apply_mask(case: Case) -> None:
    """Any fill at most DEFAULT_FILL (or -inf) is right by default; a given fill must be used
    (written, or added to the score). The kept scores must pass through unchanged."""
    got, what = case.answer, case.what
    if not isinstance(got, np.ndarray):
        return judge_case(case)
    (scores, mask), fill = case.call.args, case.call.kwargs.get("fill")
    got = got.astype(np.float64)
    if got.shape != scores.shape:
        raise CheckFailed(f"{what} has shape {got.shape}; expected the shape of the scores "
                          f"{scores.shape} (the mask broadcasts against them)")
    keep = np.broadcast_to(mask, scores.shape)
    kept, masked = got[keep], got[~keep]
    if np.any(np.isnan(kept)):
        raise CheckFailed(f"{what} has NaN where the mask is True: 0 * -inf is nan, so multiplying the mask "
                          "by -inf spoils the kept scores; use np.where(mask, scores, fill)")

    def filled(x: np.ndarray, where: np.ndarray) -> np.ndarray:
        if fill is None:
            return np.isneginf(x) | (x <= DEFAULT_FILL * (1 - 1e-6))  # (added to a score: -1e9 + 2.5)
        return (np.isclose(x, fill, rtol=0, atol=1e-3)
                | np.isclose(x, scores[where] + fill, rtol=0, atol=1e-3))

    if close(masked, scores[~keep]) and np.all(filled(kept, keep) | (kept == 0)):
        case.fail(_INVERTED_FILL)
    if not close(kept, scores[keep]):
        case.fail("the scores where the mask is True must pass through unchanged; only the masked positions "
                  "(False) change")
    if np.all(filled(masked, ~keep)):
        return
    empty = np.broadcast_to(~keep.any(axis=-1, keepdims=True), keep.shape)[~keep]  # (rows with no True)
    if empty.any() and np.all(filled(masked[~empty], (~keep) & ~np.broadcast_to(
            ~keep.any(axis=-1, keepdims=True), keep.shape))) and close(masked[empty], scores[~keep][empty]):
        case.fail(_EMPTY_ROWS)
    if np.allclose(masked, 0):
        case.fail(_ZERO_FILL)
    if close(masked, scores[~keep]):
        case.fail(_UNCHANGED)
    if fill is not None and (np.all(np.isneginf(masked)) or np.all(masked <= -1e6)):
        case.fail("it ignores the fill argument (the check passed fill=-1e4, as for float16): write fill at "
                  "the masked positions")
    finite = np.unique(masked)
    if fill is None and len(finite) == 1 and DEFAULT_FILL < finite[0] <= -100.0:
        case.fail(f"the masked positions hold {finite[0]:g}, a finite fill that real scores can go below (GPT-2's "
                  "masked_bias is -1e4; the check's scores go lower): the softmax would then give the masked keys "
                  "the weight. Without a fill argument, " + FILL_FIX)
    case.fail("the masked positions should hold " + ("a large negative number (the fill, -1e9 by default) "
                                                     "or -inf" if fill is None else "the given fill"))


_INVERTED_FILL = f"{INVERTED}: fill where the mask is False"
_EMPTY_ROWS = ("it leaves the rows with no True entry unchanged; apply_mask writes fill at every False position, "
               "those rows included (what a softmax does with them is masked_softmax's business)")
_ZERO_FILL = ("it fills the masked positions with 0; a score of 0 still gets weight e^0 = 1 in the softmax: "
              "use a large negative number (fill) or -inf")
_UNCHANGED = "it leaves the masked positions unchanged; set them to fill where the mask is False"
_BROADCASTS = ("The mask broadcasts against the scores (it can have fewer or length-1 axes): "
               "np.where(mask, scores, fill) handles that")


def _bool_index(scores, mask, fill=-1e9):
    out = scores.copy()
    out[~mask] = fill  # fails when the mask only broadcasts
    return out


def _skips_empty_rows(scores, mask, fill=-1e9):
    # "a row with nothing to attend to would give NaN": keep its scores, fill the others
    empty = ~np.broadcast_to(mask, scores.shape).any(axis=-1, keepdims=True)
    return np.where(mask | empty, scores, fill)


def _times_neg_inf(scores, mask, fill=-1e9):
    return scores + (~mask) * -np.inf  # 0 * -inf = nan at the kept positions


APPLY_MASK = Spec(
    id="masking-apply_mask",
    function="apply_mask",
    inputs=_apply_mask_inputs,
    reference=ref.apply_mask,
    rules=(Rule("a mask that broadcasts: fewer or length-1 axes",
                lambda call: call.args[1].ndim < call.args[0].ndim or 1 in call.args[1].shape),
           Rule("a fill given", lambda call: "fill" in call.kwargs),
           Rule("rows fully masked: fill everywhere", lambda call: bool(np.any(
               ~np.broadcast_to(call.args[1], call.args[0].shape).any(axis=-1)))),
           Rule("scores far below -1e4, and no fill given: the default fill must lie below them",
                lambda call: "fill" not in call.kwargs and call.args[0].min() < -1e8)),
    judge=_judge_apply_mask,
    # Judged by properties of the answer (any large negative fill is right), which name
    # these mistakes with the diagnoses listed here.
    mistakes=(
        Mistake("zero_fill", _ZERO_FILL, lambda scores, mask, fill=-1e9: np.where(mask, scores, 0.0)),
        Mistake("inverted", _INVERTED_FILL, lambda scores, mask, fill=-1e9: np.where(mask, fill, scores)),
        Mistake("unchanged", _UNCHANGED, lambda scores, mask, fill=-1e9: scores),
    ),
    diagnosed=(
        Mistake("times_neg_inf", "0 * -inf is nan", _times_neg_inf),
        Mistake("softmax_too", "the scores where the mask is True must pass through unchanged",
                lambda scores, mask, fill=-1e9: stable_softmax(np.where(mask, scores, fill))),
        Mistake("ignores_fill", "it ignores the fill argument",
                lambda scores, mask, fill=-1e9: np.where(mask, scores, -np.inf)),
        Mistake("small_fill", "the masked positions should hold a large negative number",
                lambda scores, mask, fill=-1e9: np.where(mask, scores, -10.0)),
        Mistake("skips_empty_rows", _EMPTY_ROWS, _skips_empty_rows),
        Mistake("masked_bias", "the masked positions hold -10000, a finite fill that real scores can go below",
                lambda scores, mask, fill=-1e4: np.where(mask, scores, fill)),
        Mistake("first_batch", "expected the shape of the scores",
                lambda scores, mask, fill=-1e9: np.where(mask, scores, fill)[0]),
    ),
    errors=(
        Raises("{what} raised {error}. " + _BROADCASTS + ", boolean indexing scores[~mask] does not",
               example=_bool_index),
    ),
)


def _masked_softmax_inputs(rng: np.random.Generator) -> list[Call]:
    return [Call((scores, mask), what=f"masked_softmax(scores, mask) for scores {scores.shape} and {label}")
            for scores, mask, label in _scores_and_masks(rng)]


def _masked_keys_get_weight(w: np.ndarray, call: Call) -> bool:
    keep = np.broadcast_to(call.args[1], call.args[0].shape)
    return bool(np.all(np.isfinite(w))) and w.shape == keep.shape and bool(np.any(np.abs(w[~keep]) > 1e-6))


MASKED_SOFTMAX = Spec(
    id="masking-masked_softmax",
    function="masked_softmax",
    depends=("masking-apply_mask",),  # its solution calls them
    inputs=_masked_softmax_inputs,
    reference=ref.masked_softmax,
    rules=(Rule("a mask that broadcasts: fewer or length-1 axes",
                lambda call: call.args[1].ndim < call.args[0].ndim or 1 in call.args[1].shape),
           Rule("batch, heads, q_len and k_len distinct", lambda call: len(set(call.args[0].shape)) == 4),
           Rule("rows whose scores all lie far below 0 (a finite fill above them is not enough)",
                lambda call: call.args[0].min() < -1e8)),
    equivalent=(("L3 stable_softmax(np.where(mask, scores, -np.inf), axis=-1) -> "
                 "stable_softmax(np.where(mask, scores, -np.inf))", "stable_softmax's axis defaults to -1, the axis the reference passes"),),
    mistakes=(
        Mistake("mask_after", "it masks after the softmax: the masked weights are 0 but each row no longer sums "
                "to 1; fill the masked scores with a large negative number before the softmax",
                lambda scores, mask: stable_softmax(scores) * mask),
        Mistake("zero_fill", "it sets the masked scores to 0 before the softmax; a score of 0 still gets weight "
                "e^0 = 1: fill with a large negative number or -inf",
                lambda scores, mask: stable_softmax(np.where(mask, scores, 0.0))),
        Mistake("inverted", INVERTED + ": keep the scores where the mask is True",
                lambda scores, mask: stable_softmax(np.where(mask, -np.inf, scores))),
        Mistake("query_axis", "each column sums to 1 instead of each row: take the softmax over the key axis "
                "(axis=-1)", lambda scores, mask: stable_softmax(np.where(mask, scores, -1e9), axis=-2)),
        Mistake("ignores_mask", "it ignores the mask: masked keys still get weight",
                lambda scores, mask: stable_softmax(scores)),
    ),
    errors=(
        keepdims_rule("masked_softmax", lambda scores, mask: no_keepdims_sum(np.where(mask, scores, -np.inf))),
        Raises("masked_softmax raised {error}. " + _BROADCASTS,
               example=lambda scores, mask: stable_softmax(_bool_index(scores, mask))),
    ),
    hints=finite_fill_hints(lambda call: (call.args[0], np.broadcast_to(call.args[1], call.args[0].shape)),
                            lambda fill: lambda scores, mask: stable_softmax(np.where(mask, scores, fill)))
    + softmax_axis_hints(lambda softmax: lambda scores, mask: softmax(np.where(mask, scores, -np.inf))) + (
        # (every row of these questions masks a key: -inf times a 0 of the mask gives the same NaN)
        Hint("NaN in every row that masks a key: the masked scores are +inf (np.inf rather than -np.inf: the "
             "softmax's maximum is then inf, and exp(inf - inf) is NaN), or -inf multiplied by the mask's 0 "
             "(0 * -inf is NaN). Fill them with np.where(mask, scores, -np.inf)", _nan_where_masked,
             example=lambda scores, mask: stable_softmax(np.where(mask, scores, np.inf))),
        Hint("masked keys (mask False) get weight; their weight must be 0", _masked_keys_get_weight,
             example=lambda scores, mask: stable_softmax(np.where(mask, scores, -3.0))),
        Hint("each query's weights over the keys must sum to 1",
             lambda w, call: bool(np.all(np.isfinite(w))) and not np.allclose(w.sum(axis=-1), 1.0, atol=1e-4),
             example=lambda scores, mask: ref.masked_softmax(scores, mask) * 0.9),
    ),
)

SPECS = (PADDING_MASK_FROM_LENGTHS, PADDING_MASK_FROM_IDS, CAUSAL_MASK, COMBINE_MASKS, APPLY_MASK, MASKED_SOFTMAX)
