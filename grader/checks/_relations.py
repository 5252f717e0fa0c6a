"""How a wrong array answer relates to the right one, found on every graded call.

When no catalogued mistake reproduces a learner's answers, :func:`describe` says how they
differ from the reference's, precisely and truthfully: it tries relations (a constant factor,
named when it is a length of an axis, its square root, 2 or -1; transposed or permuted axes;
a shift by one or reversed order along an axis; a constant offset; right except a pattern of
positions (the first or last position along an axis, a triangle, one slice, where a boolean
argument is True or False, where the right value is 0); normalised over another axis; precision
lost; NaN or infinity, and where; for another shape, an axis missing, kept of size 1, swapped
or broadcast) and names one only when it holds on EVERY graded call whose answer has the
right shape, and changes the right answer on the call judged. When nothing fits, it says
which positions are wrong. The inputs' values never enter a description (their shapes do: the
calls' descriptions show them already).

Every spec uses it through ``_core``'s default judging (``_describe``); it knows nothing of
exercises. ``python -m tests.generic_diagnoses`` counts the diagnoses that still say only
"wrong values".
"""
from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

# How closely a relation must reproduce the learner's answer: the checks' own tolerance,
# a little looser (a relation is computed from the reference's float64 answer).
RTOL = 1e-4
ATOL = 1e-5


@dataclass(frozen=True, eq=False)  # (compared by identity: "is this the call judged")
class Pair:
    """One graded call: the learner's answer (float64, None when it is not an array), the
    right one, the call's arguments (``args``: positional, ``kwargs``) and its description."""

    got: np.ndarray | None
    want: np.ndarray
    args: tuple = ()
    kwargs: tuple = ()  # (name, value) pairs
    what: str = ""

    @property
    def comparable(self) -> bool:
        return (self.got is not None and self.got.shape == self.want.shape and self.got.size > 0
                and bool(np.all(np.isfinite(self.got))) and bool(np.all(np.isfinite(self.want))))


def safely(describing: Callable[..., str | None]) -> Callable[..., str | None]:
    """A description that says nothing (None) rather than fail: the grader must judge any
    answer, and a relation tried on an answer of an odd kind may raise."""
    def said(*args, **kwargs) -> str | None:
        try:
            with np.errstate(all="ignore"):
                return describing(*args, **kwargs)
        except Exception:  # (a bug here must cost a precise word, never a verdict)
            return None
    return said


def _within(a: np.ndarray, b: np.ndarray, rtol: float = RTOL, atol: float = ATOL) -> bool:
    return a.shape == b.shape and bool(np.allclose(a, b, rtol=rtol, atol=atol))


def _wrong(pair: Pair, rtol: float = RTOL, atol: float = ATOL) -> np.ndarray:
    """The positions where the learner's answer differs from the right one."""
    return ~np.isclose(pair.got, pair.want, rtol=rtol, atol=atol)


def _axis(axis: int, ndim: int) -> str:
    """An axis of the answer, as a learner reads it (counted from the end, as the docstrings
    do: the same axis with or without leading batch axes)."""
    if axis == -1:
        return "the last axis"
    if axis == -2 and ndim >= 2:
        return "the second-to-last axis" if ndim > 2 else "the first axis"
    if axis + ndim == 0:
        return "the first axis"
    return f"axis {axis + ndim} (of {ndim})"


def _ranges(indices: list[int]) -> str:
    """[0, 1, 2, 5] -> "0..2, 5"."""
    runs, start = [], None
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            runs.append(str(start) if start == x else f"{start}..{x}")
            start = None
    return ", ".join(runs)


def argument_names(function: object, count: int) -> list[str]:
    """The names of a function's first ``count`` positional parameters (``argument i`` when
    they cannot be read)."""
    try:
        names = [p.name for p in inspect.signature(function).parameters.values()
                 if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    except (TypeError, ValueError):
        names = []
    return [names[i] if i < len(names) and names[i] not in ("self", "args") else f"argument {i + 1}"
            for i in range(count)]


def _usable(pairs: list[Pair], index: int) -> tuple[list[Pair], Pair | None]:
    """The calls a same-shape relation is tried on (answers of the right shape, finite), and
    the call judged (None when it is not one of them)."""
    usable = [p for p in pairs if p.comparable]
    return usable, pairs[index] if pairs[index] in usable else None


# What a relation seen on several calls says; left out when only the call judged is known.
EVERY = ", on every graded call"


# ---------------------------------------------------------------------------------- factors
def _arguments(pair: Pair, names: list[str]) -> list[tuple[str, object]]:
    """(name, value) of the call's arguments, positional then keyword."""
    return [(names[i] if i < len(names) else f"argument {i + 1}", a) for i, a in enumerate(pair.args)] + list(
        pair.kwargs)


def _lengths(pair: Pair, names: list[str]) -> Iterator[tuple[str, float]]:
    """(name, value) of the lengths a factor may be: each array argument's axes, counted from
    the end (the same name on every call), the answer's, and the arguments that are numbers
    (a count such as heads or d_model)."""
    arrays = _arguments(pair, names) + [("the answer", pair.want)]
    for name, a in arrays:
        if isinstance(a, (int, float, np.integer, np.floating)) and not isinstance(a, bool):
            yield name, float(a)
        shape = np.shape(a) if isinstance(a, np.ndarray) else ()
        for k in range(1, len(shape) + 1):
            yield f"{name}.shape[-{k}]", float(shape[-k])


def _factors(pair: Pair, names: list[str]) -> Iterator[tuple[str, float]]:
    """Named factors, most telling first: -1, 2, 1/2, then sqrt(n), n, 1/sqrt(n), 1/n of each
    length n (the key is the same on every call; the value may change)."""
    yield "-1", -1.0
    yield "2", 2.0
    yield "1/2", 0.5
    for form, f in (("sqrt({})", math.sqrt), ("{}", float), ("1/sqrt({})", lambda n: 1 / math.sqrt(n)),
                    ("1/{}", lambda n: 1 / n), ("{}**2", lambda n: n * n), ("1/{}**2", lambda n: 1 / (n * n))):
        for name, n in _lengths(pair, names):
            if n > 0:  # (a length of 1 on some call: the factor is 1 there, the same name elsewhere)
                yield form.format(name), f(n)


def _factor(pairs: list[Pair], index: int, names: list[str]) -> str | None:
    """The answer is the right one times a factor on every call (named if it can be)."""
    usable, judged = _usable(pairs, index)
    if judged is None or not any(np.any(p.want != 0) for p in usable):
        return None
    ratios = []
    for p in usable:
        norm = float(np.sum(p.want * p.want))
        c = float(np.sum(p.got * p.want)) / norm if norm else 1.0
        if not _within(p.got, c * p.want):
            return None
        ratios.append(c)
    if _within(judged.want, ratios[usable.index(judged)] * judged.want):
        return None
    # Any number is a multiple of another: a factor is evidence only over several values, a
    # named one over two at least, a constant over three, one per call over two in each call.
    values = sum(int(np.count_nonzero(p.want)) for p in usable)
    candidates = {}
    for p in usable:
        for key, v in _factors(p, names):
            candidates.setdefault(key, []).append(v)
    for key, factors in candidates.items():
        if values >= 2 and len(factors) == len(usable) and all(_within(p.got, v * p.want)
                                                               for p, v in zip(usable, factors)):
            return _say_factor(key)
    mine = ratios[usable.index(judged)]
    if values >= 3 and all(math.isclose(c, mine, rel_tol=1e-4) for c in ratios):
        return f"every value is the right one times {mine:.4g}{EVERY}: a constant factor is wrong"
    if all(np.count_nonzero(p.want) >= 2 and not math.isclose(c, 1.0, rel_tol=1e-4) for p, c in zip(usable, ratios)):
        return (f"every value is the right one times a factor, one per call ({mine:.4g} on this call): a scale "
                "that depends on the inputs' sizes is wrong")
    return None


def _say_factor(key: str) -> str:
    if key == "-1":
        return f"every value has the opposite sign of the right one{EVERY}: a sign is flipped"
    if key.startswith("1/"):
        what = f"divided by {key[2:]}"
    else:
        what = f"multiplied by {key}"
    said = f"every value is the right one {what}{EVERY}"
    if "**2" in key:
        said += ": a division where a multiplication is asked, or the other way round?"
    elif "shape[" in key and "sqrt" not in key:  # (a length: n values added where their mean is asked)
        said += ": a sum where a mean is asked?" if not key.startswith("1/") else ": a mean where a sum is asked?"
    return said


# ---------------------------------------------------------------------- rearranged answers
def _rearrangements(ndim: int) -> Iterator[tuple[str, Callable[[np.ndarray], np.ndarray | None]]]:
    """(description, transform) of the right answer rearranged: axes swapped (counted from
    the end, so that it means the same with or without leading axes), order reversed, shifted
    by one (the position left over compared with nothing)."""
    for i, j in itertools.combinations(range(1, ndim + 1), 2):
        a, b = -j, -i
        said = ("the last two axes swapped (a transpose)" if (a, b) == (-2, -1)
                else f"{_axis(a, ndim)} and {_axis(b, ndim)} swapped")
        yield (f"it is the right answer with {said}",
               lambda e, a=a, b=b: np.swapaxes(e, a, b) if e.ndim >= -a else None)
    for k in range(1, ndim + 1):
        yield (f"it is the right answer in reversed order along {_axis(-k, ndim)}",
               lambda e, k=k: np.flip(e, -k) if e.ndim >= k else None)


def _shifted(pair: Pair, axis: int, step: int) -> bool | None:
    """The answer is the right one shifted by ``step`` along ``axis`` (the overlap compared);
    None when the overlap is empty or the shift changes nothing there."""
    g, e = pair.got, pair.want
    n = e.shape[axis] if e.ndim >= -axis else 0
    if n < 2:
        return None
    later = [slice(None)] * e.ndim
    earlier = [slice(None)] * e.ndim
    later[axis], earlier[axis] = slice(1, None), slice(None, -1)
    got, want = (g[tuple(later)], e[tuple(earlier)]) if step > 0 else (g[tuple(earlier)], e[tuple(later)])
    if _within(want, e[tuple(later)] if step > 0 else e[tuple(earlier)]):
        return None  # (constant along the axis: a shift would not show)
    return _within(got, want)


def _rearranged(pairs: list[Pair], index: int, names: list[str]) -> str | None:
    usable = [p for p in pairs if p.got is not None and p.got.size and np.all(np.isfinite(p.got))]
    judged = pairs[index]
    if judged not in usable or judged.want.ndim == 0:
        return None
    for said, transform in _rearrangements(judged.want.ndim):
        moved = transform(judged.want)
        if moved is None or (moved.shape == judged.want.shape and _within(moved, judged.want)):
            continue
        if all((m := transform(p.want)) is not None and _within(p.got, m) for p in usable):
            return said + EVERY
    for k in range(1, judged.want.ndim + 1):
        for step, said in ((1, "later"), (-1, "earlier")):
            if _shifted(judged, -k, step) and all(_shifted(p, -k, step) is not False for p in usable
                                                  if p.got.shape == p.want.shape):
                return (f"it is the right answer shifted by one position along {_axis(-k, judged.want.ndim)} "
                        f"(each right value appears one position {said}){EVERY}: an index is off "
                        "by one")
    return None


def _reordered(pairs: list[Pair], index: int, names: list[str]) -> str | None:
    """The right values, each once, at other positions, on every call (after the named
    rearrangements: a reshape where a transpose is asked, axes mixed up)."""
    usable, judged = _usable(pairs, index)
    if judged is None or judged.want.size < 2 or len(np.unique(judged.want)) < 2:
        return None
    if all(_within(np.sort(p.got, axis=None), np.sort(p.want, axis=None)) for p in usable):
        return (f"it holds the right values, each once, at other positions{EVERY}: axes are mixed up (a reshape "
                "where a transpose is needed, or a transpose of the wrong axes)")
    return None


# ------------------------------------------------------------------------------- offsets
def _offset(pairs: list[Pair], index: int, names: list[str]) -> str | None:
    """The answer is the right one plus a constant (everywhere, or one per slice of an axis)."""
    usable, judged = _usable(pairs, index)
    if judged is None:
        return None
    if any(p.want.size < 2 for p in usable):
        return None  # (a number is any other plus a constant)
    if all(np.ptp(p.got - p.want) <= ATOL + RTOL * np.max(np.abs(p.want)) for p in usable):
        return f"every value is the right one plus the same constant{EVERY}: a term is added or dropped"
    tolerance = [ATOL + RTOL * np.max(np.abs(p.want)) for p in usable]
    if judged.want.ndim >= 1 and all(np.all(np.abs(p.got - p.want) > t) for p, t in zip(usable, tolerance)):
        # (every value moved: a difference at some positions only is a pattern of positions)
        for k in range(1, judged.want.ndim + 1):
            if judged.want.shape[-k] > 1 and all(p.want.ndim >= k and np.all(np.ptp(p.got - p.want, axis=-k) <= ATOL + RTOL * np.max(np.abs(p.want)))
                   for p in usable):
                return (f"it is the right answer plus a constant along {_axis(-k, judged.want.ndim)} (one per "
                        f"slice){EVERY}: a normalising term (a log-sum-exp, a mean) is missing "
                        "or taken over other values")
    return None


# ---------------------------------------------------------------------- positions
def _masks(pair: Pair, names: list[str]) -> Iterator[tuple[str, np.ndarray]]:
    """(name, positions) of the patterns an answer can be wrong at: the first and last position
    along each axis, the triangles of the last two axes, where a boolean argument is True or
    False (broadcast to the answer), where the right value is 0."""
    shape, ndim = pair.want.shape, pair.want.ndim
    for k in range(1, ndim + 1):
        if shape[-k] > 1:
            index = np.arange(shape[-k]).reshape((-1,) + (1,) * (k - 1))
            where = _axis(-k, ndim)
            yield f"the first position along {where}", np.broadcast_to(index == 0, shape)
            yield f"the last position along {where}", np.broadcast_to(index == shape[-k] - 1, shape)
    if ndim >= 2:
        rows, cols = np.indices(shape[-2:])
        for offset in sorted({0, shape[-1] - shape[-2]}):
            diagonal = "the diagonal" if not offset else "the diagonal of the last query"
            yield (f"above {diagonal} (where a key comes after its query)",
                   np.broadcast_to(cols > rows + offset, shape))
            yield f"below {diagonal} (where a key comes before its query)", np.broadcast_to(cols < rows + offset, shape)
            yield f"on or above {diagonal}", np.broadcast_to(cols >= rows + offset, shape)
            yield f"on {diagonal} (where a key is its own query)", np.broadcast_to(cols == rows + offset, shape)
    arrays = [(names[i] if i < len(names) else f"argument {i + 1}", a) for i, a in enumerate(pair.args)]
    for name, a in arrays + list(pair.kwargs):
        if isinstance(a, np.ndarray) and a.dtype == bool and a.ndim:
            placed = _place(a, shape)
            if placed is not None:
                yield f"where {name} is True", placed
                yield f"where {name} is False", ~placed
    yield "where the right value is 0", pair.want == 0


def _place(mask: np.ndarray, shape: tuple) -> np.ndarray | None:
    """A boolean argument broadcast to the answer's shape: aligned at the right, or (for a
    padding mask (batch, k_len) beside an answer (batch, ..., k_len)) at both ends."""
    try:
        return np.broadcast_to(mask, shape)
    except ValueError:
        pass
    if mask.ndim == 2 and len(shape) > 2 and mask.shape[0] == shape[0]:
        try:
            return np.broadcast_to(mask.reshape((mask.shape[0],) + (1,) * (len(shape) - 2) + mask.shape[1:]), shape)
        except ValueError:
            return None
    return None


def _except(pairs: list[Pair], index: int, names: list[str]) -> str | None:
    """Right except a pattern of positions, the same pattern on every graded call."""
    usable, judged = _usable(pairs, index)
    if judged is None:
        return None
    wrong = {id(p): _wrong(p) for p in usable}
    best = None
    patterns = {}
    for p in usable:
        for name, where in _masks(p, names):
            patterns.setdefault(name, {})[id(p)] = where
    for name, where in patterns.items():
        mine = where.get(id(judged))
        # (a call answered right fits any pattern, with the argument that draws it or without)
        if mine is None or mine.all() or not all(
                not wrong[id(p)].any() or (id(p) in where and not np.any(wrong[id(p)] & ~where[id(p)]))
                for p in usable):
            continue
        if best is None or mine.sum() < best[1].sum():
            best = (name, mine)
    if best is None:
        name, mine = _one_slice(usable, judged, wrong)
        if name is None:
            return None
        best = (name, mine)
    name, mine = best
    every = bool(np.all(wrong[id(judged)][mine]))
    return f"it is right except {name}, where {'every value differs' if every else 'some values differ'}{EVERY}"


def _one_slice(usable: list[Pair], judged: Pair, wrong: dict) -> tuple[str | None, np.ndarray | None]:
    """Wrong only in one slice along an axis (one batch element, one head), on every call."""
    ndim = judged.want.ndim
    for k in range(1, ndim + 1):
        def slices(p):
            if p.want.ndim < k:
                return None
            other = tuple(a for a in range(p.want.ndim) if a != p.want.ndim - k)
            return np.flatnonzero(np.any(wrong[id(p)], axis=other))
        mine = slices(judged)
        if mine is not None and len(mine) == 1 and judged.want.shape[-k] > 2 and all(
                (s := slices(p)) is not None and len(s) <= 1 for p in usable):
            index = np.arange(judged.want.shape[-k]).reshape((-1,) + (1,) * (k - 1))
            return (f"at one index of {_axis(-k, ndim)} (index {mine[0]} on this call)",
                    np.broadcast_to(index == mine[0], judged.want.shape))
    return None, None


@safely
def where_wrong(pair: Pair) -> str:
    """Which positions of a wrong answer differ (nothing fitted): every position (""), the
    indices of the axis along which the fewest slices are wrong, or for a number, how many
    times the right one it is."""
    if pair.want.ndim == 0 and pair.got is not None and pair.got.shape == () and pair.want != 0:
        return (f"it is {float(pair.got / pair.want):.4g} times the right value" if np.isfinite(pair.got)
                else "")
    wrong = _wrong(pair)
    if wrong.all() or pair.want.ndim == 0:
        return ""
    best = None
    for a in range(pair.want.ndim):
        other = tuple(x for x in range(pair.want.ndim) if x != a)
        rows = np.flatnonzero(np.any(wrong, axis=other))
        if len(rows) < pair.want.shape[a] and (best is None or len(rows) / pair.want.shape[a] < best[1]):
            best = (a, len(rows) / pair.want.shape[a], rows)
    if best is None:
        return ""  # (spread over every slice of every axis: nothing more to say than "wrong")
    count = f"{int(wrong.sum())} of its {wrong.size} values are wrong"
    a, _, rows = best
    return (f"{count}, only at {'index' if len(rows) == 1 else 'indices'} {_ranges(list(rows))} of "
            f"{_axis(a - pair.want.ndim, pair.want.ndim)}; the others are right")


@safely
def right_on(pairs: list[Pair], names: list[str]) -> str:
    """The graded calls the learner's answer is right on, when some are and some are not: an
    argument that tells them apart (given or None, True or False), else how many and which;
    "" when it is right on none."""
    right = [p for p in pairs if p.got is not None and p.got.shape == p.want.shape
             and bool(np.allclose(p.got, p.want, rtol=RTOL, atol=ATOL, equal_nan=True))]
    if not right or len(right) == len(pairs):
        return ""
    split = _split(pairs, right, names)
    if split:
        return f"; it is wrong exactly on the graded calls where {split}, right on the others"
    named = right[0].what + (f" and {len(right) - 1} more" if len(right) > 1 else "")
    return f"; it is right on {len(right)} of the {len(pairs)} graded calls: {named}"


def _split(pairs: list[Pair], right: list[Pair], names: list[str]) -> str | None:
    """An argument whose kind (None or given, a boolean's value) is one thing on every call
    answered right and another on every call answered wrong, said as "top_k is given"."""
    def kinds(p: Pair) -> dict[str, object]:
        given = dict(_arguments(p, names))
        return {name: ("None" if value is None else value if isinstance(value, (bool, np.bool_)) else "given")
                for name, value in given.items() if value is None or isinstance(value, (bool, np.bool_, int, float,
                                                                                         np.ndarray, str))}
    every = set().union(*(kinds(p) for p in pairs))
    for name in sorted(every):
        seen = {id(p): kinds(p).get(name, "None") for p in pairs}
        on_right = {seen[id(p)] for p in right}
        on_wrong = {seen[id(p)] for p in pairs if p not in right}
        if len(on_right) == len(on_wrong) == 1 and on_right != on_wrong:
            (kind,) = on_wrong
            return (f"{name} is given" if kind == "given" else f"{name} is None" if kind == "None"
                    else f"{name} is {kind}")
    return None


# ---------------------------------------------------------------------- sums to one
def _sums_to_one(a: np.ndarray, k: int) -> bool:
    """Non-negative, summing to 1 along axis -k."""
    return a.ndim >= k and bool(np.allclose(a.sum(axis=-k), 1.0, atol=1e-6)) and bool(np.all(a >= -1e-12))


def _normalised(pairs: list[Pair], index: int, names: list[str]) -> str | None:
    """The right answer sums to 1 along one axis, the learner's along another, on every call."""
    usable, judged = _usable(pairs, index)
    if judged is None or judged.want.ndim < 2 or not all(p.want.ndim == judged.want.ndim for p in usable):
        return None
    axes = [_one_axes(p) for p in usable if not _within(p.got, p.want)]
    right = set.intersection(*(a for a, _ in axes))
    mine = set.intersection(*(b for _, b in axes))
    if right and mine and not right & mine:
        return _say_normalised(min(mine), min(right), judged.want.ndim) + EVERY
    return None


def _one_axes(pair: Pair) -> tuple[set, set]:
    """The axes (counted from the end) along which the right answer, and the learner's, sum to 1."""
    ndim = pair.want.ndim
    return ({k for k in range(1, ndim + 1) if _sums_to_one(pair.want, k)},
            {k for k in range(1, ndim + 1) if _sums_to_one(pair.got, k)})


def _say_normalised(mine: int, right: int, ndim: int) -> str:
    return (f"it sums to 1 along {_axis(-mine, ndim)}, where the right answer sums to 1 along "
            f"{_axis(-right, ndim)}: it is normalised (a softmax?) over the wrong axis")


@safely
def normalised_here(pair: Pair) -> str | None:
    """On this call, the learner's answer sums to 1 along another axis than the right one (a
    property of this answer; a hint about the sum must not send the learner elsewhere)."""
    if not pair.comparable or pair.want.ndim < 2:
        return None
    right, mine = _one_axes(pair)
    if right and mine and not right & mine:
        return _say_normalised(min(mine), min(right), pair.want.ndim)
    return None


@safely
def unnormalised(pair: Pair) -> str | None:
    """The right answer sums to 1 along an axis, the learner's (on this call) does not: a
    property of this one answer, said when no relation holds on every call."""
    if not pair.comparable or pair.want.ndim == 0:
        return None
    for k in range(1, pair.want.ndim + 1):
        if _sums_to_one(pair.want, k) and not _sums_to_one(pair.got, k):
            return (f"its values along {_axis(-k, pair.want.ndim)} do not sum to 1, as the right ones do: the "
                    "normalisation (exp, then divide by the sum) is missing or wrong")
    return None


# ---------------------------------------------------------------------- precision
def _precision(pairs: list[Pair], index: int, names: list[str]) -> str | None:
    usable, judged = _usable(pairs, index)
    if judged is None or not all(_within(p.got, p.want, 2e-2, 2e-3) for p in usable):
        return None
    scale = max(float(np.max(np.abs(p.want))) for p in usable) or 1.0
    error = max(float(np.max(np.abs(p.got - p.want))) for p in usable) / scale
    return (f"it is right to about {error:.0e} of the values' size, but not to the 1e-4 asked: precision is lost "
            "(computed in float16 or bfloat16, or rounded?), or a small constant (an epsilon) differs")


# ---------------------------------------------------------------------- NaN, infinity
@safely
def nonfinite(pairs: list[Pair], index: int, names: list[str]) -> str | None:
    """NaN or infinity in the learner's answer to call ``index`` (the first graded call that
    is wrong) where the right one is finite: the first position, and the pattern of all of
    them if one fits."""
    p = pairs[index]
    if p.got is None or p.got.shape != p.want.shape:
        return None
    bad = ~np.isfinite(p.got) & np.isfinite(p.want)
    if not bad.any():
        return None
    position = tuple(int(x) for x in np.argwhere(bad)[0])
    kind = "NaN" if np.isnan(p.got[position]) else "infinity"
    said = f"it contains {kind} where the right value is finite" + (f" (first at position {position})" if position else "")
    if bad.all():
        return said + "; every value is NaN or infinite"
    for name, where in _masks(p, names):
        if np.array_equal(where, bad):
            return said + f"; NaN or infinity exactly {name}" + (
                " (a log of 0, or 0 / 0?)" if name == "where the right value is 0" else "")
    return said + f"; {int(bad.sum())} of its {bad.size} values are NaN or infinite"


# ---------------------------------------------------------------------- shapes
@safely
def shape_relation(got: np.ndarray, want: np.ndarray) -> str | None:
    """How an answer of another shape relates to the right one, or None."""
    g, e = got.shape, want.shape
    if len(g) == len(e) - 1:
        for a in range(len(e)):
            if e[:a] + e[a + 1:] == g:
                said = f"axis {a} of the right shape (of length {e[a]}) is missing"
                for how, reduce in (("summed over", np.sum), ("averaged over", np.mean)):
                    if _within(got, reduce(want, axis=a)):
                        return f"{said}: it is the right answer {how} that axis"
                if e[a] == 1 and _within(got, want.reshape(g)):
                    return f"{said}; the values are right: keep that axis of size 1 (keepdims=True, or [..., None])"
                return said
    if len(g) == len(e) + 1:
        for a in range(len(g)):
            if g[:a] + g[a + 1:] == e:
                said = f"it has an extra axis {a} of length {g[a]}"
                if g[a] == 1:
                    said += (" (keepdims=True, or a squeeze missing)" +
                             ("; the values are right" if _within(got.reshape(e), want) else ""))
                return said
    if len(g) == len(e) and sorted(g) == sorted(e):
        for perm in itertools.permutations(range(len(e))):
            if tuple(e[p] for p in perm) == g and _within(got, np.transpose(want, perm)):
                return f"it is the right answer with its axes in the order {perm}: axes are swapped (a transpose)"
        return "it has the right axes in another order: axes are swapped"
    if len(g) > len(e):
        try:
            np.broadcast_shapes(g, e)
            if np.broadcast_shapes(g, e) == g:
                return ("it has more values than asked: two arrays were broadcast against each other (e.g. a "
                        "(n,) array with an (n, 1) one), where they should line up")
        except ValueError:
            pass
    if got.size == want.size and _within(got.reshape(e), want):
        return "it holds the right values in another shape: reshape it"
    return None


# ---------------------------------------------------------------------- all of them
# (precision first: a float16 answer is off everywhere by a little, which a factor near 1
# or an offset would also fit, less truthfully)
RELATIONS = (_precision, _factor, _rearranged, _reordered, _normalised, _offset, _except)
# The relations that say how the whole answer is computed (not only where it is wrong): these
# are preferred to a catalogued mistake that gives the answer to some calls only.
WHOLE = RELATIONS[:-1]
PATTERNS = RELATIONS[-1:]


@safely
def describe(pairs: list[Pair], index: int, names: list[str], tried: tuple = RELATIONS) -> str | None:
    """How the learner's answer on call ``index`` (same shape as the right one, finite) relates
    to the right one, from the relations ``tried`` on every graded call; None if none fits.
    ``names`` are the positional arguments' names (:func:`argument_names`)."""
    for relation in tried:
        said = relation(pairs, index, names)
        if said:
            return said if len(pairs) > 1 else said.replace(EVERY, "")
    return None
