"""A judge that names a raised error or non-data answer by the call, not the function alone.

The default judgement (``_core.judge_case``) says "dot_variance raised ...". The checks of
notebooks 02-04 said which call it was ("dot_variance(q, k) for q and k of shape (7, 6)
raised ..."), which tells a learner more (a batch, a keyword, a mask without heads) and
shows no hidden value; ``by_call`` keeps that for an error that no rule of the spec explains.
"""
from __future__ import annotations

import re
from typing import Callable

from coursekit.protocol import Raised, Unsupported

from ._core import Case, judge_case, value


def _explained(case: Case) -> bool:
    message = getattr(case.answer, "message", "")
    return isinstance(case.answer, Raised) and any(
        re.search(rule.match, message) and (rule.when is None or rule.when(case.call)) for rule in case.spec.errors)


def by_call(judge: Callable[[Case], None] = judge_case) -> Callable[[Case], None]:
    """``judge``, after naming a raised error or non-data answer by its call.

    Raises:
        CheckFailed: the answer raised (NotImplementedError too) or is not data, and no
            error rule of the spec explains it; else whatever ``judge`` raises.
    """
    def judged(case: Case) -> None:
        if isinstance(case.answer, (Raised, Unsupported)) and not case.call.raises and not _explained(case):
            value(case.answer, case.what)
        judge(case)
    return judged
