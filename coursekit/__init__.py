"""Student-side helpers for Attention from Scratch: toy data, plots, seeding, visible tests.

This package is what a learner's notebook imports, and the student wheel (its own
pyproject.toml). It holds no solution and no hidden check (tests/test_release.py and, on
the built wheel, tests/test_student_package.py prove it); those live in ``solutions/``
and in the instructor-side ``grader`` package.
"""
import functools
import os
import platform
import random

import numpy as np

# The same arithmetic on every Intel x86-64 processor: torch's own kernels at AVX2 (a processor
# with AVX-512 would otherwise add its sums in other vector widths, and a model trained for
# hundreds of steps comes out different) and MKL's matrix products on its AVX2 code path
# (MKL_CBWR, Intel's conditional numerical reproducibility). MKL honours MKL_CBWR=AVX2 on Intel
# processors only: an AMD processor takes a path of its own (tests/test_training.py measures it
# on emulated processors), so its last digits may differ, as coursekit.training.arithmetic_note
# tells the learner.
# torch reads both at its first operation, so the notebooks import coursekit before they
# compute anything; coursekit.training.train warns when that came too late.
# ARITHMETIC is that environment (empty elsewhere: an ARM processor has no AVX2, and its
# numbers may differ slightly from the prose's, as coursekit.training.arithmetic_note says);
# the grader gives it to every kernel it starts.
ARITHMETIC = ({"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}
              if platform.machine().lower() in ("x86_64", "amd64") else {})
for _name, _value in ARITHMETIC.items():
    os.environ.setdefault(_name, _value)

__all__ = ["ARITHMETIC", "returns_tensor", "seed_everything"]


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
