"""Helpers for the visible tests: readable asserts that say what was expected.

A failed ``assert_close`` prints both arrays, capped at a few rows (a (2, 5, 12) array is
summarized with ``...``), and where they differ most. Two keywords make it say more:

- ``mistakes={"the ReLU is missing": [[0.5, -2.0]], ...}``: the answers known mistakes give
  on this very case; an answer that matches one is told which mistake it is. A test runs
  each described mistake and checks that it gives these numbers (tests/test_visible_hints.py),
  so no hint can name the wrong mistake.
- ``uses=("split_heads",)``: the earlier functions of yours that this check also runs; the
  message then says to make their own tests pass first, since a wrong ``split_heads`` makes
  a correct ``merge_heads`` fail here too.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

# at most this many numbers of an array in a message; larger ones show their corners
SHOWN = dict(threshold=24, precision=4, suppress=True, linewidth=100)


def as_numpy(x: object) -> np.ndarray:
    """A numpy float64 copy of a numpy array, torch tensor, number or nested list."""
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.array(x, dtype=np.float64)


def shown(x: np.ndarray) -> str:
    """``x`` as numpy prints it, rounded to 4 digits and capped at a few rows."""
    with np.printoptions(edgeitems=2 if x.ndim <= 2 else 1, **SHOWN):
        return np.array2string(np.round(x, 4))


def upstream_note(uses: Sequence[str]) -> str:
    """The line that names the earlier functions a check also runs ("" for none)."""
    if not uses:
        return ""
    names = uses[0] if len(uses) == 1 else ", ".join(uses[:-1]) + " and " + uses[-1]
    them, tests = ("it", "its own test fails") if len(uses) == 1 else ("them", "their own tests fail")
    return (f"\nThis check also runs your {names} (directly, or in your code that calls {them}): "
            f"if {tests}, fix {names} first.")


def assert_shape(actual: object, shape: tuple, what: str, *, uses: Sequence[str] = ()) -> None:
    """Fail with a message naming ``what`` unless ``actual`` has exactly ``shape``."""
    got = as_numpy(actual).shape
    assert got == tuple(shape), f"{what}: expected shape {tuple(shape)}, got {got}" + upstream_note(uses)


def _close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> bool:
    return got.shape == want.shape and bool(np.allclose(got, want, rtol=rtol, atol=atol))


def assert_close(actual: object, expected: object, what: str, rtol: float = 1e-4, atol: float = 1e-5, *,
                 mistakes: Mapping[str, object] | None = None, uses: Sequence[str] = ()) -> None:
    """Fail unless ``actual`` matches ``expected`` (numpy's allclose with ``rtol``, ``atol``).

    The message holds ``what``, both values (capped), the largest difference and its index,
    the known mistake that gives exactly ``actual`` (``mistakes``: description -> the value
    it gives here) and the earlier functions this check also runs (``uses``).
    """
    got, want = as_numpy(actual), as_numpy(expected)
    if _close(got, want, rtol, atol):
        return
    if got.shape != want.shape:
        message = f"{what}: expected shape {want.shape}, got {got.shape}"
    else:
        message = f"{what}: expected\n{shown(want)}\ngot\n{shown(got)}"
        if got.size > 1:
            gap = np.abs(got - want)
            where = np.unravel_index(np.nanargmax(np.where(np.isnan(gap), np.inf, gap)), gap.shape)
            message += (f"\nlargest difference at index {tuple(int(i) for i in where)}: "
                        f"expected {want[where]:.4g}, got {got[where]:.4g}")
    for description, value in (mistakes or {}).items():
        if _close(got, as_numpy(value), rtol, atol):
            message += f"\nThat is the answer you get when {description}."
            break
    raise AssertionError(message + upstream_note(uses))
