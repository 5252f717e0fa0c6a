"""Student-side helpers for Attention from Scratch: toy data, plots, seeding, visible tests.

This package is what a learner's notebook imports, and the student wheel (its own
pyproject.toml). It holds no solution and no hidden check (tests/test_release.py and, on
the built wheel, tests/test_student_package.py prove it); those live in ``solutions/``
and in the instructor-side ``grader`` package.
"""
import random

import numpy as np

__all__ = ["seed_everything"]


def seed_everything(seed: int = 0) -> None:
    """Seed Python's, numpy's legacy and (if imported) torch's random generators."""
    random.seed(seed)
    np.random.seed(seed)
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
