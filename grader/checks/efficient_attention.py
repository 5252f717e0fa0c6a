"""Hidden checks of notebook 14, efficient_attention: the online softmax, tiled (FlashAttention-style)
attention, grouped-query attention, the KV cache's size and the sliding-window mask.

Sizes are pairwise distinct within a question (batch 2, heads 3, q_len 7, k_len 11, d_k 4,
d_v 5, tiles of 3 by 4), so that a swapped axis raises or shows, and the tiles need not divide
the lengths, so that the last, shorter block is asked for. The scores grow along the keys, so
that the running maximum changes from block to block and a missing rescaling shows. The causal
questions use tiles of other heights than widths, so that the diagonal crosses tiles away from
their corners; one makes the value of a key infinite that only tiles wholly above the diagonal
hold for the queries before it, so that a tile computed and masked instead of skipped shows
(0 x inf is NaN). Every correct answer is then infinite for the queries that attend to that
key, and finite before it: infinities compare equal, NaN never does. Grouped-query attention
is asked with group sizes above 1 and kv_heads above 1, where .repeat and .repeat_interleave
pair the heads differently, and with masks that no inversion turns into a fully masked row.
The attention functions are PyTorch (driver ``tensors``); the softmax and the mask may be
numpy or PyTorch.

Beyond the rising scores: one question's scores fall along the keys (a later block's maximum
below the running one, where a tile's own maximum taken for the running one shows); one puts
rows (or queries) at levels 1600 apart, with finite fills of -1e9 and a score 2000 above its row,
where any maximum but each row's own overflows or underflows; one attention question has no
batch axis (the leading axes are any); block sizes of 0 and below raise ValueError.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Callable

import numpy as np
import torch

from ._core import Call, Case, CheckFailed, Hint, Knob, Mistake, Raises, Rule, Spec, judge_case, to_array
from .masking import _mask_values
from .reference import efficient_attention as ref
from .reference.multi_head import scaled_dot_product_attention
from .reference.softmax import stable_softmax
from .softmax import LARGE_ATOL, LARGE_RTOL

TOO_LARGE = 100.0  # scores beyond this are the questions about overflow and underflow


def _finite(got: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(got)))


def _loosely_when(large: bool, case: Case) -> Case:
    """The case with float32-sized tolerances when its scores are around +-1000 (float32's
    spacing there is 6e-5, and a float32 answer is that far from the float64 reference)."""
    return Case(dataclasses.replace(case.spec, rtol=LARGE_RTOL, atol=LARGE_ATOL), case.call, case.answer,
                case.expected, case._mistaken, case.others) if large else case


# ---------------------------------------------------------------------------- online_softmax
def _rising(n: int, top: float) -> np.ndarray:
    """Added to a row: later scores higher, so that the running maximum keeps growing."""
    return np.linspace(0.0, top, n)


def _online_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(x: np.ndarray, block_size: int, note: str = "") -> None:
        calls.append(Call((x, block_size), what=f"online_softmax(x, block_size={block_size}) for x of shape "
                                                 f"{x.shape}{note}"))

    # 1. blocks of 4, 4 and 3 over rows that rise; 2. no trend, blocks of 2 (the last of 1)
    ask(rng.normal(scale=2.0, size=(2, 3, 11)) + _rising(11, 8.0), 4, ", scores growing along each row")
    ask(rng.normal(scale=3.0, size=(4, 9)), 2)
    # 3. around +1000 (exp overflows unless the maximum is subtracted), before 4. around -1000,
    # where a running maximum that starts at 0 underflows every exp to 0 and divides 0 by 0:
    # in this order, each of the two mistakes fails its own question first
    ask(1000.0 + rng.normal(scale=3.0, size=(3, 10)) + _rising(10, 6.0), 3, ", scores around 1000")
    ask(-1000.0 + rng.normal(scale=3.0, size=(3, 10)) + _rising(10, 6.0), 4, ", scores around -1000")
    # 5. one entry at a time (Milakov & Gimelshein's Algorithm 3); 6. one block longer than the row
    ask(rng.normal(scale=2.0, size=(5, 7)) + _rising(7, 4.0), 1)
    ask(rng.normal(scale=2.0, size=(2, 6)), 8, ", one block longer than the row")
    # 7. masked scores after the first block of every row
    x = rng.normal(scale=2.0, size=(4, 9)) + _rising(9, 4.0)
    for row, cols in enumerate([[3], [4, 7], [8], [5, 6]]):
        x[row, cols] = -np.inf
    ask(x, 3, " with -inf entries after the first block")
    # 8. rows at levels 1600 apart, with masked scores filled with -1e9 (a finite fill) after the
    # first block, and one score 2000 above the rest of its row: only each row's own maximum keeps
    # every exp(x - m) from underflowing or overflowing
    x = rng.normal(scale=2.0, size=(3, 9)) + _rising(9, 4.0) + rng.permutation([-800.0, 0.0, 800.0])[:, None]
    x[[0, 1, 2], rng.integers(4, 9, size=3)] = -1e9
    x[rng.integers(3), rng.integers(4)] += 2000.0
    ask(x, 4, ", rows around -800, 0 and 800, some scores -1e9, one 2000 above its row")
    # 9-10. block sizes below 1 (0, the boundary, and a negative one) raise ValueError, as the docstring says
    for block_size in (0, -2):
        calls.append(Call((rng.normal(size=(2, 5)), block_size), raises="ValueError",
                          what=f"online_softmax(x, block_size={block_size}) for x of shape (2, 5)"))
    return calls


def _scores_beyond(call: Call, sign: float) -> bool:
    """The finite scores of the call lie beyond +TOO_LARGE (sign 1) or below -TOO_LARGE (sign -1)."""
    x = call.args[0]
    return bool(np.all(sign * x[np.isfinite(x)] > TOO_LARGE))


def _far_apart(x: np.ndarray) -> bool:
    """Scores beyond exp's range of one another (1000 apart) across rows and within a row's finite
    scores, and finite fills of -1e9: a maximum that is not each row's own overflows or underflows."""
    unfilled = np.where(x > -1e8, x, np.nan)
    return bool(np.ptp(x.max(axis=-1)) > 1000 and np.any(np.nanmax(unfilled, axis=-1) - np.nanmedian(unfilled, axis=-1)
                                                         > 1000) and np.any(x == -1e9))


def _judge_online(case: Case) -> None:
    """The default judgement, with float32-sized tolerances where scores reach beyond +-TOO_LARGE
    (around +-1000, or rows at such levels: float32's spacing there is 6e-5)."""
    x = case.call.args[0]
    judge_case(_loosely_when(not case.call.raises and bool(np.any(np.abs(x[np.isfinite(x)]) > TOO_LARGE)), case))


def _blocks_checked(attention):
    """``attention`` (an online softmax or a tiled attention, block sizes after the first argument or
    three) raising ValueError for a block size below 1, as the docstring asks: the catalogued
    mistakes are wrong in one way only."""
    @functools.wraps(attention)
    def checked(*args, **kwargs):
        if any(type(a) is int and a < 1 for a in args[1:]):  # (not causal, a bool)
            raise ValueError("block sizes must be at least 1")
        return attention(*args, **kwargs)
    return checked


# A block size below 1 that raised something else (torch.split's RuntimeError, an IndexError ...)
RAISE_VALUE_ERROR = ("{{what}} raised {{error}}; it should raise ValueError, as the docstring says: check that "
                     "{sizes} >= 1 before the loop, and raise ValueError yourself")


def _asserting(attention):
    """``attention`` with its block sizes checked by an assert: an AssertionError, not the ValueError asked."""
    @functools.wraps(attention)
    def asserted(*args, **kwargs):
        assert all(a >= 1 for a in args[1:] if type(a) is int), "block sizes must be positive"
        return attention(*args, **kwargs)
    return asserted


def _online_variant(update: str = "rescaled", divide: bool = True, start: float | str = -np.inf, shift: bool = True,
                    factor: str = "m_old - m_new", keepdims: bool = True):
    """A learner's online softmax, with its choices: how the running sum is updated, the final
    division, where the running maximum starts (a number, or "first": the first block's maximum
    and sum), whether it is subtracted, the rescaling factor's sign, keepdims."""
    @_blocks_checked
    def online_softmax(x, block_size):
        keep = x.shape[:-1] + ((1,) if keepdims else ())
        m, total, begin = np.full(keep, -np.inf if start == "first" else start), np.zeros(keep), 0
        if start == "first":  # (so that the inverted factor exp(m_new - m_old) is finite: no exp(inf))
            m = x[..., :block_size].max(axis=-1, keepdims=keepdims)
            total, begin = np.exp(x[..., :block_size] - m).sum(axis=-1, keepdims=keepdims), block_size
        for first in range(begin, x.shape[-1], block_size):
            block = x[..., first:first + block_size]
            m_new = np.maximum(m, block.max(axis=-1, keepdims=keepdims))
            terms = np.exp(block - m_new if shift else block).sum(axis=-1, keepdims=keepdims)
            rescale = np.exp(m - m_new) if factor == "m_old - m_new" else np.exp(m_new - m)
            total = {"rescaled": total * (rescale if shift else 1.0) + terms, "not_rescaled": total + terms,
                     "overwritten": terms}[update]
            m = m_new
        e = np.exp(x - m if shift else x)
        return e / total if divide else e
    return online_softmax


# The rescaling factor inverted: the online softmax's and tiled attention's one slip of sign.
INVERTED_FACTOR = ("the rescaling factor is inverted: when the running maximum grows from m_old to m_new, what was "
                   "summed from m_old is multiplied by exp(m_old - m_new), at most 1 (it moves every term down to "
                   "the new maximum), not by exp(m_new - m_old)")


@_blocks_checked
def _per_block(x, block_size):
    return np.concatenate([stable_softmax(x[..., i:i + block_size]) for i in range(0, x.shape[-1], block_size)],
                          axis=-1)


def _running_maximum(scores: np.ndarray, block: int, change: int) -> bool:
    """Some row's maximum over a later block of ``block`` columns lies above (``change`` 1) or
    below (-1) the running maximum of the blocks before it: the rescaling, or a block's own
    maximum mistaken for the running one, shows there."""
    with np.errstate(invalid="ignore"):
        running = np.maximum.accumulate(np.stack([scores[..., i:i + block].max(axis=-1)
                                                  for i in range(0, scores.shape[-1], block)], axis=-1), axis=-1)
        later = np.stack([scores[..., i:i + block].max(axis=-1) for i in range(block, scores.shape[-1], block)],
                         axis=-1) if scores.shape[-1] > block else np.zeros(scores.shape[:-1] + (0,))
    return bool(np.any(change * (later - running[..., :-1]) > 0))


def _online_rules(scores: Callable[[Call], np.ndarray | None], block: Callable[[Call], int]) -> tuple[Rule, ...]:
    """The rules of a running maximum and sum, for the scores ``scores(call)`` (None: not a call
    that reads them) taken ``block(call)`` at a time."""
    def rule(name: str, holds: Callable[[np.ndarray, int], bool]) -> Rule:
        return Rule(name, lambda call: scores(call) is not None and holds(scores(call), block(call)))
    return (
        rule("the last block is shorter: the block size does not divide the length", lambda x, b: x.shape[-1] % b > 0),
        rule("a later block's maximum above the running maximum (the rescaling)",
             lambda x, b: _running_maximum(x, b, 1)),
        rule("a later block's maximum below the running maximum", lambda x, b: _running_maximum(x, b, -1)),
    )


ONLINE_SOFTMAX = Spec(
    id="efficient_attention-online_softmax",
    function="online_softmax",
    inputs=_online_inputs,
    reference=ref.online_softmax,
    judge=_judge_online,
    by_call=True,
    variant=_online_variant,
    knobs=(
        Knob("update", (("not_rescaled", "the running sum is not rescaled when the running maximum grows: multiply "
                         "it by exp(m_old - m_new) before adding the new block's sum of exp(x - m_new), so that "
                         "every term is measured from the same maximum"),
                        ("overwritten", "the running sum is replaced by each block's own sum instead of carried "
                         "on: l_new = l * exp(m_old - m_new) + (the block's sum of exp(x - m_new))"))),
        Knob("divide", ((False, "the final division is missing: the weights are exp(x - m) / l, with m and l the "
                         "running maximum and sum after the last block"),)),
    ),
    rules=_online_rules(lambda call: None if call.raises else call.args[0], lambda call: call.args[1]) + (
        Rule("scores around 1000", lambda call: not call.raises and _scores_beyond(call, 1)),
        Rule("scores around -1000", lambda call: not call.raises and _scores_beyond(call, -1)),
        Rule("masked scores (-inf) after the first block", lambda call: bool(np.isneginf(call.args[0]).any())),
        Rule("rows far apart (beyond exp's range), finite fills of -1e9, a score far above its row: each row's "
             "own maximum", lambda call: not call.raises and _far_apart(call.args[0])),
        Rule("one block longer than the row", lambda call: not call.raises and call.args[1] > call.args[0].shape[-1]),
        Rule("block_size = 0 raises ValueError", lambda call: call.raises == "ValueError" and call.args[1] == 0),
        Rule("block_size < 0 raises ValueError", lambda call: call.raises == "ValueError" and call.args[1] < 0),
    ),
    equivalent=(
        ("L8 1 -> 0", "block_size < 0 instead of < 1: at block_size = 0 range(0, n, 0) raises ValueError itself"),
        ("L10 x.shape[:-1] + (1,) -> (1,)", "a running maximum of shape (1,) broadcasts: after the first block, "
         "np.maximum(m, block max) has every row's own (..., 1)"),
        ("L10 -1 -> 0", "x.shape[:0] + (1,) is (1,): the running maximum broadcasts to every row at the first block"),
        ("L11 x.shape[:-1] + (1,) -> (1,)", "a running sum of shape (1,) broadcasts: l * exp(m - m_new) + (row "
         "sums) has every row's own (..., 1) after the first block"),
        ("L11 -1 -> 0", "x.shape[:0] + (1,) is (1,): the running sum broadcasts to every row at the first block"),
    ),
    mistakes=(
        Mistake("per_block", "each block is normalized by its own sum (a softmax per block); the weights of a whole "
                "row must sum to 1: carry one running maximum and one running sum along the row and divide once, "
                "after the last block", _per_block),

        # (started from -inf, the inverted factor is exp(+inf) at the first block: NaN, which the hint names)
        Mistake("inverted_factor", INVERTED_FACTOR, _online_variant(start="first", factor="m_new - m_old")),
    ),
    errors=(
        Raises(RAISE_VALUE_ERROR.format(sizes="block_size"), example=_asserting(ref.online_softmax), match=".",
               when=lambda call: bool(call.raises)),
        Raises("{what} raised {error}. Keep the reduced axis (keepdims=True): the running maximum and sum, of "
               "shape (..., 1), must broadcast against a block (..., block_size)",
               example=_online_variant(keepdims=False), match="broadcast|must match the size"),
    ),
    hints=(
        Hint("NaN or infinity at scores around 1000: exp overflows. Subtract the running maximum before "
             "exponentiating, exp(x - m_new), in the running sum and in the final weights",
             lambda got, call: _scores_beyond(call, 1) and not _finite(got), example=_online_variant(shift=False)),
        Hint("NaN or infinity at scores around -1000: every exp(x - m) underflowed to 0, and 0 / 0 followed. The "
             "running maximum must start at -inf (or at the first block's maximum), not at 0: with m = 0, "
             "exp(-1000 - 0) is 0",
             lambda got, call: _scores_beyond(call, -1) and not _finite(got), example=_online_variant(start=0.0)),
        Hint(f"NaN or infinity at moderate scores: {INVERTED_FACTOR}; with m_old = -inf before the first block, "
             "exp(m_new - m_old) is infinite there",
             lambda got, call: not _finite(got) and not np.isneginf(call.args[0]).any()
             and not _scores_beyond(call, 1) and not _scores_beyond(call, -1),
             example=_online_variant(factor="m_new - m_old")),
        Hint("the weights of a row should be positive and sum to 1: exp(x - m) / l along the last axis",
             lambda got, call: _finite(got) and not np.allclose(got.sum(axis=-1), 1.0, atol=1e-4),
             example=lambda x, block_size: ref.online_softmax(x, block_size) * 0.9),
    ),
)


# ---------------------------------------------------------------------------- tiled_attention
POISONED_KEY = 12  # a multiple of both tile sizes (3 and 4) of the question whose value holds an inf


def _qkv(rng: np.random.Generator, batch: int, heads: int, q_len: int, k_len: int, d_k: int,
         d_v: int, rise: float = 2.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries that all lean on feature 0, and keys that rise along it (fall, for ``rise`` < 0):
    the scores grow with the key's position, so that the running maximum changes from key block
    to key block (or they fall, so that a later block's maximum is below the running one)."""
    query = rng.normal(size=(batch, heads, q_len, d_k))
    key = rng.normal(size=(batch, heads, k_len, d_k))
    query[..., 0] = 2.0
    key[..., 0] += np.linspace(-rise, rise, k_len)
    return query, key, rng.normal(size=(batch, heads, k_len, d_v))


def _shapes(query: np.ndarray, key: np.ndarray, value: np.ndarray) -> str:
    return f"query {query.shape}, key {key.shape}, value {value.shape}"


def _tiled_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(q_block: int, k_block: int, causal: bool, sizes: tuple, note: str = "", arrays=None) -> None:
        query, key, value = arrays or _qkv(rng, *sizes)
        kwargs = {"causal": True} if causal else {}
        flag = ", causal=True" if causal else ""
        calls.append(Call((query, key, value, q_block, k_block), kwargs,
                          what=f"tiled_attention(query, key, value, {q_block}, {k_block}{flag}) for "
                               f"{_shapes(query, key, value)}{note}"))

    ask(3, 4, False, (2, 3, 7, 11, 4, 5))             # 1. blocks of 3 queries and 4 keys; the last ones shorter
    ask(4, 3, True, (2, 3, 10, 10, 4, 5))             # 2. causal: the diagonal crosses tiles off their corners
    ask(4, 4, True, (2, 3, 12, 12, 5, 7))             # 3. causal, square tiles on the diagonal
    ask(16, 16, False, (2, 3, 6, 8, 4, 5), ", one tile holding everything")
    ask(1, 1, True, (1, 2, 6, 6, 3, 4), ", tiles of one query and one key")
    # 6. scores around 1000: exp overflows unless the running maximum is subtracted
    query, key, value = _qkv(rng, 2, 3, 5, 9, 4, 6)
    query *= 1000.0 / np.max(np.abs(query @ np.swapaxes(key, -1, -2) / 2.0))
    ask(3, 4, False, (), ", scores around 1000", (query, key, value))
    # 7. scores falling along the keys: a later key block's row maximum is below the running maximum
    ask(4, 3, False, (2, 3, 5, 10, 4, 3, -2.0), ", scores falling along the keys")
    # 8. no batch axis, (heads, length, features): the leading axes are any; and each query's
    # scores lifted by its own level (-800, 0 or 800, through a feature that every key holds as 1),
    # so that only each query's own running maximum keeps exp from underflowing
    query, key, value = (t[0] for t in _qkv(rng, 1, 4, 6, 8, 3, 2))
    key[..., -1] = 1.0
    query[..., -1] = rng.choice([-800.0, 0.0, 800.0], size=query.shape[:-1])
    query[0, :3, -1] = [-800.0, 0.0, 800.0]  # (every level in every seed)
    query[..., -1] *= math.sqrt(query.shape[-1])  # (the scores are divided by sqrt(d_k))
    ask(4, 3, False, (), ", no batch axis, each query's scores around its own level: -800, 0 or 800",
        (query, key, value))
    # 9. the value of key 12 made infinite. The tiles of queries 0-11 with it (queries in
    # blocks of 3, keys in blocks of 4: key block 12-13) lie wholly above the diagonal: queries
    # before 12 must not see it, and the queries from 12 on attend to it (an infinite output)
    query, key, value = _qkv(rng, 2, 3, 14, 14, 4, 5)
    value[..., POISONED_KEY, :] = np.inf
    ask(3, 4, True, (), f", the value of key {POISONED_KEY} made infinite", (query, key, value))
    # 10-11. block sizes below 1 raise ValueError, as the docstring says (0 is the boundary):
    # after the values, so that a learner who also has a value wrong hears of that first
    query, key, value = _qkv(rng, 1, 2, 4, 4, 3, 3)
    for q_block, k_block in [(0, 2), (2, -1)]:
        calls.append(Call((query, key, value, q_block, k_block), raises="ValueError",
                          what=f"tiled_attention(query, key, value, {q_block}, {k_block}) for "
                               f"{_shapes(query, key, value)}"))
    return calls


def _poisoned(call: Call) -> bool:
    return len(call.args) == 5 and bool(np.isinf(call.args[2]).any())


def _scores(call: Call) -> np.ndarray:
    """Q K^T / sqrt(d_k) of an attention call."""
    query, key = call.args[:2]
    return query @ np.swapaxes(key, -1, -2) / math.sqrt(query.shape[-1])


def _large_scores(call: Call) -> bool:
    return bool(np.max(np.abs(_scores(call))) > TOO_LARGE)


def _judge_tiled(case: Case) -> None:
    """The default judgement, except on the question with an infinite value: there the queries
    before the poisoned key must be finite (the tiles above the diagonal skipped) and right; the
    queries from it on are infinite in every correct answer."""
    if not _poisoned(case.call):
        judge_case(_loosely_when(_large_scores(case.call), case))
        return
    got = to_array(case.answer, case.what)
    expected = np.asarray(case.expected, dtype=np.float64)
    if got.shape != expected.shape:
        raise CheckFailed(f"{case.what} has shape {got.shape}; expected {expected.shape}")
    before, want = got[..., :POISONED_KEY, :], expected[..., :POISONED_KEY, :]
    if not _finite(before):
        case.fail(SKIP_TILES)
    if not np.allclose(before, want, rtol=case.spec.rtol, atol=case.spec.atol):
        case.fail(f"the outputs of the queries before key {POISONED_KEY} are wrong")


SKIP_TILES = (f"the value of key {POISONED_KEY} was made infinite, and NaN (0 x inf) reached queries before "
              f"{POISONED_KEY}, which may not attend to it: the tiles that lie wholly above the diagonal are computed "
              "(and masked) instead of skipped. "
              "Skip them: compute no scores and read no values there, which is the half of the work a causal "
              "mask saves")


def _tiled_variant(rescale_sum: bool = True, rescale_acc: bool = True, divide: bool = True,
                   causal_mask: str = "entrywise", scale: str = "sqrt_d_k", skip: str = "above",
                   diagonal: str = ">=", shift: bool = True, tile_max: str = "running", normalise: str = "end"):
    """A learner's tiled attention with its choices: which running quantities are rescaled, the
    final division, how the causal mask is applied, the scale, which tiles are skipped, the
    comparison of positions inside a tile, whether the running maximum is subtracted, and two
    slips of a transcription of FlashAttention's Algorithm 1: ``tile_max`` "unrescaled" (the
    tile's P~ = exp(S - m~), from its own row maximum, added without e^(m~ - m_new)) or
    "stored" (m <- m~ instead of m_new); ``normalise`` "twice" (O kept normalised after every
    tile and divided by l again at the end) or "l_times_acc" (Algorithm 1's diag(l) applied to
    an accumulator never divided by l)."""
    @_blocks_checked
    def tiled_attention(query, key, value, q_block, k_block, causal=False):
        divisor = {"sqrt_d_k": math.sqrt(query.shape[-1]), "none": 1.0, "d_k": query.shape[-1],
                   "times_sqrt_d_k": 1.0 / math.sqrt(query.shape[-1])}[scale]
        output = query.new_empty(query.shape[:-1] + value.shape[-1:])
        for qs in range(0, query.shape[-2], q_block):
            q = query[..., qs:qs + q_block, :] / divisor
            rows = q.shape[-2]
            m = q.new_full(q.shape[:-1] + (1,), float("-inf"))
            total = q.new_zeros(q.shape[:-1] + (1,))
            acc = q.new_zeros(q.shape[:-1] + value.shape[-1:])
            for ks in range(0, key.shape[-2], k_block):
                cols = min(k_block, key.shape[-2] - ks)
                if causal and causal_mask != "ignored":
                    if skip == "above" and ks > qs + rows - 1 or skip == "one_early" and ks >= qs + rows - 1:
                        break
                    if skip == "not_below" and ks + cols - 1 > qs:
                        break  # keeps only the tiles wholly below the diagonal
                s = q @ key[..., ks:ks + cols, :].transpose(-2, -1)
                if causal and causal_mask in ("entrywise", "local"):
                    offset = (0, 0) if causal_mask == "local" else (qs, ks)
                    rows_at = torch.arange(offset[0], offset[0] + rows)[:, None]
                    cols_at = torch.arange(offset[1], offset[1] + cols)[None, :]
                    s = s.masked_fill(~(rows_at >= cols_at if diagonal == ">=" else rows_at > cols_at), float("-inf"))
                m_tile = s.amax(dim=-1, keepdim=True)
                m_new = torch.maximum(m, m_tile) if shift else torch.zeros_like(m)
                measured = m_tile.nan_to_num(neginf=0.0) if tile_max == "unrescaled" else m_new
                factor, p = torch.exp(m - m_new) if shift else 1.0, torch.exp(s - measured)
                l_old = total if normalise == "l_times_acc" else 1.0
                total = (total * factor if rescale_sum else total) + p.sum(dim=-1, keepdim=True)
                acc = (acc * factor * l_old if rescale_acc else acc) + p @ value[..., ks:ks + cols, :]
                m = m_tile if tile_max == "stored" else m_new
            # ("twice": O normalised after every tile, then divided at the end as well)
            output[..., qs:qs + rows, :] = (acc / total / total if normalise == "twice"
                                            else acc / total if divide else acc)
        return output
    return tiled_attention


def _masks_everything(query, key, value, q_block, k_block, causal=False):
    """Correct values, but every tile computed, the causal mask applied to all of them: no skipping."""
    return _tiled_variant(skip="none")(query, key, value, q_block, k_block, causal)


@_blocks_checked
def _softmax_per_tile(query, key, value, q_block, k_block, causal=False):
    """Each key block's softmax on its own, the blocks' outputs added."""
    out = torch.zeros(query.shape[:-1] + value.shape[-1:], dtype=query.dtype)
    for ks in range(0, key.shape[-2], k_block):
        out += scaled_dot_product_attention(query, key[..., ks:ks + k_block, :], value[..., ks:ks + k_block, :])[0]
    return out


@_blocks_checked
def _overwrites(query, key, value, q_block, k_block, causal=False):
    """The accumulator and the sum replaced by each key block's instead of carried on."""
    output = query.new_empty(query.shape[:-1] + value.shape[-1:])
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :] / math.sqrt(query.shape[-1])
        for ks in range(0, key.shape[-2], k_block):
            s = q @ key[..., ks:ks + k_block, :].transpose(-2, -1)
            p = torch.exp(s - s.amax(dim=-1, keepdim=True))
            acc, total = p @ value[..., ks:ks + k_block, :], p.sum(dim=-1, keepdim=True)
        output[..., qs:qs + q_block, :] = acc / total
    return output


@_blocks_checked
def _full_block_mask(query, key, value, q_block, k_block, causal=False):
    """The tile's mask built from q_block and k_block, not from the tile's own (shorter) size."""
    output = query.new_empty(query.shape[:-1] + value.shape[-1:])
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :] / math.sqrt(query.shape[-1])
        m = q.new_full(q.shape[:-1] + (1,), float("-inf"))
        total = q.new_zeros(q.shape[:-1] + (1,))
        acc = q.new_zeros(q.shape[:-1] + value.shape[-1:])
        for ks in range(0, key.shape[-2], k_block):
            s = q @ key[..., ks:ks + k_block, :].transpose(-2, -1)
            if causal:
                s = s.masked_fill(torch.arange(qs, qs + q_block)[:, None] < torch.arange(ks, ks + k_block), float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            total = total * torch.exp(m - m_new) + torch.exp(s - m_new).sum(dim=-1, keepdim=True)
            acc = acc * torch.exp(m - m_new) + torch.exp(s - m_new) @ value[..., ks:ks + k_block, :]
            m = m_new
        output[..., qs:qs + q_block, :] = acc / total
    return output


def _tiled_inverted_factor(query, key, value, q_block, k_block, causal=False):
    """The rescaling factor exp(m_new - m_old): infinite at the first key block (m_old = -inf)."""
    output = query.new_empty(query.shape[:-1] + value.shape[-1:])
    for qs in range(0, query.shape[-2], q_block):
        q = query[..., qs:qs + q_block, :] / math.sqrt(query.shape[-1])
        m = q.new_full(q.shape[:-1] + (1,), float("-inf"))
        total, acc = q.new_zeros(q.shape[:-1] + (1,)), q.new_zeros(q.shape[:-1] + value.shape[-1:])
        for ks in range(0, key.shape[-2], k_block):
            s = q @ key[..., ks:ks + k_block, :].transpose(-2, -1)
            m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
            p = torch.exp(s - m_new)
            total = total * torch.exp(m_new - m) + p.sum(dim=-1, keepdim=True)
            acc = acc * torch.exp(m_new - m) + p @ value[..., ks:ks + k_block, :]
            m = m_new
        output[..., qs:qs + q_block, :] = acc / total
    return output


def _numpy_inside(query, key, value, q_block, k_block, causal=False):
    return ref.tiled_attention(query, key, value, q_block, k_block, causal).numpy()


def _nan_rows(got: np.ndarray) -> np.ndarray:
    """The query positions whose output holds a NaN or an infinity (over every leading axis)."""
    return np.flatnonzero(~np.isfinite(got).reshape(-1, got.shape[-2], got.shape[-1]).all(axis=(0, 2)))


def _causal(call: Call) -> bool:
    return bool(call.kwargs.get("causal"))


def _first_query_only(got: np.ndarray, call: Call) -> bool:
    return _causal(call) and _nan_rows(got).tolist() == [0]


def _whole_query_blocks(got: np.ndarray, call: Call) -> bool:
    q_block = call.args[3]
    return _causal(call) and set(range(min(q_block, got.shape[-2]))) <= set(_nan_rows(got).tolist())


TILED_ATTENTION = Spec(
    id="efficient_attention-tiled_attention",
    function="tiled_attention",
    inputs=_tiled_inputs,
    reference=ref.tiled_attention,
    driver="tensors",
    judge=_judge_tiled,
    by_call=True,
    variant=_tiled_variant,
    knobs=(
        Knob("rescale_sum", ((False, "the running sum is not rescaled when the running maximum grows: multiply it "
                              "by exp(m_old - m_new) before adding the new tile's row sums"),)),
        Knob("rescale_acc", ((False, "the output accumulator is not rescaled when the running maximum grows: "
                              "multiply it by exp(m_old - m_new), the same factor as the running sum, before "
                              "adding the new tile's P V (FlashAttention's Algorithm 1, line 12: the factor "
                              "e^(m_i - m_i_new) on O_i)"),)),
        Knob("tile_max", (
            ("unrescaled", "each tile's P~ = exp(S - m~) is measured from the tile's own row maximum m~ and added "
                           "as it is: Algorithm 1 (lines 11-12) multiplies the tile's row sums l~ and its P~ V by "
                           "e^(m~ - m_new) before adding them, so that every term is measured from the running "
                           "maximum m_new (or compute P = exp(S - m_new) directly)"),
            ("stored", "the running maximum is replaced by the tile's own row maximum (m = m~, not m_new = max(m, "
                       "m~)): when a later tile's maximum is lower, the running sum and the output, measured from "
                       "m_new, are rescaled from the wrong point. Keep m = m_new after every tile"))),
        Knob("normalise", (
            ("twice", "the output is divided by the running sum l twice: Algorithm 1 keeps O normalised after every "
                      "tile (its diag(l_new)^-1), so O needs no division at the end; an accumulator that is never "
                      "normalised is divided once, at the end"),
            ("l_times_acc", "the accumulator is multiplied by the running sum l when it is rescaled (Algorithm 1's "
                            "diag(l) e^(m - m_new) O) but never divided by l after a tile: that diag(l) undoes "
                            "Algorithm 1's diag(l_new)^-1 of the tile before. Either keep O normalised after every "
                            "tile, or rescale an accumulator by e^(m_old - m_new) alone and divide by l at the end"))),
        Knob("divide", ((False, "the final division is missing: after the last key block, divide the accumulator "
                         "by the running sum, output = acc / l"),)),
        Knob("causal_mask", (
            ("none", "the causal mask is applied to whole tiles only: the tiles that cross the diagonal are "
                     "computed without a mask, so a query sees later keys in them. Mask those tiles entry by "
                     "entry: key position <= query position"),
            ("local", "the causal mask inside a tile compares the positions within the tile (a tril of the tile), "
                      "not the absolute positions, q_start + row >= k_start + column: it is right only when the "
                      "tile's corner sits on the diagonal"),
            ("ignored", "causal=True is ignored: query i may attend to the keys j <= i only"))),
        Knob("scale", (("none", "it does not scale the scores: divide Q K^T by sqrt(d_k) before the online softmax"),
                       ("d_k", "it divides the scores by d_k; divide by the square root of d_k"),
                       ("times_sqrt_d_k", "it multiplies the scores by sqrt(d_k); divide them by sqrt(d_k) (multiply "
                                          "by d_k ** -0.5)"))),
        Knob("skip", (("one_early", "under the causal mask it skips one tile too many: the tile whose first key is "
                                    "the query block's last query is skipped, so that query misses itself. Skip a "
                                    "tile only when its first key comes after the block's last query, k_start > "
                                    "q_start + rows - 1"),)),
    ),
    rules=_online_rules(lambda call: None if call.raises or _causal(call) else _scores(call),
                        lambda call: call.args[4]) + (
        Rule("q_len != k_len", lambda call: not call.raises and call.args[0].shape[-2] != call.args[1].shape[-2]),
        Rule("the last query block is shorter: q_block does not divide q_len",
             lambda call: not call.raises and call.args[0].shape[-2] % call.args[3] > 0),
        Rule("causal, the diagonal crossing tiles away from their corners (q_block != k_block)",
             lambda call: _causal(call) and call.args[3] != call.args[4] and call.args[0].shape[-2] > call.args[3]),
        Rule("causal, tiles wholly above the diagonal (to be skipped, not masked)", _poisoned),
        Rule("scores around 1000", lambda call: not call.raises and _large_scores(call)),
        Rule("leading axes other than (batch, heads)", lambda call: call.args[0].ndim != 4),
        Rule("queries whose scores lie beyond exp's range of one another: each row's own maximum",
             lambda call: not call.raises and not _causal(call) and np.ptp(_scores(call).max(axis=-1)) > 1000),
        Rule("q_block < 1 raises ValueError", lambda call: bool(call.raises) and call.args[3] < 1),
        Rule("k_block < 1 raises ValueError", lambda call: bool(call.raises) and call.args[4] < 1),
    ),
    equivalent=(
        *((name, "q_block < 0 or k_block < 0 instead of < 1: at a block size of 0 range(0, n, 0) raises ValueError "
                 "itself") for name in ("L11 1 -> 0", "L11 1 -> 0 #2")),
        ("L18 q.shape[:-1] + (1,) -> (1,)", "a running maximum of shape (1,) broadcasts: after the first key block, "
         "torch.maximum(m, s.amax(...)) has every query's own"),
        ("L18 -1 -> 0", "q.shape[:0] + (1,) is (1,): the running maximum broadcasts to every query at the first key "
         "block"),
        ("L19 q.shape[:-1] + (1,) -> (1,)", "a running sum of shape (1,) broadcasts: l * alpha + (row sums) has "
         "every query's own after the first key block"),
        ("L19 -1 -> 0", "q.shape[:0] + (1,) is (1,): the running sum broadcasts to every query at the first key block"),
        ("L20 q.shape[:-1] + value.shape[-1:] -> value.shape[-1:]", "an accumulator of shape (d_v,) broadcasts: "
         "acc * alpha + P V has every query's own after the first key block"),
        ("L20 -1 -> 0", "q.shape[:0] + value.shape[-1:] is (d_v,): the accumulator broadcasts at the first key block"),
        *((name, "the tile's entrywise causal mask applied to more tiles: on a tile wholly below the diagonal every "
                 "key j <= every query i, so the mask changes nothing") for name in (
            "L25 ks + s.shape[-1] - 1 > qs -> ks + s.shape[-1] - 1 >= qs", "L25 ks + s.shape[-1] - 1 -> ks + "
            "s.shape[-1] + 1", "L25 ks + s.shape[-1] - 1 -> ks + s.shape[-1]", "L25 1 -> 0")),
    ),
    mistakes=(
        Mistake("softmax_per_tile", "each key block gets a softmax of its own and the blocks' outputs are added: "
                "the weights of a query must sum to 1 over all the keys. Carry a running maximum, a running sum "
                "and an accumulator across the key blocks, rescale the last two when the maximum grows, and "
                "divide once at the end", _softmax_per_tile),
        Mistake("overwrites", "the accumulator and the running sum are replaced by each key block's instead of "
                "carried on: a = a * exp(m_old - m_new) + P V, l = l * exp(m_old - m_new) + (row sums of P)",
                _overwrites),
    ),
    diagnosed=(
        Mistake("masks_everything", SKIP_TILES, _masks_everything),
    ),
    errors=(
        Raises(RAISE_VALUE_ERROR.format(sizes="q_block and k_block"), example=_asserting(ref.tiled_attention),
               match=".",
               when=lambda call: bool(call.raises)),
        Raises("{what} raised {error}. The last block is shorter when the block size does not divide the length: "
               "build a tile's mask and slices from the tile's own size (scores.shape[-2], scores.shape[-1]), "
               "not from q_block and k_block",
               example=_full_block_mask, match="must match the size|shape mismatch|size of tensor|Expected size"),
        Raises("{what} raised {error}: the tensors are PyTorch here; use torch functions and tensor methods "
               "(torch.exp, torch.maximum, .amax, .masked_fill), not numpy's",
               example=_numpy_inside, match="numpy array for a torch tensor input"),
    ),
    hints=(
        Hint("NaN in the output of query 0 only: under the causal mask a query may attend to itself, key j <= "
             "query i; with j < i the first query sees no key at all and 0 / 0 follows",
             _first_query_only, example=_tiled_variant(diagonal=">")),
        Hint("NaN in the outputs of whole query blocks: under the causal mask these queries met no key they may "
             "see. The tiles that cross the diagonal hold such keys: compute them and mask them entry by entry; "
             "skip only the tiles that lie wholly above the diagonal",
             _whole_query_blocks, example=_tiled_variant(skip="not_below")),
        Hint("NaN or infinity at scores around 1000: exp overflows. Subtract the running maximum before "
             "exponentiating, exp(S - m_new)",
             lambda got, call: _large_scores(call) and not _finite(got), example=_tiled_variant(shift=False)),
        Hint(f"NaN or infinity at moderate scores, no mask: {INVERTED_FACTOR}; with m_old = -inf before the first "
             "key block, exp(m_new - m_old) is infinite there",
             lambda got, call: not _causal(call) and not _large_scores(call) and not _finite(got),
             example=_tiled_inverted_factor),
    ),
)


# ---------------------------------------------------------------------- grouped_query_attention
def _gqa_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(batch, heads, kv_heads, q_len, k_len, d_k, d_v, mask=None, mask_name="", raises=""):
        query = rng.normal(size=(batch, heads, q_len, d_k))
        key = rng.normal(size=(batch, kv_heads, k_len, d_k))
        value = rng.normal(size=(batch, kv_heads, k_len, d_v))
        what = (f"grouped_query_attention(query, key, value{', mask' if mask is not None else ''}) for "
                f"{heads} query heads and {kv_heads} key/value heads, {_shapes(query, key, value)}{mask_name}")
        calls.append(Call((query, key, value) + (() if mask is None else (mask,)), what=what, raises=raises))

    ask(2, 12, 4, 5, 7, 8, 9)                                          # 1. groups of 3
    # 2. groups of 4, with a sliding-window mask (window 3 over 6 tokens): every row keeps a key
    # and hides one, so that an inverted mask hides no whole row either
    ask(2, 12, 3, 6, 6, 5, 7, ref.sliding_window_mask(6, 3), ", mask a sliding window (6, 6) of 3 keys")
    # 3. multi-query attention with a padding mask (3, 1, 1, 7): every sequence shorter than 7
    lengths = rng.permutation(np.array([2, 4, 6]))
    padding = (np.arange(7)[None, :] < lengths[:, None])[:, None, None, :]
    ask(3, 6, 1, 4, 7, 5, 2, padding, ", padding mask (3, 1, 1, 7)")
    ask(2, 5, 5, 3, 4, 6, 7)                                           # 4. multi-head attention
    ask(1, 12, 5, 2, 3, 4, 6, raises="ValueError")                    # 5. 5 does not divide 12
    return calls


def _gqa_variant(pairing: str = "consecutive", scale: str = "sqrt_d_k", masking: str = "applied"):
    """A learner's grouped-query attention with its choices: how the key/value heads are paired
    with the query heads, the scale, how the mask is applied."""
    def grouped_query_attention(query, key, value, mask=None):
        heads, kv_heads = query.shape[1], key.shape[1]
        if heads % kv_heads:
            raise ValueError("kv_heads must divide heads")
        group = heads // kv_heads
        consecutive, tiled = (lambda t: t.repeat_interleave(group, dim=1)), (lambda t: t.repeat(1, group, 1, 1))
        key = (tiled if pairing in ("tiled", "keys_tiled") else consecutive)(key)
        value = (tiled if pairing in ("tiled", "values_tiled") else consecutive)(value)
        scores = query @ key.transpose(-2, -1) / {"sqrt_d_k": math.sqrt(query.shape[-1]), "none": 1.0,
                                                   "d_k": query.shape[-1]}[scale]
        if mask is not None and masking != "ignored":
            scores = scores.masked_fill(mask if masking == "inverted" else ~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ value
    return grouped_query_attention


def _heads(call: Call) -> int:
    return call.args[0].shape[1]


def _kv_heads(call: Call) -> int:
    return call.args[1].shape[1]


def _group_by_kv_heads(query, key, value, mask=None):
    """Query head h reads key/value head h // kv_heads (the number of groups taken for the group size)."""
    index = torch.arange(query.shape[1]) // key.shape[1]
    return scaled_dot_product_attention(query, key[:, index], value[:, index], mask)[0]


def _unchecked(query, key, value, mask=None):
    """No check that kv_heads divides heads: the expanded heads do not match the query's."""
    group = query.shape[1] // key.shape[1]
    return scaled_dot_product_attention(query, key.repeat_interleave(group, dim=1),
                                        value.repeat_interleave(group, dim=1), mask)[0]


GROUPED_QUERY_ATTENTION = Spec(
    id="efficient_attention-grouped_query_attention",
    function="grouped_query_attention",
    inputs=_gqa_inputs,
    reference=ref.grouped_query_attention,
    driver="tensors",
    by_call=True,
    variant=_gqa_variant,
    knobs=(
        Knob("pairing", (
            ("tiled", "query head h reads key/value head h % kv_heads, as .repeat(1, group, 1, 1) (or a view of the "
                      "heads as (group, kv_heads)) pairs them; in the stated order the heads of a group are "
                      "consecutive, head h reads key/value head h // group: repeat_interleave(group, dim=1), or "
                      "a view of the heads as (kv_heads, group)"),
            ("keys_tiled", "the keys are paired with the query heads as .repeat pairs them (head h with key head "
                           "h % kv_heads), the values in the stated order: both are shared the same way, head h "
                           "reads key and value head h // group (repeat_interleave for both)"),
            ("values_tiled", "the values are paired with the query heads as .repeat pairs them (head h with value "
                             "head h % kv_heads), the keys in the stated order: both are shared the same way, head "
                             "h reads key and value head h // group (repeat_interleave for both)"))),
        Knob("scale", (("none", "it does not scale the scores: divide Q K^T by sqrt(d_k) before the softmax"),
                       ("d_k", "it divides the scores by d_k; divide by the square root of d_k"))),
        Knob("masking", (("ignored", "it ignores the mask: fill the scores where the mask is False with -inf "
                                     "before the softmax"),
                         ("inverted", "the mask is inverted: True means the query may attend to the key; fill the "
                                      "scores where the mask is False"))),
    ),
    rules=(
        Rule("groups of several query heads over several key/value heads (1 < kv_heads < heads)",
             lambda call: not call.raises and 1 < _kv_heads(call) < _heads(call)),
        Rule("multi-query attention (kv_heads = 1)", lambda call: not call.raises and _kv_heads(call) == 1),
        Rule("multi-head attention (kv_heads = heads)", lambda call: _kv_heads(call) == _heads(call)),
        Rule("q_len != k_len", lambda call: not call.raises and call.args[0].shape[2] != call.args[1].shape[2]),
        Rule("no mask", lambda call: not call.raises and len(call.args) == 3),
        Rule("a mask (q_len, k_len)", lambda call: len(call.args) == 4 and call.args[3].ndim == 2),
        Rule("a padding mask (batch, 1, 1, k_len)", lambda call: len(call.args) == 4 and call.args[3].ndim == 4),
        Rule("kv_heads does not divide heads: ValueError", lambda call: call.raises == "ValueError"),
    ),
    mistakes=(
        Mistake("group_by_kv_heads", "query head h reads key/value head h // kv_heads: the group size is heads // "
                "kv_heads, the number of query heads that share one key/value head, so head h reads key/value "
                "head h // (heads // kv_heads)", _group_by_kv_heads),
    ),
    errors=(
        Raises("{what} raised {error}; it should raise ValueError, as the docstring says: kv_heads does not divide "
               "heads there, so check heads % kv_heads before expanding or reshaping the heads",
               example=_unchecked, match=".", when=lambda call: bool(call.raises)),
    ),
)


# ----------------------------------------------------------------------------- kv_cache_bytes
def _kv_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    # (d_model, heads, kv_heads, bytes per value): GQA, a Llama-2-70B-like GQA, MQA in float32, MHA
    for d_model, heads, kv_heads, size in [(96, 12, 2, 2), (4096, 32, 8, 2), (64, 8, 1, 4), (48, 4, 4, 4)]:
        tokens, layers = int(rng.integers(3, 60)), int(rng.integers(3, 40))
        calls.append(Call((tokens, layers, d_model, heads, kv_heads, size),
                          what=f"kv_cache_bytes(tokens, layers, d_model={d_model}, heads={heads}, "
                               f"kv_heads={kv_heads}, bytes_per_value={size})"))
    calls.append(Call((5, 3, 96, 12, 5, 2), raises="ValueError",
                      what="kv_cache_bytes(tokens, layers, d_model=96, heads=12, kv_heads=5, bytes_per_value=2)"))
    calls.append(Call((5, 3, 100, 12, 4, 2), raises="ValueError",
                      what="kv_cache_bytes(tokens, layers, d_model=100, heads=12, kv_heads=4, bytes_per_value=2)"))
    return calls


def _kv_variant(factor: int = 2, heads_counted: str = "kv_heads", width: str = "d_head", layers_counted: bool = True,
                unit: str = "bytes"):
    """A learner's count with its choices: what is cached per token, which heads, how wide, the layers, the unit."""
    def kv_cache_bytes(tokens, layers, d_model, heads, kv_heads, bytes_per_value):
        if d_model % heads or heads % kv_heads:
            raise ValueError("heads must divide d_model and kv_heads must divide heads")
        count = {"kv_heads": kv_heads, "heads": heads, "group": heads // kv_heads}[heads_counted]
        per_head = d_model // heads if width == "d_head" else d_model
        return (factor * tokens * (layers if layers_counted else 1) * count * per_head * bytes_per_value
                * (8 if unit == "bits" else 1))
    return kv_cache_bytes


KV_CACHE_BYTES = Spec(
    id="efficient_attention-kv_cache_bytes",
    function="kv_cache_bytes",
    inputs=_kv_inputs,
    reference=ref.kv_cache_bytes,
    by_call=True,
    variant=_kv_variant,
    equivalent=(("L10 d_model // heads -> d_model / heads", "heads divides d_model (checked first, ValueError "
                                                             "otherwise), so d_model / heads is d_model // heads, "
                                                             "a float of the same value"),),
    rules=(
        Rule("grouped-query attention (1 < kv_heads < heads)", lambda call: not call.raises and 1 < call.args[4]
             < call.args[3]),
        Rule("multi-query attention (kv_heads = 1)", lambda call: call.args[4] == 1),
        Rule("multi-head attention (kv_heads = heads)", lambda call: call.args[4] == call.args[3]),
        Rule("heads does not divide d_model: ValueError", lambda call: call.raises == "ValueError"
             and call.args[2] % call.args[3] > 0),
        Rule("kv_heads does not divide heads: ValueError", lambda call: call.raises == "ValueError"
             and call.args[3] % call.args[4] > 0),
    ),
    knobs=(
        Knob("factor", ((1, "it counts the keys only (or the values only): the cache holds a key and a value per "
                            "token, layer and key/value head, a factor 2"),
                        (3, "it counts the queries too: only keys and values are cached (a query is used once, at "
                            "its own step), a factor 2, not 3"))),
        Knob("heads_counted", (("heads", "it counts every query head: only the kv_heads key/value heads are cached "
                                         "(kv_heads = heads in multi-head attention, fewer in GQA and MQA)"),
                               ("group", "it counts heads // kv_heads heads, the size of a group (the query heads "
                                         "that share one key/value head): the cache holds kv_heads key/value heads "
                                         "per layer, the number given"))),
        Knob("width", (("d_model", "each key/value head holds d_head = d_model // heads numbers, not d_model"),)),
        Knob("layers_counted", ((False, "it leaves out the layers: every layer caches its own keys and values"),)),
        Knob("unit", (("bits", "it counts bits: the answer is in bytes, bytes_per_value per number"),)),
    ),
)


# ------------------------------------------------------------------------- sliding_window_mask
def _window_inputs(rng: np.random.Generator) -> list[Call]:
    seq_len, window = int(rng.integers(8, 12)), int(rng.integers(3, 6))
    sizes = [(seq_len, window), (7, 2), (6, 1), (5, 5), (4, 9)]  # window 1: itself; window >= seq_len: causal
    calls = [Call((n, w), what=f"sliding_window_mask({n}, {w})") for n, w in sizes]
    calls.append(Call((5, 0), raises="ValueError", what="sliding_window_mask(5, 0)"))
    return calls


def _window(keep):
    """A learner's mask from a rule ``keep(i, j, window)`` on query i (rows) and key j (columns)."""
    def sliding_window_mask(seq_len, window):
        if window < 1:
            raise ValueError("window must be at least 1")
        i, j = np.arange(seq_len)[:, None], np.arange(seq_len)[None, :]
        return keep(i, j, window)
    return sliding_window_mask


def _window_variant(upper: str = "<=", lower: str = ">"):
    """A learner's window with its two bounds: key j <= query i (``upper``: or j < i), and
    j > i - window (``lower``: or j >= i - window, or j > i - window + 1)."""
    return _window(lambda i, j, w: (j <= i if upper == "<=" else j < i)
                   & {">": j > i - w, ">=": j >= i - w, "> + 1": j > i - w + 1}[lower])


def _diagonal_hidden(got: np.ndarray, call: Call) -> bool:
    return got.ndim == 2 and got.shape[0] == got.shape[1] and not np.all(np.diag(got) == 1)


SLIDING_WINDOW_MASK = Spec(
    id="efficient_attention-sliding_window_mask",
    function="sliding_window_mask",
    inputs=_window_inputs,
    reference=ref.sliding_window_mask,
    prepare=_mask_values,
    by_call=True,
    rules=(
        Rule("1 < window < seq_len", lambda call: not call.raises and 1 < call.args[1] < call.args[0]),
        Rule("window = 1: a query sees itself only", lambda call: call.args[1] == 1),
        Rule("window = seq_len: the causal mask", lambda call: call.args[1] == call.args[0]),
        Rule("window larger than the sequence: the causal mask", lambda call: call.args[1] > call.args[0]),
        Rule("window < 1: ValueError", lambda call: call.raises == "ValueError" and call.args[1] < 1),
    ),
    variant=_window_variant,
    knobs=(
        Knob("lower", ((">=", "each query sees window + 1 keys (off by one: j >= i - window); a window of w is w "
                              "keys, the query itself and the w - 1 before it: i - window < j <= i"),
                       ("> + 1", "each query sees window - 1 keys (off by one: j > i - window + 1); a window of w is "
                                 "w keys, the query itself and the w - 1 before it: i - window < j <= i"))),
        Knob("upper", (("<", "a query does not see itself (j < i, off by one at the diagonal): the window holds the "
                             "query's own position and the window - 1 keys before it, i - window < j <= i"),)),
    ),
    hints=(
        Hint("the diagonal should be True: every query sees itself (j = i), whatever the window; row i is query i, "
             "column j key j, and a query sees the keys i - window < j <= i", _diagonal_hidden,
             example=_window(lambda i, j, w: (i < j) & (j < i + w))),
    ),
    mistakes=(
        Mistake("not_itself", "the window is shifted one key back: a query sees the window keys before it, i - "
                "window <= j < i, but not itself; the window holds the query's own position and the window - 1 "
                "before it, i - window < j <= i", _window(lambda i, j, w: (j < i) & (j >= i - w))),
        Mistake("both_sides", "it is a band on both sides of the diagonal: a causal window also hides the future, "
                "j <= i", _window(lambda i, j, w: np.abs(i - j) < w)),
        Mistake("inverted", "it is inverted: True marks the positions to hide; in this course True = may attend",
                _window(lambda i, j, w: ~((j <= i) & (j > i - w)))),
        Mistake("transposed", "it is transposed: row i is query i, which may attend to the keys (columns) j with "
                "i - window < j <= i, on and below the diagonal", _window(lambda i, j, w: (i <= j) & (i > j - w))),
        Mistake("causal_only", "it is the plain causal mask: the window is ignored, and keys more than window - 1 "
                "positions back must be hidden too", _window(lambda i, j, w: j <= i)),
    ),
)


# ---------------------------------------------------------------------------- flash_backward
def _backward_inputs(rng: np.random.Generator) -> list[Call]:
    """Q, K, V drawn as tiled_attention's (scores rising along the keys), their O and L from the
    reference's forward, and an upstream gradient dO drawn apart from O (so that D = rowsum(dO * O)
    is no multiple of anything else)."""
    calls = []

    def ask(q_block: int, k_block: int, causal: bool, sizes: tuple, note: str = "", arrays=None) -> None:
        query, key, value = arrays or _qkv(rng, *sizes)
        out, lse = (t.numpy() for t in ref.flash_forward(*(torch.from_numpy(a) for a in (query, key, value)),
                                                          q_block, k_block, causal))
        grad_out = rng.normal(size=out.shape)
        kwargs = {"causal": True} if causal else {}
        flag = ", causal=True" if causal else ""
        calls.append(Call((query, key, value, out, lse, grad_out, q_block, k_block), kwargs,
                          what=f"flash_backward(query, key, value, out, lse, grad_out, {q_block}, {k_block}{flag}) "
                               f"for {_shapes(query, key, value)}{note}"))

    ask(3, 4, False, (2, 3, 7, 11, 4, 5))             # 1. q_len != k_len, blocks that divide neither length
    ask(4, 3, True, (2, 3, 6, 10, 4, 5), ", 6 queries over 10 keys (the mask aligned bottom-right)")
    ask(2, 4, True, (2, 3, 9, 9, 5, 3))               # 3. causal self-attention, the diagonal off the tiles' corners
    ask(16, 16, False, (1, 2, 5, 6, 3, 4), ", one tile holding everything")
    ask(1, 1, True, (1, 2, 4, 7, 3, 2), ", tiles of one query and one key")
    query, key, value = (t[0] for t in _qkv(rng, 1, 3, 6, 8, 4, 2))
    ask(4, 3, True, (), ", no batch axis", (query, key, value))  # 6. the leading axes are any
    # 7-8. block sizes below 1 raise ValueError, as the docstring says
    query, key, value = _qkv(rng, 1, 2, 4, 5, 3, 3)
    out, lse = (t.numpy() for t in ref.flash_forward(*(torch.from_numpy(a) for a in (query, key, value)), 2, 2))
    for q_block, k_block in [(0, 2), (2, -1)]:
        calls.append(Call((query, key, value, out, lse, rng.normal(size=out.shape), q_block, k_block),
                          raises="ValueError",
                          what=f"flash_backward(query, key, value, out, lse, grad_out, {q_block}, {k_block}) for "
                               f"{_shapes(query, key, value)}"))
    return calls


def _backward_variant(delta: str = "rowsum(dO * O)", probs: str = "exp(S - L)", scale_scores: bool = True,
                      scale_dq: bool = True, scale_dk: bool = True, mask: str = "bottom_right",
                      sign: str = "dP - D", dq_sum: str = "accumulated"):
    """A learner's FlashAttention backward with its choices: D (``delta``: FlashAttention-2's rowsum(dO * O),
    omitted, or the tile's own rowsum(P * dP)), how P is recomputed (``probs``: from L, without L, or a softmax
    of the tile), the scale in S, dQ and dK, the causal mask's alignment, dS's sign, and dQ accumulated over
    the key blocks or overwritten by each."""
    @_blocks_checked
    def flash_backward(query, key, value, out, lse, grad_out, q_block, k_block, causal=False):
        q_len, k_len = query.shape[-2], key.shape[-2]
        scale = query.shape[-1] ** -0.5
        d_all = (grad_out * out).sum(dim=-1, keepdim=True)
        dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
        for ks in range(0, k_len, k_block):
            k, v = key[..., ks:ks + k_block, :], value[..., ks:ks + k_block, :]
            for qs in range(0, q_len, q_block):
                q, do = query[..., qs:qs + q_block, :], grad_out[..., qs:qs + q_block, :]
                s = q @ k.transpose(-2, -1) * (scale if scale_scores else 1.0)
                rows, cols = s.shape[-2:]
                allowed = torch.ones(rows, cols, dtype=torch.bool)
                if causal and mask != "none":
                    shift = k_len - q_len if mask == "bottom_right" else 0
                    allowed = torch.arange(ks, ks + cols)[None, :] <= torch.arange(qs, qs + rows)[:, None] + shift
                if probs == "exp(S - L)":
                    p = torch.exp(s - lse[..., qs:qs + q_block, None]).masked_fill(~allowed, 0.0)
                elif probs == "exp(S)":
                    p = torch.exp(s).masked_fill(~allowed, 0.0)
                else:  # a softmax of the tile
                    p = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1).nan_to_num(0.0)
                dv[..., ks:ks + cols, :] += p.transpose(-2, -1) @ do
                dp = do @ v.transpose(-2, -1)
                d = {"rowsum(dO * O)": d_all[..., qs:qs + rows, :], "omitted": 0.0,
                     "tile": (p * dp).sum(dim=-1, keepdim=True)}[delta]
                ds = p * (dp - d if sign == "dP - D" else d - dp)
                grad_q = ds @ k * (scale if scale_dq else 1.0)
                if dq_sum == "accumulated":
                    dq[..., qs:qs + rows, :] += grad_q
                else:
                    dq[..., qs:qs + rows, :] = grad_q
                dk[..., ks:ks + cols, :] += ds.transpose(-2, -1) @ q * (scale if scale_dk else 1.0)
        return dq, dk, dv
    return flash_backward


@_blocks_checked
def _backward_full_block_mask(query, key, value, out, lse, grad_out, q_block, k_block, causal=False):
    """The causal mask built from q_block and k_block, not from the tile's own (shorter) size."""
    scale = query.shape[-1] ** -0.5
    offset = key.shape[-2] - query.shape[-2]
    d = (grad_out * out).sum(dim=-1, keepdim=True)
    dq, dk, dv = torch.zeros_like(query), torch.zeros_like(key), torch.zeros_like(value)
    for ks in range(0, key.shape[-2], k_block):
        k, v = key[..., ks:ks + k_block, :], value[..., ks:ks + k_block, :]
        for qs in range(0, query.shape[-2], q_block):
            q, do = query[..., qs:qs + q_block, :], grad_out[..., qs:qs + q_block, :]
            p = torch.exp(q @ k.transpose(-2, -1) * scale - lse[..., qs:qs + q_block, None])
            if causal:
                p = p.masked_fill(torch.arange(ks, ks + k_block)[None, :]
                                  > torch.arange(qs, qs + q_block)[:, None] + offset, 0.0)
            dv[..., ks:ks + k_block, :] += p.transpose(-2, -1) @ do
            ds = p * (do @ v.transpose(-2, -1) - d[..., qs:qs + q_block, :])
            dq[..., qs:qs + q_block, :] += ds @ k * scale
            dk[..., ks:ks + k_block, :] += ds.transpose(-2, -1) @ q * scale
    return dq, dk, dv


@_blocks_checked
def _backward_dv_untransposed(query, key, value, out, lse, grad_out, q_block, k_block, causal=False):
    """dV's tile as P dO instead of P^T dO."""
    dq, dk, dv = ref.flash_backward(query, key, value, out, lse, grad_out, q_block, k_block, causal)
    for ks in range(0, key.shape[-2], k_block):
        for qs in range(0, query.shape[-2], q_block):
            p = torch.exp(query[..., qs:qs + q_block, :] @ key[..., ks:ks + k_block, :].transpose(-2, -1)
                          / query.shape[-1] ** 0.5 - lse[..., qs:qs + q_block, None])
            dv[..., ks:ks + k_block, :] += p @ grad_out[..., qs:qs + q_block, :]
    return dq, dk, dv


# A diagnosis that says only that values differ (the engine's last resort), replaced by where the
# three gradients place the mistake: dV = P^T dO reads P alone; dQ and dK read dS; each its own scale.
_UNLOCATED = re.compile(r"but wrong values|contains? NaN or infinity where")


def _located(right: tuple[bool, ...], call: Call) -> str:
    """Where a wrong answer's mistake lies, from which of (dQ, dK, dV) are right."""
    mask = " and, with causal=True, P_ij = 0 where key j > i + k_len - q_len" if _causal(call) else ""
    if not right[2]:
        return ("dV is wrong, and dV = P^T dO reads nothing but the recomputed P and dO: check P_ij = exp(S_ij - "
                f"L_i), with S = Q K^T / sqrt(d_k) (the forward's scores) and L = lse{mask}, and that each tile's "
                "P^T dO is added to the rows of its key block")
    if not right[0] and not right[1]:
        return ("dV is right, so P is; dQ and dK are both wrong, and both read dS: check D = rowsum(dO * O) per "
                "query, dP = dO V^T and dS = P * (dP - D), each query's D taken from its own row")
    if not right[0]:
        return ("dV and dK are right, so P and dS are; dQ is wrong: dQ's rows of a query block are the sum over "
                "every key block of dS K / sqrt(d_k)")
    return ("dV and dQ are right, so P and dS are; dK is wrong: dK's rows of a key block are the sum over every "
            "query block of dS^T Q / sqrt(d_k)")


def _judged_by_parts(locate: Callable[[tuple[bool, ...], Call], str]) -> Callable[[Case], None]:
    """The default judgement of a tuple answer; where it could say only that values differ,
    ``locate(which parts are right, call)`` says where the mistake lies."""
    def judge(case: Case) -> None:
        try:
            judge_case(case)
        except CheckFailed as failure:
            if not _UNLOCATED.search(str(failure)):
                raise
            got = [to_array(item, case.what) for item in case.answer]
            right = tuple(bool(g.shape == np.shape(e) and np.allclose(g, e, rtol=case.spec.rtol, atol=case.spec.atol))
                          for g, e in zip(got, case.expected))
            raise CheckFailed(f"{case.what}: {locate(right, case.call)}") from None
    return judge


def _backward_causal_unaligned(call: Call) -> bool:
    return _causal(call) and call.args[0].shape[-2] != call.args[1].shape[-2]


TRANSPOSED = ("{what} raised {error}. A product of a tile has the wrong axes: with a tile P of shape "
              "(q_rows, k_cols), dV's tile is P^T dO (k_cols, d_v), dP = dO V^T (q_rows, k_cols), dQ's tile "
              "dS K (q_rows, d_k) and dK's tile dS^T Q (k_cols, d_k)")

FLASH_BACKWARD = Spec(
    id="efficient_attention-flash_backward",
    function="flash_backward",
    inputs=_backward_inputs,
    reference=ref.flash_backward,
    driver="tensors",
    judge=_judged_by_parts(_located),
    by_call=True,
    parts=("grad_query", "grad_key", "grad_value"),
    variant=_backward_variant,
    equivalent=tuple((name, "q_block < 0 or k_block < 0 instead of < 1: at a block size of 0 range(0, n, 0) raises "
                            "ValueError itself") for name in ("L11 1 -> 0", "L11 1 -> 0 #2")),
    knobs=(
        Knob("delta", (("omitted", "D is missing from dS: dS = P * (dP - D), with D = rowsum(dO * O) per query "
                                   "(FlashAttention-2, Algorithm 2), the softmax's Jacobian's second term"),
                       ("tile", "D is summed over the tile only, rowsum(P * dP) of one key block: D is a sum over "
                                "every key, which the tile does not hold. Take D = rowsum(dO * O) per query, once, "
                                "before the loops"))),
        Knob("probs", (("exp(S)", "P is recomputed as exp(S) without subtracting the log-sum-exp: P_ij = exp(S_ij "
                                  "- L_i), with lse[..., i] the L of query i saved by the forward"),
                       ("softmax", "P is recomputed as a softmax of the tile alone: the tile holds part of the keys; "
                                   "P_ij = exp(S_ij - L_i), with the L saved by the forward (the log of the sum over "
                                   "every key)"))),
        Knob("scale_scores", ((False, "the recomputed scores are not scaled: S = Q K^T / sqrt(d_k), as in the "
                                      "forward"),)),
        Knob("scale_dq", ((False, "dQ is missing the scale: S = Q K^T / sqrt(d_k), so dQ = dS K / sqrt(d_k)"),)),
        Knob("scale_dk", ((False, "dK is missing the scale: S = Q K^T / sqrt(d_k), so dK = dS^T Q / sqrt(d_k)"),)),
        Knob("mask", (("none", "the causal mask is not applied in the backward: P_ij is 0 where key j is hidden "
                               "from query i (j > i + k_len - q_len), as in the forward"),
                      ("top_left", "the causal mask is aligned top-left (key j <= query i): with q_len < k_len the "
                                   "docstring's mask is aligned bottom-right, key j <= i + k_len - q_len, so that "
                                   "the last query sees every key"))),
        Knob("sign", (("D - dP", "dS has the wrong sign: dS = P * (dP - D)"),)),
        Knob("dq_sum", (("overwritten", "dQ is overwritten by each key block's dS K instead of summed over them: "
                                        "dQ_i += dS_ij K_j * scale for every key block j"),)),
    ),
    rules=(
        Rule("q_len != k_len", lambda call: not call.raises and call.args[0].shape[-2] != call.args[1].shape[-2]),
        Rule("causal with q_len < k_len: the mask aligned bottom-right", _backward_causal_unaligned),
        Rule("causal self-attention (q_len = k_len)",
             lambda call: _causal(call) and call.args[0].shape[-2] == call.args[1].shape[-2]),
        Rule("the last query block is shorter", lambda call: not call.raises
             and call.args[0].shape[-2] % call.args[6] > 0 and call.args[0].shape[-2] > call.args[6]),
        Rule("the last key block is shorter", lambda call: not call.raises
             and call.args[1].shape[-2] % call.args[7] > 0 and call.args[1].shape[-2] > call.args[7]),
        Rule("several key blocks (dQ summed over them)", lambda call: not call.raises
             and call.args[1].shape[-2] > call.args[7]),
        Rule("leading axes other than (batch, heads)", lambda call: call.args[0].ndim != 4),
        Rule("q_block < 1 raises ValueError", lambda call: bool(call.raises) and call.args[6] < 1),
        Rule("k_block < 1 raises ValueError", lambda call: bool(call.raises) and call.args[7] < 1),
    ),
    errors=(
        Raises(RAISE_VALUE_ERROR.format(sizes="q_block and k_block"), example=_asserting(ref.flash_backward),
               match=".", when=lambda call: bool(call.raises)),
        Raises("{what} raised {error}. The last block is shorter when the block size does not divide the length: "
               "build a tile's mask and slices from the tile's own size (P.shape[-2], P.shape[-1]), not from "
               "q_block and k_block", example=_backward_full_block_mask,
               match="must match the size|shape mismatch|size of tensor|Expected size", when=_causal),
        Raises(TRANSPOSED, example=_backward_dv_untransposed,
               match="cannot be multiplied|must match the size|shape mismatch|size of tensor|Expected size"),
    ),
)


# ------------------------------------------------------------------------ rolling_cache_attention
def _rolling_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(window: int, sizes: tuple, note: str = "", raises: str = "") -> None:
        *lead, seq_len, d_k, d_v = sizes
        query, key = rng.normal(size=(*lead, seq_len, d_k)), rng.normal(size=(*lead, seq_len, d_k))
        value = rng.normal(size=(*lead, seq_len, d_v))
        calls.append(Call((query, key, value, window), raises=raises,
                          what=f"rolling_cache_attention(query, key, value, window={window}) for "
                               f"{_shapes(query, key, value)}{note}"))

    ask(4, (2, 3, 11, 5, 6), ", the buffer wrapping round twice")     # 1. 11 tokens through 4 slots
    ask(5, (2, 3, 3, 4, 2), ", fewer tokens than slots")              # 2. slots 3 and 4 never written
    ask(1, (1, 2, 6, 3, 4))                                           # 3. one slot: each token sees itself
    ask(5, (2, 3, 5, 4, 6))                                           # 4. exactly full at the last step
    ask(2, (3, 9, 4, 5), ", no batch axis")                           # 5. the leading axes are any
    for window in (0, -1):                                            # 6-7. ValueError, as the docstring says
        ask(window, (1, 2, 4, 3, 2), raises="ValueError")
    return calls


def _rolling_variant(slot: str = "t % window", unfilled: str = "left out", order: str = "write, then attend",
                     scale: str = "sqrt_d_k"):
    """A learner's rolling buffer with its choices: where position t is written (``slot``), whether the
    slots not yet written take part, whether the step attends before writing its own key and value, the
    scale."""
    def rolling_cache_attention(query, key, value, window):
        if window < 1:
            raise ValueError("window must be at least 1")
        key_cache = key.new_zeros(key.shape[:-2] + (window, key.shape[-1]))
        value_cache = value.new_zeros(value.shape[:-2] + (window, value.shape[-1]))
        output = query.new_empty(query.shape[:-1] + value.shape[-1:])
        divisor = math.sqrt(query.shape[-1]) if scale == "sqrt_d_k" else 1.0
        for t in range(query.shape[-2]):
            def write():
                nonlocal key_cache, value_cache
                if slot == "rolled":  # the oldest first: shift left, the newest written at the end
                    key_cache = torch.cat([key_cache[..., 1:, :], key[..., t:t + 1, :]], dim=-2)
                    value_cache = torch.cat([value_cache[..., 1:, :], value[..., t:t + 1, :]], dim=-2)
                else:
                    at = t % window if slot == "t % window" else (t + 1) % window
                    key_cache[..., at, :], value_cache[..., at, :] = key[..., t, :], value[..., t, :]
            if order == "write, then attend":
                write()
            if slot == "rolled":
                held = slice(window - min(t + 1, window), window) if unfilled == "left out" else slice(0, window)
            elif slot == "t + 1":
                held = (slice(1, min(t + 2, window + 1)) if t + 1 < window else slice(0, window)) \
                    if unfilled == "left out" else slice(0, window)
            else:
                held = slice(0, min(t + 1, window)) if unfilled == "left out" else slice(0, window)
            scores = key_cache[..., held, :] @ query[..., t, :, None] / divisor
            output[..., t, :] = (torch.softmax(scores, dim=-2) * value_cache[..., held, :]).sum(dim=-2)
            if order == "attend, then write":
                write()
        return output, key_cache, value_cache
    return rolling_cache_attention


def _growing_cache(query, key, value, window):
    """The sliding window as a mask over a cache that keeps every token: the right outputs, no buffer."""
    if window < 1:
        raise ValueError("window must be at least 1")
    output = scaled_dot_product_attention(query, key, value, torch.from_numpy(ref.sliding_window_mask(
        query.shape[-2], window)))[0]
    return output, key, value


def _asserting_window(query, key, value, window):
    """The window checked by an assert: an AssertionError, not the ValueError asked."""
    assert window >= 1, "window must be positive"
    return ref.rolling_cache_attention(query, key, value, window)


def _rolling_located(right: tuple[bool, ...], call: Call) -> str:
    """Where a wrong answer's mistake lies, from which of (output, key_cache, value_cache) are right."""
    if not all(right[1:]):
        return ("the caches after the last step are wrong: at step t, key t and value t are written at slot "
                "t % window, so that the buffer holds the last window positions, position p at slot p % window "
                "(slots never written stay 0)")
    return ("the caches are right but the outputs are not: step t attends, after writing its own key and value, "
            "over the slots written so far (min(t + 1, window) of them), with the scores scaled by 1 / sqrt(d_k)")


ROLLING_CACHE_ATTENTION = Spec(
    id="efficient_attention-rolling_cache_attention",
    function="rolling_cache_attention",
    inputs=_rolling_inputs,
    reference=ref.rolling_cache_attention,
    driver="tensors",
    judge=_judged_by_parts(_rolling_located),
    by_call=True,
    parts=("output", "key_cache", "value_cache"),
    variant=_rolling_variant,
    knobs=(
        Knob("slot", (("t + 1", "position t is written at slot (t + 1) % window: Mistral's buffer puts position i at "
                                "slot i % window, so that position 0 is at slot 0"),
                      ("rolled", "the buffer is shifted by one slot at every step (the oldest first) instead of "
                                 "written in place: the outputs are right, but a rolling buffer copies nothing; "
                                 "write position t at slot t % window, over the oldest entry"))),
        Knob("unfilled", (("attended", "the slots not yet written (zeros) take part in the softmax while fewer than "
                                       "window tokens have come: step t attends over the min(t + 1, window) slots "
                                       "written so far"),)),
        Knob("order", (("attend, then write", "each step attends before writing its own key and value: token t must "
                                              "see itself, so write key t and value t at slot t % window first, "
                                              "then attend"),)),
        Knob("scale", (("none", "the scores are not scaled: divide q . k by sqrt(d_k), as in the full attention"),)),
    ),
    mistakes=(
        Mistake("growing_cache", "the cache keeps every token (its length grows with the sequence): a rolling "
                "buffer has window slots, key_cache (..., window, d_k), position t written at slot t % window "
                "over the token that left the window", _growing_cache),
    ),
    rules=(
        Rule("more tokens than slots: the buffer wraps round", lambda call: not call.raises
             and call.args[0].shape[-2] > call.args[3] > 1),
        Rule("the buffer wraps round more than once", lambda call: not call.raises
             and call.args[0].shape[-2] > 2 * call.args[3] > 2),
        Rule("fewer tokens than slots: slots never written", lambda call: not call.raises
             and call.args[0].shape[-2] < call.args[3]),
        Rule("window = 1: each token sees itself only", lambda call: call.args[3] == 1),
        Rule("window = seq_len: full at the last step", lambda call: call.args[3] == call.args[0].shape[-2]),
        Rule("leading axes other than (batch, heads)", lambda call: call.args[0].ndim != 4),
        Rule("window = 0 raises ValueError", lambda call: call.raises == "ValueError" and call.args[3] == 0),
        Rule("window < 0 raises ValueError", lambda call: call.raises == "ValueError" and call.args[3] < 0),
    ),
    errors=(
        Raises("{what} raised {error}; it should raise ValueError, as the docstring says: check that window >= 1 "
               "before the loop, and raise ValueError yourself",
               example=_asserting_window, match=".",
               when=lambda call: bool(call.raises)),
    ),
)

SPECS = (ONLINE_SOFTMAX, TILED_ATTENTION, FLASH_BACKWARD, GROUPED_QUERY_ATTENTION, KV_CACHE_BYTES, SLIDING_WINDOW_MASK,
         ROLLING_CACHE_ATTENTION)
