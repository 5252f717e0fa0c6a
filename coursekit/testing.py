"""Helpers for the visible tests: readable asserts that say what was expected."""
from __future__ import annotations

import numpy as np


def as_numpy(x: object) -> np.ndarray:
    """A numpy float64 copy of a numpy array, torch tensor, number or nested list."""
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.array(x, dtype=np.float64)


def assert_shape(actual: object, shape: tuple, what: str) -> None:
    """Fail with a message naming ``what`` unless ``actual`` has exactly ``shape``."""
    got = as_numpy(actual).shape
    assert got == tuple(shape), f"{what}: expected shape {tuple(shape)}, got {got}"


def assert_close(actual: object, expected: object, what: str, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Fail with both values in the message unless ``actual`` matches ``expected``."""
    got, want = as_numpy(actual), as_numpy(expected)
    assert got.shape == want.shape, f"{what}: expected shape {want.shape}, got {got.shape}"
    assert np.allclose(got, want, rtol=rtol, atol=atol), (
        f"{what}: expected\n{np.round(want, 4)}\ngot\n{np.round(got, 4)}")
