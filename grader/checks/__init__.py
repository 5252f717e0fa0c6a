"""The check library behind the hidden tests: each exercise is a spec (``Spec``).

A hidden test cell in ``solutions/`` is one line::

    from grader.checks import check; check("similarity-dot_product", dot_product)

``check`` runs the exercise's check on inputs the grader chooses and raises
:class:`CheckFailed` with a diagnosis (the likely mistake and where to look) when the
learner's answer is wrong. The specs of exercise ``<topic>-<name>`` are listed in
``SPECS`` of ``grader/checks/<topic>.py``; their references are in
``grader/checks/reference/<topic>.py``.

The public API, for the grading preprocessors (``grader.verify``), the tutor and the
tests: ``questions(id, seed)`` are the calls sent into the kernel (the graded ones, then
the probes' diagnostic ones), ``verdict(id, seed, answers)`` judges the decoded answers, ``with_upstream`` blames an upstream exercise,
``answers_of`` collects a function's answers in process, ``get`` and ``exercise_ids``
find specs.
"""
from coursekit.protocol import Raised, Unsupported

from ._core import (Call, Case, CheckFailed, Hint, Knob, Mistake, Probe, Raises, Rule, Spec, answers_of, check,
                    exercise_ids, get, judge_case, public_seed, questions, verdict, with_upstream)

__all__ = ["Call", "Case", "CheckFailed", "Hint", "Knob", "Mistake", "Probe", "Raised", "Raises", "Rule", "Spec",
           "Unsupported", "answers_of", "check", "exercise_ids", "get", "judge_case", "public_seed",
           "questions", "verdict", "with_upstream"]
