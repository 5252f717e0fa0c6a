"""Hidden checks of notebook 04, softmax: stable softmax, temperature, scaled dot-product attention.

Sizes are pairwise distinct (batch 2, heads 3, q_len 4, k_len 5, d_k 6, d_v 7) so that a
softmax over the wrong axis, a division by the wrong size or swapped return values
either raise or show. Masks follow the course convention (True = the query may attend
to the key), arrive as bool arrays, broadcast against the scores, and never mask a
whole row (not even when inverted), so that a fill of -inf and a fill of -1e9 give
the same answer. Scores around 1000 test numerical stability: there only NaN or
infinity is a stability mistake, and the tolerance is looser because float32 cannot
resolve 1000 + 1e-4.
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np

from ._core import (ATOL, RTOL, Call, Case, CheckFailed, Hint, Knob, Mistake, Probe, Raises, Rule, Spec, _equal,
                    catalogued, judge_case)
from ._probes import sums_to_one
from ._softmax_kinds import KEEPDIMS_ERROR
from .reference import softmax as ref
from .masking import POSITIVE_FILL, finite_fill_hints, sunk
from .reference.softmax import stable_softmax

# Tolerances where the scores are around 1000: float32 spacing there is 6e-5, and a float32
# attention's weights and outputs then differ from the float64 reference by about 1e-4.
LARGE_RTOL = 2e-3
LARGE_ATOL = 1e-3

OVERFLOW = ("NaN or infinity at scores around 1000: exp overflows (above about 709 in float64, "
            "88 in float32) and 0/0 follows when every exp underflows. Subtract the maximum "
            "along the softmax axis (keepdims=True) before exponentiating; the weights do not change")


def _swap(x):
    return np.swapaxes(x, -1, -2)


def _naive(x, axis=-1):
    e = np.exp(x)
    return e / e.sum(axis=axis, keepdims=True)


def _finite(got: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(got)))


def _sums_to_one(axis: int) -> str:
    return (f"the values along axis {axis} should be positive and sum to 1: "
            "exp of the shifted input, divided by its sum along the same axis")


def _not_a_distribution(w: np.ndarray, axis: int) -> bool:
    # (NaN is diagnosed as NaN, not as a sum that is off)
    return _finite(w) and (bool(np.any(w < -1e-6)) or not np.allclose(w.sum(axis=axis), 1.0, atol=1e-4))


def _errors(name: str, examples: dict) -> tuple[Raises, ...]:
    """The raised-error rules shared by the three exercises, for those with an example."""
    inner = ("" if name == "stable_softmax" else
             " (in this function, or in your stable_softmax if it calls it: fix that one first)")
    rules = {
        "keepdims": (KEEPDIMS_ERROR, f"{name} raised {{error}}. A max or sum over an axis must keep that "
                     f"axis (keepdims=True) to broadcast back against its input{inner}"),
        "broadcast": (r"broadcast", f"{name} raised {{error}}. " + (
            "The mask must broadcast against the scores (batch, heads, q_len, k_len) as it is given: "
            "np.where(mask, scores, -np.inf), without reshaping or squeezing it"
            if name == "scaled_dot_product_attention" else
            f"A max or sum over an axis must keep that axis (keepdims=True) to broadcast back against its "
            f"input{inner}")),
        "transpose": (r"axes don't match array", f"{name} raised {{error}}: numpy's a.transpose(-2, -1) is "
                      "not PyTorch's. Swap the last two axes with np.swapaxes(key, -1, -2) (or "
                      "key.swapaxes(-1, -2), which numpy arrays and torch tensors both have)"),
        "bool_subtract": (r"boolean subtract|with (a bool tensor|two bool tensors) is not supported",
                          f"{name} raised {{error}}. The mask is a bool array: invert it with ~mask "
                          "(or np.logical_not(mask)), not 1 - mask"),
        "if_mask": (r"truth value of an array|Boolean value of Tensor",
                    f"{name} raised {{error}}. Test for a missing mask with `if mask is not None:`, not `if mask:`"),
        "matmul": (r"matmul.*mismatch", f"{name} raised {{error}}. Check the transpose of the keys: on a batch, "
                   "key.T reverses every axis; swap only the last two (np.swapaxes(key, -1, -2)), and "
                   "multiply the weights with value, not value with the weights"),
        "bool_index": (r"boolean index did not match|shape of the mask",
                       f"{name} raised {{error}}. The mask broadcasts against the scores but need not have "
                       "their shape: use np.where(mask, scores, -np.inf) (torch: "
                       "scores.masked_fill(~mask, float('-inf'))) instead of indexing"),
    }
    return tuple(Raises(diagnosis, example=examples[kind], match=match)
                 for kind, (match, diagnosis) in rules.items() if kind in examples)


def _large(call: Call) -> bool:
    """Scores (after a temperature or the scaling) around 1000: the stability questions."""
    if len(call.args) == 2:  # softmax_with_temperature(scores, T)
        return bool(np.max(np.abs(call.args[0] / call.args[1])) > 100)
    if len(call.args) >= 3:  # attention: the scaled scores
        q, k = call.args[:2]
        return bool(np.max(np.abs(q @ _swap(k))) / math.sqrt(q.shape[-1]) > 100)
    return bool(np.max(np.abs(call.args[0][np.isfinite(call.args[0])])) > 100)


def _judge_loosely_when_large(case: Case) -> None:
    """judge_case with float32-sized tolerances on the questions with scores around 1000."""
    if _large(case.call):
        case = dataclasses.replace(case, spec=dataclasses.replace(case.spec, rtol=LARGE_RTOL, atol=LARGE_ATOL))
    judge_case(case)


# ---------------------------------------------------------------------------- stable_softmax
def _softmax_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(x: np.ndarray, axis: int | None, note: str = "") -> None:
        shown = -1 if axis is None else axis
        calls.append(Call((x,), {} if axis is None else {"axis": axis},
                          what=f"stable_softmax(x, axis={shown}) for x of shape {x.shape}{note}"))

    # 1-2. The default axis, then axis=1 by keyword (sizes 2, 3, 4, 5: every axis shows).
    ask(rng.normal(scale=2.0, size=(2, 3, 4, 5)), None)
    ask(rng.normal(scale=2.0, size=(2, 3, 4, 5)), 1)
    # 3. Masked scores: -inf entries get weight 0 (every row keeps two finite entries).
    x = rng.normal(scale=2.0, size=(4, 5))
    for row, cols in enumerate([[1], [0, 3], [4], [2, 4]]):
        x[row, rng.permutation(cols)] = -np.inf
    ask(x, None, " with some -inf entries")
    # 4. Scores around 1000: exp overflows without the shift.
    ask(1000.0 + rng.normal(scale=3.0, size=(4, 5)), None, " with scores around 1000")
    # 5. Slices at very different heights: only a per-slice maximum keeps every one finite.
    x = rng.normal(scale=3.0, size=(4, 6))
    x += np.array([[1000.0], [-1000.0], [0.0], [500.0]])
    x[2, rng.integers(6)] = 995.0 + rng.normal()
    ask(x, -1, " with scores from -1000 to 1000")
    return calls


def _axis(call: Call) -> int:
    return call.kwargs.get("axis", -1) % call.args[0].ndim


def _far_below_only(got: np.ndarray, call: Call) -> bool:
    """The NaN sit only in slices whose maximum lies far below the maximum of the whole array."""
    x, axis = call.args[0], _axis(call)
    far = np.broadcast_to(np.max(x, axis=axis, keepdims=True) < np.max(x) - 80.0, x.shape)
    return bool(np.all(far[~np.isfinite(got)]))


def _judge_softmax(case: Case) -> None:
    """The default judgement, after naming the axis a softmax over the wrong axis took
    (the axis of this call is in the message, so it is no catalogued mistake)."""
    x, axis = case.call.args[0], _axis(case.call)
    got = case.answer
    if isinstance(got, np.ndarray) and got.shape == x.shape and _finite(got):
        tol = (LARGE_RTOL, LARGE_ATOL) if _large(case.call) else (RTOL, ATOL)
        for other in range(x.ndim):
            if other != axis and not _equal(got, case.expected, *tol) and _equal(got, stable_softmax(x, other), *tol):
                case.fail(f"the softmax runs over the last axis instead of axis {axis}: it ignores the "
                          "axis argument; pass axis to the max and the sum" if other == x.ndim - 1 else
                          f"the softmax runs over axis {other} instead of axis {axis}: take the max "
                          "and the sum along axis (keepdims=True)")
    _judge_loosely_when_large(case)


def _no_keepdims(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis)


def _global_max(x, axis=-1):
    e = np.exp(x - np.max(x))
    return e / e.sum(axis=axis, keepdims=True)


def _min_shift(x, axis=-1):
    e = np.exp(x - np.min(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


STABLE_SOFTMAX = Spec(
    id="softmax-stable_softmax",
    function="stable_softmax",
    inputs=_softmax_inputs,
    reference=ref.stable_softmax,
    rules=(Rule("the default axis (-1), on 4-D input with every size distinct",
                lambda call: "axis" not in call.kwargs and len(set(call.args[0].shape)) == 4),
           Rule("an axis given, not the last", lambda call: _axis(call) != call.args[0].ndim - 1),
           Rule("-inf entries get weight exactly 0", lambda call: bool(np.isneginf(call.args[0]).any())),
           Rule("scores around 1000: no overflow", lambda call: bool(np.min(call.args[0]) > 900)),
           Rule("slices at very different heights: the maximum of each slice",
                lambda call: float(np.ptp(np.max(call.args[0], axis=_axis(call)))) > 1000)),
    judge=_judge_softmax,
    by_call=True,
    mistakes=(
        Mistake("every_entry", "it normalizes over every entry at once; the values along the softmax axis "
                "should sum to 1: sum along axis with keepdims=True",
                lambda x, axis=-1: np.exp(x - x.max()) / np.exp(x - x.max()).sum()),
        Mistake("no_exp", "it divides by the sum without exponentiating: softmax is exp(x) / sum(exp(x))",
                lambda x, axis=-1: x / x.sum(axis=axis, keepdims=True)),
        Mistake("no_division", "it returns exp(x - max) without dividing by the sum along the axis",
                lambda x, axis=-1: np.exp(x - x.max(axis=axis, keepdims=True))),
        Mistake("no_exp_shifted", "it divides the shifted scores x - max by their sum without exponentiating: "
                "softmax is exp(x - max) / sum(exp(x - max))",
                lambda x, axis=-1: (lambda d: d / d.sum(axis=axis, keepdims=True))(x - x.max(axis=axis, keepdims=True))),
        Mistake("base_2", "it exponentiates in base 2 (2 ** x or np.exp2); softmax uses e ** x, np.exp",
                lambda x, axis=-1: (lambda e: e / e.sum(axis=axis, keepdims=True))(
                    np.exp2(x - x.max(axis=axis, keepdims=True)))),
        Mistake("log_softmax", "it returns log-probabilities (a log-softmax); exponentiate them",
                lambda x, axis=-1: (lambda s: s - np.log(np.exp(s).sum(axis=axis, keepdims=True)))(
                    x - x.max(axis=axis, keepdims=True))),
    ),
    diagnosed=(
        Mistake("axis_0", "the softmax runs over axis 0 instead of axis 3", lambda x, axis=-1: stable_softmax(x, 0)),
        Mistake("axis_minus_2", "the softmax runs over axis 2 instead of axis 3",
                lambda x, axis=-1: stable_softmax(x, -2)),
        Mistake("ignores_axis", "it ignores the axis argument; pass axis to the max and the sum",
                lambda x, axis=-1: stable_softmax(x)),
    ),
    errors=_errors("stable_softmax", {
        "broadcast": _no_keepdims,
        "transpose": lambda x, axis=-1: stable_softmax(np.transpose(x, (-2, -1)), axis),
    }),
    hints=(
        # (in this order: a whole-array maximum is one way to overflow, the NaN of a
        # -inf entry another; a wrong sum is judged only on finite answers)
        Hint("NaN or infinity in slices whose scores lie far below the largest score of the whole array: "
             "it subtracts the maximum of the whole array; subtract the maximum along the softmax axis "
             "(np.max(x, axis=axis, keepdims=True))",
             lambda got, call: _large(call) and not _finite(got) and _far_below_only(got, call),
             example=_global_max),
        Hint(OVERFLOW, lambda got, call: _large(call) and not _finite(got), example=_naive),
        Hint("NaN or infinity. An entry of -inf (a masked score) must get weight exactly 0, since "
             "exp(-inf - max) = 0: subtract the maximum of the slice, which is finite, not its minimum or "
             "mean, which are -inf",
             lambda got, call: bool(np.isneginf(call.args[0]).any()) and not _finite(got), example=_min_shift),
        # (the axis named is the one judged, counted from 0: 3 on the first question, 1 on the others)
        Hint(_sums_to_one(3), lambda got, call: _axis(call) == 3 and _not_a_distribution(got, 3),
             example=lambda x, axis=-1: stable_softmax(x, axis) + 0.01),
        Hint(_sums_to_one(1), lambda got, call: _axis(call) == 1 and _not_a_distribution(got, 1),
             example=lambda x, axis=-1: stable_softmax(x, axis) * (0.9 if axis == 1 else 1.0)),
    ),
)


# ---------------------------------------------------------------------- softmax_with_temperature
def _temperature_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []
    for shape, temperature, large in [((2, 4, 5), float(rng.uniform(0.3, 0.6)), False),
                                      ((3, 4, 5), float(rng.uniform(2.5, 4.0)), False),
                                      ((4, 5), 0.05, True)]:
        scores = rng.normal(scale=2.0, size=shape) + (50.0 if large else 0.0)
        # The diagnosis describes the hidden temperature; it does not print it.
        note = (", scores / T around 1000" if large else
                f", a temperature {'below' if temperature < 1 else 'above'} 1")
        calls.append(Call((scores, temperature),
                          what=f"softmax_with_temperature(scores, T) for scores of shape {shape}{note}"))
    for temperature in (0.0, -1.0):
        calls.append(Call((rng.normal(size=(4, 5)), temperature), raises="ValueError",
                          what=f"softmax_with_temperature(scores, {temperature})"))
    return calls


def _judge_temperature(case: Case) -> None:
    """A temperature <= 0 must raise ValueError (T -> 0 is the limit argmax, not a number)."""
    if case.call.raises and not hasattr(case.answer, "message"):
        raise CheckFailed(f"{case.what} returned weights; it should raise ValueError, as the docstring says: "
                          "a temperature must be positive (T -> 0 is the limit argmax, not a number to divide by)")
    _judge_loosely_when_large(case)


def _checked(fn):
    """A learner-style temperature softmax that rejects T <= 0 as the docstring asks, then does ``fn``."""
    def softmax_with_temperature(scores, temperature):
        if temperature <= 0:
            raise ValueError("temperature must be positive")
        return fn(scores, temperature)
    return softmax_with_temperature


def _no_check(scores, temperature):
    return stable_softmax(scores / temperature)


def _only_zero(scores, temperature):
    if temperature == 0:
        raise ValueError("temperature must not be 0")
    return stable_softmax(scores / temperature)


def _asserts(scores, temperature):
    assert temperature > 0
    return stable_softmax(scores / temperature)


SOFTMAX_WITH_TEMPERATURE = Spec(
    id="softmax-softmax_with_temperature",
    function="softmax_with_temperature",
    depends=("softmax-stable_softmax",),  # its solution calls them
    inputs=_temperature_inputs,
    reference=ref.softmax_with_temperature,
    rules=(Rule("a temperature below 1", lambda call: 0 < call.args[1] < 1 and not _large(call)),
           Rule("a temperature above 1", lambda call: call.args[1] > 1),
           Rule("scores / T around 1000: no overflow", lambda call: call.args[1] > 0 and _large(call)),
           Rule("T = 0 raises ValueError", lambda call: call.args[1] == 0 and call.raises == "ValueError"),
           Rule("T < 0 raises ValueError", lambda call: call.args[1] < 0 and call.raises == "ValueError")),
    equivalent=(("L9 stable_softmax(scores / temperature, axis=-1) -> stable_softmax(scores / temperature)",
                 "stable_softmax's axis defaults to -1, the axis the reference passes"),),
    judge=_judge_temperature,
    by_call=True,
    mistakes=(
        Mistake("multiplies", "it multiplies the scores by the temperature; divide them: softmax(scores / T), "
                "so that a low temperature sharpens the weights", _checked(lambda s, t: stable_softmax(s * t))),
        Mistake("ignores_t", "it ignores the temperature: softmax(scores / T)",
                _checked(lambda s, t: stable_softmax(s))),
        Mistake("weights_over_t", "it divides the weights by T after the softmax; divide the scores before it",
                _checked(lambda s, t: stable_softmax(s) / t)),
        Mistake("power", "it raises the weights to the power 1/T without normalizing them again",
                _checked(lambda s, t: stable_softmax(s) ** (1.0 / t))),
        Mistake("first_axis", "the softmax runs over the first axis; it runs over the keys, the last axis",
                _checked(lambda s, t: stable_softmax(s / t, 0))),
        Mistake("axis_minus_2", "the softmax runs over axis -2; it runs over the keys, the last axis",
                _checked(lambda s, t: stable_softmax(s / t, -2))),
        Mistake("t_squared", "it divides by T squared; divide by T once", _checked(lambda s, t: stable_softmax(s / t ** 2))),
    ),
    diagnosed=(
        Mistake("no_check", "should raise ValueError, as the docstring says", _no_check),
        Mistake("only_zero", "softmax_with_temperature(scores, -1.0) returned weights", _only_zero),
    ),
    errors=(
        # (first: on a temperature <= 0 any error but ValueError is the wrong one)
        Raises("{what} raised {error}; check `temperature <= 0` first and raise ValueError, as the "
               "docstring says", example=_asserts, when=lambda call: bool(call.raises)),
    ) + _errors("softmax_with_temperature", {"broadcast": _checked(lambda s, t: _no_keepdims(s / t))}),
    hints=(
        Hint(f"{OVERFLOW}. Divide by the temperature first, then use your stable_softmax",
             lambda got, call: _large(call) and not _finite(got), example=_checked(lambda s, t: _naive(s / t))),
        Hint(_sums_to_one(-1), lambda got, call: _not_a_distribution(got, -1),
             example=_checked(lambda s, t: stable_softmax(s / t) * 0.9)),
    ),
)


# ------------------------------------------------------------------ scaled_dot_product_attention
def _attention_inputs(rng: np.random.Generator) -> list[Call]:
    calls = []

    def ask(q, k, v, mask, how: str, note: str) -> None:
        what = (f"scaled_dot_product_attention(query, key, value{', mask' if mask is not None else ''}) "
                f"for query {q.shape}, key {k.shape}, value {v.shape}{note}")
        args, kwargs = (q, k, v), {}
        if how == "positional":
            args = (q, k, v, mask)
        elif how == "keyword":
            kwargs = {"mask": mask}
        calls.append(Call(args, kwargs, what=what))

    def qkv(batch: tuple, q_len: int, k_len: int, d_k: int = 6, d_v: int = 7):
        return (rng.normal(size=batch + (q_len, d_k)), rng.normal(size=batch + (k_len, d_k)),
                rng.normal(size=batch + (k_len, d_v)))

    # 1. No mask: (batch 2, heads 3, q_len 4, k_len 5, d_k 6, d_v 7).
    ask(*qkv((2, 3), 4, 5), None, "none", ", no mask")
    # 2. A padding mask (batch, 1, 1, k_len) from two lengths below k_len, by keyword: neither it
    #    nor its inverse masks a whole row.
    lengths = rng.permutation([2, 3, 4])[:2]
    padding = (np.arange(5) < lengths[:, None])[:, None, None, :]
    ask(*qkv((2, 3), 4, 5), padding, "keyword", f", padding mask of shape {padding.shape}")
    # 3. Self-attention (q_len = k_len = 5) with a causal mask (5, 5), passed positionally.
    causal = np.tril(np.ones((5, 5), dtype=bool))
    ask(*qkv((2, 3), 5, 5), causal, "positional", ", causal mask of shape (5, 5)")
    # 4. No heads axis, a full-shape mask: each row keeps at least one key and masks at least one.
    mask = rng.random((2, 4, 5)) < 0.6
    keep = rng.integers(5, size=(2, 4, 1))
    drop = (keep + rng.integers(1, 5, size=(2, 4, 1))) % 5
    np.put_along_axis(mask, keep, True, axis=-1)
    np.put_along_axis(mask, drop, False, axis=-1)
    assert mask.any(-1).all() and (~mask).any(-1).all()
    ask(*qkv((2,), 4, 5), mask, "keyword", ", mask of shape (2, 4, 5)")
    # 5. Scaled scores around 1000 (a shared large component in dimension 0), mask=None by keyword.
    q, k, v = qkv((2, 3), 4, 5)
    q[..., 0] = k[..., 0] = np.sqrt(1000.0 * np.sqrt(6))
    ask(q, k, v, None, "keyword", ", scaled scores around 1000")
    # 6. A padding mask with rows of scores far below 0 (masking.sunk): a finite fill above some
    #    real scores (-1e4, GPT-2's masked_bias) gives the masked keys the weight there. The scores
    #    of dimension 0 are q_0 k_0 / sqrt(d_k) = level * factor in the sunk rows, 0 in the others.
    q, k, v = qkv((2, 3), 4, 5)
    padding = np.arange(5) < rng.permutation([2, 3, 4])[:2, None]
    levels, factors = sunk(rng, (2, 3, 4, 5), padding)
    down = ~np.isnan(levels)
    q[down] = 0.0
    q[..., 0] = np.where(down, levels * np.sqrt(6), 0.0)
    k[..., 0] = factors[:, None, :]
    ask(q, k, v, padding[:, None, None, :], "positional", ", padding mask (2, 1, 1, 5), some rows of scores far below 0")
    return calls


def _unmasked(rng: np.random.Generator) -> list[Call]:
    """Which axis the weights sum to one over, on shapes with every size distinct: (batch 2,
    heads 3, q_len 4, k_len 5) and, without heads, (2, 4, 5); no mask."""
    return [Call((rng.normal(size=lead + (4, 6)), rng.normal(size=lead + (5, 6)), rng.normal(size=lead + (5, 7))),
                 what="scaled_dot_product_attention on distinct sizes, no mask") for lead in [(2, 3), (2,)]]


ATTENTION_AXES = {4: ("batch", "heads", "query", "key"), 3: ("batch", "query", "key")}
OVER_KEYS = "each query's weights over the keys should sum to 1: softmax over the last axis"


def _mask_of(call: Call) -> np.ndarray | None:
    return call.args[3] if len(call.args) > 3 else call.kwargs.get("mask")


def _attention(divisor=None, fill=-np.inf, axis=-1, after=None, invert=False, use_mask=True):
    """A learner's attention with one thing changed: ``divisor(query, key, value)`` of the
    scores (default sqrt(d_k)), the masked scores' ``fill``, the softmax ``axis``; ``after``
    "mask" multiplies the weights by the mask after the softmax, "scale" divides the weights
    by sqrt(d_k) after an unscaled softmax."""
    def scaled_dot_product_attention(query, key, value, mask=None):
        d_k = query.shape[-1]
        scores = query @ _swap(key)
        if after != "scale":
            scores = scores / (math.sqrt(d_k) if divisor is None else divisor(query, key, value))
        if mask is not None and use_mask and after != "mask":
            scores = np.where(~mask if invert else mask, scores, fill)
        weights = stable_softmax(scores, axis)
        if after == "mask" and mask is not None:
            weights = weights * mask
        if after == "scale":
            weights = weights / math.sqrt(d_k)
        return weights @ value, weights
    return scaled_dot_product_attention


def _nan_in_masked_rows(case: Case) -> bool:
    """On every masked call the weights are NaN in exactly the rows that mask a key, and some
    row masks none (so a row's NaN follows its mask, not the whole call): a fill of +inf."""
    seen = False
    for call, answer in [(case.call, case.answer), *((c, a) for _, c, a in case.others)]:
        mask = _mask_of(call)
        weights = answer[1] if isinstance(answer, tuple) and len(answer) == 2 else None
        if mask is None or not isinstance(weights, np.ndarray):
            continue
        try:
            masks_a_key = np.any(~np.broadcast_to(mask, weights.shape), axis=-1)
        except ValueError:  # (weights of a wrong shape: not this kind)
            return False
        if not np.array_equal(np.isnan(weights.astype(np.float64)).any(axis=-1), masks_a_key):
            return False
        seen = seen or not masks_a_key.all()
    return seen


def _judge_attention(case: Case) -> None:
    """Swapped or NaN answers by their shapes and rows, then each part (the weights first)
    against the same part of every catalogued mistake, then the default judgement."""
    what, answer, (output, weights) = case.what, case.answer, case.expected
    if isinstance(answer, tuple) and len(answer) == 2 and all(isinstance(a, np.ndarray) for a in answer):
        first, second = (a.astype(np.float64) for a in answer)
        if first.shape == weights.shape and second.shape == output.shape:
            raise CheckFailed(f"{what} returns (weights, output); return (output, weights)")
        if _large(case.call) and first.shape == output.shape and second.shape == weights.shape and not (
                _finite(first) and _finite(second)):
            case.fail(f"{OVERFLOW}. Use your stable_softmax")
        mask = _mask_of(case.call)
        if mask is not None and second.shape == weights.shape and not _finite(second):
            bad_rows = np.any(~np.isfinite(second), axis=-1)
            if np.all(np.all(np.broadcast_to(mask, weights.shape), axis=-1)[bad_rows]):
                raise CheckFailed(f"the weights of {what} are NaN in rows where every key may be attended "
                                  "to, as if every key were masked: the mask is inverted. True means the "
                                  "query may attend to the key; fill the scores where the mask is False")
            if _nan_in_masked_rows(case):
                raise CheckFailed(f"the weights of {what} are NaN in exactly the rows that mask a key: {POSITIVE_FILL}")
            raise CheckFailed(f"the weights of {what} contain NaN or infinity. Multiplying -inf by 0 (as in "
                              "scores * mask + (~mask) * -inf) gives NaN, and so does a fill of +inf (exp(inf - "
                              "inf)): use np.where(mask, scores, -np.inf)")
        tol = (LARGE_RTOL, LARGE_ATOL) if _large(case.call) else (RTOL, ATOL)
        if not _equal(answer, case.expected, *tol):
            found = catalogued(case, answer)  # the whole answer first: one mistake, or two knobs at once
            if found:
                case.fail(found)
        for i, part, right in ((1, second, weights), (0, first, output)):
            if _equal(part, right, *tol):
                continue
            for mistake, wrong in case.mistaken():
                if isinstance(wrong, tuple) and len(wrong) == 2 and _equal(part, wrong[i], *tol):
                    raise CheckFailed(f"the {case.spec.parts[i]} of {what}: {mistake.diagnosis}")
            d_k, d_v = case.call.args[0].shape[-1], output.shape[-1]
            if i == 0 and first.shape == output.shape[:-1] + (d_k,) and d_k != d_v:
                raise CheckFailed(f"the output of {what} has shape {first.shape}, d_k at the end: it averages "
                                  "the keys; average the values (weights @ value)")
            break
    _judge_loosely_when_large(case)


def _scores_and_keep(call: Call) -> tuple[np.ndarray, np.ndarray] | None:
    """The call's scaled scores and its mask broadcast to them (None without a mask)."""
    mask = _mask_of(call)
    if mask is None:
        return None
    q, k = call.args[:2]
    scores = q @ _swap(k) / math.sqrt(q.shape[-1])
    return scores, np.broadcast_to(mask, scores.shape)


def _masked_keys_get_weight(w: np.ndarray, call: Call) -> bool:
    mask = _mask_of(call)
    return mask is not None and bool(np.any(w[~np.broadcast_to(mask, w.shape)] > 1e-6))


def _mostly_forbidden(w: np.ndarray, call: Call) -> bool:
    if not _masked_keys_get_weight(w, call):
        return False
    allowed = np.broadcast_to(_mask_of(call), w.shape)
    return bool(w[~allowed].sum() > w[allowed].sum())


def _softmax_without_keepdims_attention(query, key, value, mask=None):
    scores = query @ _swap(key) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = np.where(mask, scores, -np.inf)
    weights = _no_keepdims(scores)
    return weights @ value, weights


def _one_minus_bool(query, key, value, mask=None):
    scores = query @ _swap(key) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores + (True - mask) * -1e9  # bool - bool: numpy and torch refuse
    weights = stable_softmax(scores)
    return weights @ value, weights


def _if_mask(query, key, value, mask=None):
    scores = query @ _swap(key) / math.sqrt(query.shape[-1])
    if mask:
        scores = np.where(mask, scores, -np.inf)
    weights = stable_softmax(scores)
    return weights @ value, weights


def _bool_index(query, key, value, mask=None):
    scores = query @ _swap(key) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores[~mask] = -np.inf  # needs a mask of the scores' own shape
    weights = stable_softmax(scores)
    return weights @ value, weights


def _multiply_fill(query, key, value, mask=None):
    scores = query @ _swap(key) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores * mask + (~mask) * -np.inf  # 0 * -inf = NaN
    weights = stable_softmax(scores)
    return weights @ value, weights


def _averages_keys(query, key, value, mask=None):
    _, weights = ref.scaled_dot_product_attention(query, key, value, mask)
    return weights @ key, weights


def _inverts_causal_only(query, key, value, mask=None):
    """Inverts a square mask (triu for tril), so its last row masks every key."""
    flip = mask is not None and mask.ndim == 2
    return _attention(invert=flip)(query, key, value, mask)


_DIVISORS = {"sqrt_d_k": None, "none": lambda q, k, v: 1.0, "d_k": lambda q, k, v: q.shape[-1],
             "times_sqrt": lambda q, k, v: q.shape[-1] ** -0.5}
_MASKING = {"before_softmax": {}, "ignored": {"use_mask": False}, "inverted": {"invert": True},
            "fill_0": {"fill": 0.0}}


def _implicit_softmax(query, key, value, mask=None):
    """torch's softmax without dim: it picks dim 1 for 4-D scores and dim 0 for 3-D ones."""
    import torch
    scores = torch.as_tensor(query) @ torch.as_tensor(key).transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~torch.as_tensor(mask), float("-inf"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        weights = torch.nn.functional.softmax(scores)
    return weights @ torch.as_tensor(value), weights


def _attention_variant(scale="sqrt_d_k", axis=-1, masking="before_softmax"):
    """Attention with its three choices (the spec's knobs): how the scores are scaled, the
    softmax's axis, how the mask is applied."""
    return _attention(divisor=_DIVISORS[scale], axis=axis, **_MASKING[masking])


SCALED_DOT_PRODUCT_ATTENTION = Spec(
    id="softmax-scaled_dot_product_attention",
    function="scaled_dot_product_attention",
    depends=("softmax-stable_softmax",),  # its solution calls them
    inputs=_attention_inputs,
    reference=ref.scaled_dot_product_attention,
    rules=(Rule("no mask, batch, heads, q_len, k_len, d_k and d_v distinct",
                lambda call: _mask_of(call) is None and len({*call.args[0].shape, call.args[1].shape[-2],
                                                             call.args[2].shape[-1]}) == 6),
           Rule("a padding mask (batch, 1, 1, k_len) that broadcasts", lambda call: _mask_of(call) is not None
                and _mask_of(call).shape[1:3] == (1, 1)),
           Rule("a causal mask (q_len, k_len) without batch or heads axes",
                lambda call: _mask_of(call) is not None and _mask_of(call).ndim == 2),
           Rule("no heads axis, a mask of the scores' full shape", lambda call: call.args[0].ndim == 3
                and _mask_of(call) is not None and _mask_of(call).shape == call.args[0].shape[:-1] + (
                    call.args[1].shape[-2],)),
           Rule("scaled scores around 1000: no overflow", lambda call: _mask_of(call) is None and _large(call)),
           Rule("rows of scores far below 0, masked: a finite fill above them is not enough",
                lambda call: _mask_of(call) is not None and _scores_and_keep(call)[0].min() < -1e8)),
    equivalent=(("L8 stable_softmax(scores, axis=-1) -> stable_softmax(scores)", "stable_softmax's axis defaults to -1, the axis the reference passes"),),
    parts=("output", "weights"),
    order=(1, 0),  # the output follows from the weights: judge the weights first
    judge=_judge_attention,
    variant=_attention_variant,
    knobs=(
        Knob("scale", (("none", 'it does not scale the scores: divide Q K^T by sqrt(d_k) before the softmax'), ("d_k", 'it divides the scores by d_k; divide by the square root of d_k'),
                       ("times_sqrt", 'it multiplies the scores by sqrt(d_k); divide by it'))),
        Knob("axis", ((-2, "the softmax runs over the query axis (-2); each query's weights over the keys must sum to 1: softmax over the last axis"), (0, 'the softmax runs over axis 0 (batch); the keys are the last axis: softmax over axis=-1'), (1, 'the softmax runs over axis 1 (heads); the keys are the last axis: softmax over axis=-1'))),
        Knob("masking", (("ignored", 'it ignores the mask: fill the scores where the mask is False with -inf (or a large negative number) before the softmax'), ("inverted", 'the mask is inverted: True means the query may attend to the key; fill the scores where the mask is False (np.where(mask, scores, -np.inf))'),
                         ("fill_0", 'it sets the masked scores to 0, but exp(0) = 1 still gives those keys weight: fill them with -inf (or a large negative number such as -1e9)'))),
    ),
    # which axes the weights sum to one over, whatever else is wrong (a scale, a mask)
    probes=(Probe("axis", _unmasked, describe=sums_to_one(ATTENTION_AXES, want=(-1,), part=1, fix=OVER_KEYS),
                  examples=(Mistake("implicit_dim", "the weights sum to 1 over the heads axis of (batch, heads, query, "
                                    "key) weights and over the batch axis of (batch, query, key) weights",
                                    _implicit_softmax),)),),
    mistakes=(
        Mistake("mask_after", "it masks after the softmax, so the rows no longer sum to 1: fill the scores with "
                "-inf before the softmax", _attention(after="mask")),
        Mistake("scale_after", "it scales after the softmax; divide the scores by sqrt(d_k) before it",
                _attention(after="scale")),
        # The sizes named are those of the first question (batch 2, heads 3, q_len 4, k_len 5,
        # d_k 6, d_v 7), which every one of these mistakes fails.
        Mistake("sqrt_q_len", "it divides the scores by sqrt(q_len = 4); d_k is the last axis of query and key "
                "(query.shape[-1])", _attention(divisor=lambda q, k, v: math.sqrt(q.shape[-2]))),
        Mistake("sqrt_k_len", "it divides the scores by sqrt(k_len = 5); d_k is the last axis of query and key "
                "(query.shape[-1])", _attention(divisor=lambda q, k, v: math.sqrt(k.shape[-2]))),
        Mistake("sqrt_shape_1", "it divides the scores by the square root of query.shape[1] (the heads of a 4-D "
                "query, the queries of a 3-D one), which is d_k only for a 2-D query; d_k is the last axis: "
                "query.shape[-1]", _attention(divisor=lambda q, k, v: math.sqrt(q.shape[1]))),
        Mistake("sqrt_shape_0", "it divides the scores by the square root of query.shape[0] (the batch); d_k is "
                "the last axis: query.shape[-1]",
                _attention(divisor=lambda q, k, v: math.sqrt(q.shape[0]))),
        Mistake("sqrt_d_v", "it divides the scores by sqrt(d_v = 7); d_k is the last axis of query and key "
                "(query.shape[-1])", _attention(divisor=lambda q, k, v: math.sqrt(v.shape[-1]))),
        Mistake("sqrt_d_model", "it divides the scores by sqrt(d_model = h * d_k = 18); d_k is the last axis of "
                "query and key (query.shape[-1])",
                _attention(divisor=lambda q, k, v: math.sqrt(q.shape[1] * q.shape[-1]))),
        Mistake("by_d_model", "it divides the scores by d_model = h * d_k = 18; divide by sqrt(d_k), "
                "d_k = query.shape[-1]", _attention(divisor=lambda q, k, v: q.shape[1] * q.shape[-1])),
        Mistake("output_scaled", "it divides the output by sqrt(d_k); only the scores are scaled",
                lambda q, k, v, mask=None: (lambda o, w: (o / math.sqrt(q.shape[-1]), w))(
                    *ref.scaled_dot_product_attention(q, k, v, mask))),
        Mistake("output_with_scores", "it averages the values with the raw scores; use the softmax weights",
                lambda q, k, v, mask=None: ((q @ _swap(k) / math.sqrt(q.shape[-1])) @ v,
                                            ref.scaled_dot_product_attention(q, k, v, mask)[1])),
    ),
    diagnosed=(
        Mistake("swapped", "returns (weights, output); return (output, weights)",
                lambda q, k, v, mask=None: ref.scaled_dot_product_attention(q, k, v, mask)[::-1]),
        Mistake("naive_exp", OVERFLOW, lambda q, k, v, mask=None: (lambda w: (w @ v, w))(
            _naive(np.where(True if mask is None else mask, q @ _swap(k) / math.sqrt(q.shape[-1]), -np.inf)))),
        Mistake("inverted_nan", "are NaN in rows where every key may be attended to", _inverts_causal_only),
        Mistake("multiply_fill", "Multiplying -inf by 0", _multiply_fill),
        Mistake("positive_fill", "are NaN in exactly the rows that mask a key", _attention(fill=np.inf)),
        Mistake("averages_keys", "d_k at the end: it averages the keys", _averages_keys),
    ),
    errors=_errors("scaled_dot_product_attention", {
        "keepdims": _softmax_without_keepdims_attention,
        "broadcast": lambda q, k, v, mask=None: ref.scaled_dot_product_attention(
            q, k, v, None if mask is None else mask.squeeze()),
        "transpose": lambda q, k, v, mask=None: ref.scaled_dot_product_attention(q, np.transpose(k, (-2, -1)), v, mask),
        "bool_subtract": _one_minus_bool,
        "if_mask": _if_mask,
        "matmul": lambda q, k, v, mask=None: q @ np.transpose(k),  # .T reverses every axis
        "bool_index": _bool_index,
    }),
    hints=finite_fill_hints(_scores_and_keep, lambda fill: _attention(fill=fill), part=1) + (
        Hint("most of the weight sits on keys the mask forbids: the mask is inverted. True means the query may "
             "attend to the key; fill where the mask is False", _mostly_forbidden,
             example=_attention(invert=True, fill=-3.0), part=1),
        Hint("keys where the mask is False get weight: fill their scores with -inf before the softmax",
             _masked_keys_get_weight, example=_attention(fill=-3.0), part=1),
        Hint(_sums_to_one(-1), lambda got, call: _not_a_distribution(got, -1),
             example=lambda q, k, v, mask=None: (lambda o, w: (o * 0.9, w * 0.9))(
                 *ref.scaled_dot_product_attention(q, k, v, mask)), part=1),
    ),
)

SPECS = (STABLE_SOFTMAX, SOFTMAX_WITH_TEMPERATURE, SCALED_DOT_PRODUCT_ATTENTION)
