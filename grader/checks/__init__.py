"""The check library behind the hidden tests.

A hidden test cell in ``solutions/`` is one line::

    from grader.checks import check; check("similarity-dot_product", dot_product)

``check`` runs the exercise's check on inputs the grader chooses and raises
:class:`CheckFailed` with a diagnosis (the likely mistake and where to look) when the
learner's answer is wrong. The checks for exercise ``<topic>-<name>`` live in
``grader/checks/<topic>.py``; importing that module registers them.
"""
from ._core import CheckFailed, check, exercise_ids

__all__ = ["CheckFailed", "check", "exercise_ids"]
