"""Student-side helpers for Attention from Scratch: toy data, plots, seeding, visible tests.

This package is what a learner's notebook imports, and the student wheel (its own
pyproject.toml). It holds no solution and no hidden check (tests/test_release.py and, on
the built wheel, tests/test_student_package.py prove it); those live in ``solutions/``
and in the instructor-side ``grader`` package.
"""
import functools
import random

import numpy as np

__all__ = ["returns_tensor", "seed_everything"]


def seed_everything(seed: int = 0) -> None:
    """Seed Python's, numpy's legacy and (if imported) torch's random generators."""
    random.seed(seed)
    np.random.seed(seed)
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def returns_tensor(function, dtype=None):
    """``function``, with its result made a torch tensor (of ``dtype``, when given).

    Notebook 09 builds its model from the solutions of earlier notebooks as they are; those
    of notebooks 03 and 05 return numpy arrays, and the model needs tensors.

    Raises:
        TypeError or RuntimeError (from ``torch.as_tensor``), when the wrapped function
        returns something that is not array-like.
    """
    import torch

    @functools.wraps(function)
    def tensor_function(*args, **kwargs):
        return torch.as_tensor(function(*args, **kwargs), dtype=dtype)

    return tensor_function
