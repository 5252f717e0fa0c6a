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

import numpy as np

from ._core import CheckFailed, Question, Raised, exercise, judge, to_array, value

# Tolerances where the scores are around 1000: float32 spacing there is 6e-5, and a float32
# attention's weights and outputs then differ from the float64 reference by about 1e-4.
LARGE_RTOL = 2e-3
LARGE_ATOL = 1e-3

OVERFLOW = ("NaN or infinity at scores around 1000: exp overflows (above about 709 in float64, "
            "88 in float32) and 0/0 follows when every exp underflows. Subtract the maximum "
            "along the softmax axis (keepdims=True) before exponentiating; the weights do not change")


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """The reference: stable, and -inf entries (with a finite entry in their slice) get 0."""
    with np.errstate(all="ignore"):
        e = np.exp(x - np.max(x, axis=axis, keepdims=True))
        return e / np.sum(e, axis=axis, keepdims=True)


def _quiet(fn, *args, **kwargs) -> np.ndarray:
    """A wrong answer computed without warnings (it may hold NaN: NaN never matches)."""
    with np.errstate(all="ignore"):
        return fn(*args, **kwargs)


def _raised_hint(got: object, name: str) -> None:
    """Turn a few well-known exceptions into advice; other answers pass through."""
    if not isinstance(got, Raised):
        return
    message = got.message
    if "broadcast" in message:
        masks = (", and the mask must broadcast against the scores (np.where(mask, scores, -np.inf))"
                 if name == "scaled_dot_product_attention" else "")
        inner = ("" if name == "stable_softmax" else
                 " (in this function, or in your stable_softmax if it calls it: fix that one first)")
        raise CheckFailed(f"{name} raised {message}. A max or sum over an axis must keep that axis "
                          f"(keepdims=True) to broadcast back against its input{inner}{masks}")
    if "axes don't match array" in message:
        raise CheckFailed(f"{name} raised {message}: numpy's a.transpose(-2, -1) is not PyTorch's. "
                          "Swap the last two axes with np.swapaxes(key, -1, -2) (or key.swapaxes(-1, -2), "
                          "which numpy arrays and torch tensors both have)")
    if "boolean subtract" in message or "with a bool tensor is not supported" in message:
        raise CheckFailed(f"{name} raised {message}. The mask is a bool array: invert it with ~mask "
                          "(or np.logical_not(mask)), not 1 - mask")
    if "truth value of an array" in message or "Boolean value of Tensor" in message:
        raise CheckFailed(f"{name} raised {message}. Test for a missing mask with "
                          "`if mask is not None:`, not `if mask:`")
    if "matmul" in message and "mismatch" in message:
        raise CheckFailed(f"{name} raised {message}. Check the transpose of the keys: on a batch, key.T "
                          "reverses every axis; swap only the last two (np.swapaxes(key, -1, -2)), and "
                          "multiply the weights with value, not value with the weights")
    if "boolean index did not match" in message or "shape of the mask" in message:
        raise CheckFailed(f"{name} raised {message}. The mask broadcasts against the scores but "
                          "need not have their shape: use np.where(mask, scores, -np.inf) "
                          "(torch: scores.masked_fill(~mask, float('-inf'))) instead of indexing")


def _sums_to_one(axis: int):
    def hint(w: np.ndarray) -> str | None:
        if np.any(w < -1e-6) or not np.allclose(w.sum(axis=axis), 1.0, atol=1e-4):
            return (f"the values along axis {axis} should be positive and sum to 1: "
                    "exp of the shifted input, divided by its sum along the same axis")
        return None
    return hint


def _far_below(x: np.ndarray, axis: int) -> np.ndarray:
    """Slices (along axis) whose maximum lies far below the maximum of the whole array."""
    return np.max(x, axis=axis, keepdims=True) < np.max(x) - 80.0


def _judge_softmax(got: object, x: np.ndarray, axis: int, what: str, name: str, large: bool) -> None:
    _raised_hint(got, name)
    answer = to_array(got, what)
    expected = _softmax(x, axis)
    if large and answer.shape == expected.shape and not np.all(np.isfinite(answer)):
        bad = ~np.isfinite(answer)
        if np.all(np.broadcast_to(_far_below(x, axis), x.shape)[bad]):
            raise CheckFailed(
                f"{what}: NaN or infinity in slices whose scores lie far below the largest score "
                "of the whole array: it subtracts the maximum of the whole array; subtract the "
                "maximum along the softmax axis (np.max(x, axis=axis, keepdims=True))")
        raise CheckFailed(f"{what}: {OVERFLOW}")
    if np.isneginf(x).any() and answer.shape == expected.shape and not np.all(np.isfinite(answer)):
        raise CheckFailed(f"{what}: NaN or infinity. An entry of -inf (a masked score) must get weight "
                          "exactly 0, since exp(-inf - max) = 0: subtract the maximum of the slice, which "
                          "is finite, not its minimum or mean, which are -inf")
    axis = axis % x.ndim
    mistakes = []
    for other in range(x.ndim):
        if other == axis:
            continue
        if other == x.ndim - 1:
            message = (f"the softmax runs over the last axis instead of axis {axis}: it ignores the "
                       "axis argument; pass axis to the max and the sum")
        else:
            message = (f"the softmax runs over axis {other} instead of axis {axis}: take the max "
                       "and the sum along axis (keepdims=True)")
        mistakes.append((message, _softmax(x, other)))
    shifted = _quiet(lambda: x - np.max(x, axis=axis, keepdims=True))
    mistakes += [
        ("it normalizes over every entry at once; the values along the softmax axis should "
         "sum to 1: sum along axis with keepdims=True", _quiet(lambda: np.exp(x - x.max()) / np.exp(x - x.max()).sum())),
        ("it divides by the sum without exponentiating: softmax is exp(x) / sum(exp(x))",
         _quiet(lambda: x / x.sum(axis=axis, keepdims=True))),
        ("it returns exp(x - max) without dividing by the sum along the axis", _quiet(np.exp, shifted)),
        ("it returns log-probabilities (a log-softmax); exponentiate them",
         _quiet(lambda: shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True)))),
    ]
    rtol, atol = (LARGE_RTOL, LARGE_ATOL) if large else (1e-4, 1e-5)
    judge(answer, expected, what, mistakes, hints=[_sums_to_one(axis)], rtol=rtol, atol=atol)


@exercise("softmax-stable_softmax", "stable_softmax")
def stable_softmax_questions(rng: np.random.Generator) -> list[Question]:
    name = "stable_softmax"
    asked = []

    def ask(x: np.ndarray, axis: int | None, large: bool, note: str = "") -> None:
        shown = -1 if axis is None else axis
        what = f"stable_softmax(x, axis={shown}) for x of shape {x.shape}{note}"
        kwargs = {} if axis is None else {"axis": axis}
        asked.append(Question((x,), lambda got: _judge_softmax(got, x, shown, what, name, large), kwargs))

    # 1-2. The default axis, then axis=1 by keyword (sizes 2, 3, 4, 5: every axis shows).
    ask(rng.normal(scale=2.0, size=(2, 3, 4, 5)), None, False)
    ask(rng.normal(scale=2.0, size=(2, 3, 4, 5)), 1, False)
    # 3. Masked scores: -inf entries get weight 0 (every row keeps two finite entries).
    x = rng.normal(scale=2.0, size=(4, 5))
    for row, cols in enumerate([[1], [0, 3], [4], [2, 4]]):
        x[row, rng.permutation(cols)] = -np.inf
    ask(x, None, False, " with some -inf entries")
    # 4. Scores around 1000: exp overflows without the shift.
    ask(1000.0 + rng.normal(scale=3.0, size=(4, 5)), None, True, " with scores around 1000")
    # 5. Slices at very different heights: only a per-slice maximum keeps every one finite.
    x = rng.normal(scale=3.0, size=(4, 6))
    x += np.array([[1000.0], [-1000.0], [0.0], [500.0]])
    x[2, rng.integers(6)] = 995.0 + rng.normal()
    ask(x, -1, True, " with scores from -1000 to 1000")
    return asked


def _judge_temperature(got: object, scores: np.ndarray, temperature: float, what: str, large: bool) -> None:
    _raised_hint(got, "softmax_with_temperature")
    answer = to_array(got, what)
    expected = _softmax(scores / temperature)
    if large and answer.shape == expected.shape and not np.all(np.isfinite(answer)):
        raise CheckFailed(f"{what}: {OVERFLOW}. Divide by the temperature first, then use your stable_softmax")
    plain = _softmax(scores)
    mistakes = [
        ("it multiplies the scores by the temperature; divide them: softmax(scores / T), so that "
         "a low temperature sharpens the weights", _softmax(scores * temperature)),
        ("it ignores the temperature: softmax(scores / T)", plain),
        ("it divides the weights by T after the softmax; divide the scores before it", plain / temperature),
        ("it raises the weights to the power 1/T without normalizing them again",
         _quiet(np.power, plain, 1.0 / temperature)),
        ("the softmax runs over the first axis; it runs over the keys, the last axis",
         _softmax(scores / temperature, 0)),
        ("the softmax runs over axis -2; it runs over the keys, the last axis",
         _softmax(scores / temperature, -2)),
        ("it divides by T squared; divide by T once", _softmax(scores / temperature ** 2)),
    ]
    rtol, atol = (LARGE_RTOL, LARGE_ATOL) if large else (1e-4, 1e-5)
    judge(answer, expected, what, mistakes, hints=[_sums_to_one(-1)], rtol=rtol, atol=atol)


def _judge_bad_temperature(got: object, temperature: float) -> None:
    what = f"softmax_with_temperature(scores, {temperature})"
    if isinstance(got, Raised):
        if got.message.startswith("ValueError"):
            return
        if got.message.startswith("NotImplementedError"):
            value(got, "softmax_with_temperature")  # its own diagnosis
        raise CheckFailed(f"{what} raised {got.message}; check `temperature <= 0` first and "
                          "raise ValueError, as the docstring says")
    raise CheckFailed(f"{what} returned weights; it should raise ValueError, as the docstring says: "
                      "a temperature must be positive (T -> 0 is the limit argmax, not a number "
                      "to divide by)")


@exercise("softmax-softmax_with_temperature", "softmax_with_temperature")
def softmax_with_temperature_questions(rng: np.random.Generator) -> list[Question]:
    asked = []
    for shape, temperature, large in [((2, 4, 5), float(rng.uniform(0.3, 0.6)), False),
                                      ((3, 4, 5), float(rng.uniform(2.5, 4.0)), False),
                                      ((4, 5), 0.05, True)]:
        scores = rng.normal(scale=2.0, size=shape) + (50.0 if large else 0.0)
        # The diagnosis describes the hidden temperature; it does not print it.
        note = (", scores / T around 1000" if large else
                f", a temperature {'below' if temperature < 1 else 'above'} 1")
        what = f"softmax_with_temperature(scores, T) for scores of shape {shape}{note}"
        asked.append(Question((scores, temperature), lambda got, s=scores, t=temperature, w=what, l=large:
                              _judge_temperature(got, s, t, w, l)))
    for temperature in (0.0, -1.0):
        asked.append(Question((rng.normal(size=(4, 5)), temperature),
                              lambda got, t=temperature: _judge_bad_temperature(got, t)))
    return asked


def _attention(q, k, v, mask=None, *, divisor=None, fill=-np.inf, axis=-1, after=None):
    """Attention with knobs for the known mistakes; the defaults are the reference.

    divisor: what the scores are divided by (default sqrt(d_k)); fill: the masked scores'
    value; axis: the softmax axis; after: "mask" multiplies the weights by the mask after
    the softmax, "scale" divides the weights by sqrt(d_k) after an unscaled softmax.
    """
    with np.errstate(all="ignore"):
        d_k = q.shape[-1]
        scores = q @ np.swapaxes(k, -1, -2)
        if after != "scale":
            scores = scores / (np.sqrt(d_k) if divisor is None else divisor)
        if mask is not None and after != "mask":
            scores = np.where(mask, scores, fill)
        weights = _softmax(scores, axis)
        if after == "mask":
            weights = weights * mask
        if after == "scale":
            weights = weights / np.sqrt(d_k)
        return weights @ v, weights


def _judge_attention(got: object, q, k, v, mask, what: str, large: bool = False) -> None:
    name = "scaled_dot_product_attention"
    _raised_hint(got, name)
    got = value(got, name)
    if not isinstance(got, tuple) or len(got) != 2:
        kind = f"a tuple of {len(got)} items" if isinstance(got, tuple) else "one array"
        raise CheckFailed(f"{what} should return a tuple (output, weights), but it returns {kind}")
    output, weights = _attention(q, k, v, mask)
    first, second = (to_array(a, what) for a in got)
    if first.shape == weights.shape and second.shape == output.shape:
        raise CheckFailed(f"{what} returns (weights, output); return (output, weights)")
    if large and first.shape == output.shape and second.shape == weights.shape and not (
            np.all(np.isfinite(first)) and np.all(np.isfinite(second))):
        raise CheckFailed(f"{what}: {OVERFLOW}. Use your stable_softmax")
    allowed = np.broadcast_to(mask, weights.shape) if mask is not None else None
    if mask is not None and second.shape == weights.shape and not np.all(np.isfinite(second)):
        bad_rows = np.any(~np.isfinite(second), axis=-1)
        if np.all(np.all(allowed, axis=-1)[bad_rows]):
            raise CheckFailed(f"the weights of {what} are NaN in rows where every key may be attended "
                              "to, as if every key were masked: the mask is inverted. True means the "
                              "query may attend to the key; fill the scores where the mask is False")
        raise CheckFailed(f"the weights of {what} contain NaN or infinity. Multiplying -inf by 0 (as in "
                          "scores * mask + (~mask) * -inf) gives NaN: use np.where(mask, scores, -np.inf)")

    d_k, q_len, k_len, d_v = q.shape[-1], q.shape[-2], k.shape[-2], v.shape[-1]
    sizes = {"q_len": q_len, "k_len": k_len, "d_v": d_v}
    if q.ndim == 4:  # (batch, heads, len, d_k): d_model = h * d_k, the width of all heads together
        sizes["d_model = h * d_k"] = q.shape[1] * d_k
    mistakes = []
    if mask is not None:
        mistakes += [
            ("it ignores the mask: fill the scores where the mask is False with -inf (or a large "
             "negative number) before the softmax", _attention(q, k, v)[1]),
            ("the mask is inverted: True means the query may attend to the key; fill the scores "
             "where the mask is False (np.where(mask, scores, -np.inf))", _attention(q, k, v, ~mask)[1]),
            ("it sets the masked scores to 0, but exp(0) = 1 still gives those keys weight: fill "
             "them with -inf (or a large negative number such as -1e9)", _attention(q, k, v, mask, fill=0.0)[1]),
            ("it masks after the softmax, so the rows no longer sum to 1: fill the scores with -inf "
             "before the softmax", _attention(q, k, v, mask, after="mask")[1]),
        ]
    mistakes += [
        ("it does not scale the scores: divide Q K^T by sqrt(d_k) before the softmax",
         _attention(q, k, v, mask, divisor=1.0)[1]),
        ("it divides the scores by d_k; divide by the square root of d_k",
         _attention(q, k, v, mask, divisor=float(d_k))[1]),
        ("it multiplies the scores by sqrt(d_k); divide by it", _attention(q, k, v, mask, divisor=d_k ** -0.5)[1]),
        ("it scales after the softmax; divide the scores by sqrt(d_k) before it",
         _attention(q, k, v, mask, after="scale")[1]),
    ]
    for size_name, size in sizes.items():
        mistakes.append((f"it divides the scores by sqrt({size_name} = {size}); d_k is the last axis of "
                         "query and key (query.shape[-1])", _attention(q, k, v, mask, divisor=np.sqrt(size))[1]))
        if "d_model" in size_name:
            mistakes.append((f"it divides the scores by {size_name} = {size}; divide by sqrt(d_k), "
                             "d_k = query.shape[-1]", _attention(q, k, v, mask, divisor=float(size))[1]))
    mistakes.append(("the softmax runs over the query axis (-2); each query's weights over the keys "
                     "must sum to 1: softmax over the last axis", _attention(q, k, v, mask, axis=-2)[1]))
    for axis in range(q.ndim - 2):
        mistakes.append((f"the softmax runs over axis {axis} ({'batch' if axis == 0 else 'heads'}); "
                         "the keys are the last axis: softmax over axis=-1", _attention(q, k, v, mask, axis=axis)[1]))

    def masked_keys_get_weight(w: np.ndarray) -> str | None:
        if allowed is None or not np.any(w[~allowed] > 1e-6):
            return None
        if w[~allowed].sum() > w[allowed].sum():
            return ("most of the weight sits on keys the mask forbids: the mask is inverted. True "
                    "means the query may attend to the key; fill where the mask is False")
        return "keys where the mask is False get weight: fill their scores with -inf before the softmax"

    rtol, atol = (LARGE_RTOL, LARGE_ATOL) if large else (1e-4, 1e-5)
    judge(second, weights, f"the weights of {what}", mistakes,
          hints=[masked_keys_get_weight, _sums_to_one(-1)], rtol=rtol, atol=atol)
    if first.shape == output.shape[:-1] + (d_k,) and d_k != d_v:
        raise CheckFailed(f"the output of {what} has shape {first.shape}, d_k at the end: it averages "
                          "the keys; average the values (weights @ value)")
    judge(first, output, f"the output of {what}", [
        ("it divides the output by sqrt(d_k); only the scores are scaled", output / np.sqrt(d_k)),
        ("it averages the values with the raw scores; use the softmax weights",
         _quiet(lambda: (q @ np.swapaxes(k, -1, -2) / np.sqrt(d_k)) @ v)),
    ], rtol=rtol, atol=atol)


@exercise("softmax-scaled_dot_product_attention", "scaled_dot_product_attention")
def scaled_dot_product_attention_questions(rng: np.random.Generator) -> list[Question]:
    asked = []

    def ask(q, k, v, mask, how: str, note: str, large: bool = False) -> None:
        what = (f"scaled_dot_product_attention(query, key, value{', mask' if mask is not None else ''}) "
                f"for query {q.shape}, key {k.shape}, value {v.shape}{note}")
        args, kwargs = (q, k, v), {}
        if how == "positional":
            args = (q, k, v, mask)
        elif how == "keyword":
            kwargs = {"mask": mask}
        asked.append(Question(args, lambda got: _judge_attention(got, q, k, v, mask, what, large), kwargs))

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
    asked_large = (q, k, v)
    ask(*asked_large, None, "keyword", ", scaled scores around 1000", large=True)
    return asked
