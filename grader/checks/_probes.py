"""What a probe's answers show when no hypothesis gives them: describers any spec can use.

A :class:`~grader.checks._core.Probe` tells hypotheses apart by running them; when none
gives the learner's answers, its ``describe(answers, calls)`` reads a property of the
answers instead. The describers here are built from data (axis names, a table of known
functions) and never quote the probe's inputs: they say what the learner's function did.
"""
from __future__ import annotations

import itertools
from typing import Callable, Sequence

import numpy as np

Describe = Callable[[list, list], "str | None"]


def _part(answer: object, part: int | None) -> np.ndarray | None:
    """The finite float array in ``answer`` (item ``part`` of a tuple), or None."""
    if part is not None:
        answer = answer[part] if isinstance(answer, tuple) and len(answer) > part else None
    if not isinstance(answer, np.ndarray):
        return None
    answer = answer.astype(np.float64)
    return answer if answer.size and np.all(np.isfinite(answer)) else None


def summing_axes(w: np.ndarray, atol: float = 1e-4) -> tuple[int, ...] | None:
    """The fewest axes over which ``w`` is a distribution (no negative entry, every sum 1), or None."""
    if np.any(w < -1e-6):
        return None
    for n in range(1, w.ndim + 1):
        for axes in itertools.combinations(range(w.ndim), n):
            if np.allclose(w.sum(axis=axes), 1.0, atol=atol):
                return axes
    return None


def _listed(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def sums_to_one(names: dict[int, tuple[str, ...]], want: tuple[int, ...], fix: str, part: int | None = None,
                what: str = "the weights") -> Describe:
    """A describer of weights that should be a distribution over the axes ``want`` (e.g. (-1,),
    the keys): over which other axes the learner's answers are distributions instead, for
    each number of dimensions asked (``names[ndim]`` names the axes, e.g. ("batch", "heads",
    "query", "key")). ``fix`` says what to do. Nothing is said of answers that are right
    there, or that sum to one over no axis (a hint's business: a scale, a mask)."""

    def describe(answers: list, calls: list) -> str | None:
        found: dict[str, list[str]] = {}
        shapes = []
        for answer in answers:
            w = _part(answer, part)
            if w is None or w.ndim not in names:
                continue
            shapes.append(f"({', '.join(names[w.ndim])})")
            axes = summing_axes(w)
            if axes is None or axes == tuple(sorted(a % w.ndim for a in want)):
                continue
            seen = f"the {_listed([names[w.ndim][a] for a in axes])} {'axis' if len(axes) == 1 else 'axes together'}"
            found.setdefault(seen, []).append(shapes[-1])
        if not found:
            return None
        if len(found) == 1 and len(next(iter(found.values()))) == len(shapes):
            return f"{what} sum to 1 over {next(iter(found))}: {fix}"
        return f"{what} sum to 1 over " + " and over ".join(
            f"{axes} of {_listed(among)} {what.removeprefix('the ')}" for axes, among in found.items()) + f": {fix}"

    return describe


def _at(x: np.ndarray, y: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return y[(x >= lo) & (x <= hi)]


def activation_shape(inputs: Callable[[object], np.ndarray], known: dict[str, Callable[[np.ndarray], np.ndarray]],
                     asked: str, fix: str) -> Describe:
    """A describer of an activation read from a known region: ``inputs(call)`` are the points the
    probe's answer is the activation of (identity weights, zero biases). Says how the learner's
    activation behaves below 0, at 0 and above, and which function of ``known`` it is closest
    to; ``asked`` names the activation the exercise wants, ``fix`` how to write it."""

    def describe(answers: list, calls: list) -> str | None:
        xs, ys = [], []
        for answer, call in zip(answers, calls):
            y = _part(answer, None)
            x = np.asarray(inputs(call), dtype=np.float64)
            if y is None or y.shape != x.shape:
                return None
            xs.append(x.ravel())
            ys.append(y.ravel())
        x, y = np.concatenate(xs), np.concatenate(ys)
        traits = []
        slope, offset = np.polyfit(x, y, 1)
        if np.allclose(y, slope * x + offset, atol=1e-4):
            traits.append("it is linear: there is no nonlinearity")
        else:
            negative, positive = _at(x, y, -np.inf, -3.0), _at(x, y, 3.0, np.inf)
            near = _at(x, y, -0.05, 0.05)
            if negative.size and np.all(np.abs(negative) < 1e-3):
                traits.append("0 for large negative inputs")
            elif negative.size and np.all(negative < 0):
                traits.append("negative for large negative inputs")
            elif negative.size and np.all(negative > 0):
                traits.append("positive for large negative inputs")
            if near.size and np.any(np.abs(near) > 0.05):
                traits.append("not 0 at 0")
            xp = _at(x, x, 3.0, np.inf)
            if positive.size and np.allclose(positive, xp, atol=1e-3):
                traits.append("the identity for large positive inputs")
            elif positive.size > 1 and np.ptp(positive) < 0.05 * np.ptp(xp):
                traits.append("flat (saturated) for large positive inputs")
        closest = min(known, key=lambda name: float(np.mean((known[name](x) - y) ** 2)))
        close = float(np.sqrt(np.mean((known[closest](x) - y) ** 2))) < 0.1 * float(np.std(y) or 1.0)
        said = f"the activation between the layers is not {asked}: it is " + (", ".join(traits) or "another function")
        if close:
            said += f"; of the activations the grader knows, the closest is {closest}, but it is not exactly that"
        return f"{said}. {fix}"

    return describe
