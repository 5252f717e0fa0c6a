"""Kinds of softmax mistake that outside code shows, as hints and error rules any spec can use.

A learner's softmax over the keys can run over another axis without saying so: torch's
``F.softmax`` (or ``nn.Softmax()``) without ``dim`` picks one (dim 0 of 3-D input, dim 1 of
4-D), ``scipy.special.softmax`` without ``axis`` normalises the flattened array, and a max or
sum without ``keepdims=True`` loses its axis, so it broadcasts back along another one (an
error, or silently on square scores). Masked scores make such weights NaN where a whole slice
is masked, so the axis is read where the sums are defined.
"""
from __future__ import annotations

import warnings
from typing import Callable

import numpy as np

from ._core import Call, Hint, Raises

# numpy's error when a reduction over the last axis lost it: "shapes (2,3,4,5) (2,3,4)".
KEEPDIMS_ERROR = r"shapes \(([\d,]+),\d+\) \(\1,?\)"


def implicit_dim(ndim: int) -> int:
    """The dim torch's softmax takes when none is given (torch.nn.functional._get_softmax_dim)."""
    return 0 if ndim in (0, 1, 3) else 1


def distribution_over(w: np.ndarray, axes: tuple[int, ...]) -> bool:
    """``w`` is a distribution over ``axes`` wherever defined: no negative entry, and every sum
    over those axes that is not NaN (a slice that was all masked) is 1, with some defined."""
    if not np.issubdtype(w.dtype, np.floating) or np.nanmin(w, initial=0.0) < -1e-6:
        return False
    sums = np.sum(w, axis=axes)
    defined = np.isfinite(sums)
    return bool(defined.any()) and bool(np.allclose(sums[defined], 1.0, atol=1e-4))


def _over(which: Callable[[int], tuple[int, ...] | None]) -> Callable[[np.ndarray, Call], bool]:
    """A hint's test: the weights are a distribution over ``which(ndim)`` and not over the keys."""
    def applies(w: np.ndarray, call: Call) -> bool:
        axes = which(w.ndim) if w.ndim >= 2 else None
        return axes is not None and distribution_over(w, axes) and not distribution_over(w, (w.ndim - 1,))
    return applies


def _torch_implicit(x: np.ndarray) -> np.ndarray:
    import torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch warns that the implicit dim is deprecated)
        return torch.nn.functional.softmax(torch.as_tensor(x)).numpy()


def _flattened(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x))
    return e / np.sum(e)


def _first_axis(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=0, keepdims=True))
    return e / np.sum(e, axis=0, keepdims=True)


def softmax_axis_hints(example: Callable[[Callable], object], part: int | None = None,
                       what: str = "the weights", other: bool = True) -> tuple[Hint, ...]:
    """Hints for weights that should sum to 1 over the keys (the last axis) but sum to 1 over
    torch's implicit dim, over the whole array, or (``other``) over another single axis.
    ``example(softmax)`` is a learner-style implementation of the exercise with that softmax
    (scores -> weights). Leave ``other`` out where the catalogue names each other axis, or
    where the inputs have no axis but the implicit dim's to show it."""
    fix = "take the softmax over the keys, the last axis (axis=-1; torch: dim=-1)"
    hints = (
        Hint(f"{what} sum to 1 over the dim torch's F.softmax (or nn.Softmax()) picks when none is given "
             f"(dim 0 of 3-D input, dim 1 of 4-D): an implicit dim; {fix}",
             _over(lambda ndim: (implicit_dim(ndim),) if implicit_dim(ndim) != ndim - 1 else None),
             example=example(_torch_implicit), part=part),
        Hint(f"{what} sum to 1 over the whole array at once, as scipy.special.softmax without axis (or a sum "
             f"without axis) gives: {fix}", _over(lambda ndim: tuple(range(ndim))),
             example=example(_flattened), part=part),
    )
    return hints if not other else hints + (
        Hint(f"{what} sum to 1 over another axis than the keys (numpy's reductions default to axis=None or "
             f"axis=0): {fix}",
             lambda w, call: w.ndim >= 2 and any(_over(lambda ndim, a=a: (a,))(w, call) for a in range(w.ndim - 1)),
             example=example(_first_axis), part=part),
    )


def keepdims_rule(function: str, example: object) -> Raises:
    """The error rule of a max or sum over the last axis that lost it (keepdims forgotten)."""
    return Raises(f"{function} raised {{error}}: a max or sum over the keys (the last axis) lost that axis "
                  "(keepdims=True forgotten), so it cannot broadcast back against the scores: "
                  "np.max(x, axis=-1, keepdims=True), np.sum(e, axis=-1, keepdims=True) (torch: keepdim=True)",
                  example=example, match=KEEPDIMS_ERROR)


def no_keepdims_sum(x: np.ndarray) -> np.ndarray:
    """A softmax whose sum lost its axis: on square scores each row is divided by the sums of
    the other rows, entry by entry (they broadcast along the wrong axis); else an error."""
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return e / np.sum(e, axis=-1)


def no_keepdims_max(x: np.ndarray) -> np.ndarray:
    """A softmax whose max lost its axis: on square scores it subtracts the maximum of another row."""
    e = np.exp(x - np.max(x, axis=-1))
    return e / np.sum(e, axis=-1, keepdims=True)
