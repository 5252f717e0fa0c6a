"""Which outcomes are graded again alone before they are recorded (grader.parallel.regrade_reason)."""
from __future__ import annotations

from grader.parallel import UnitLimits, regrade_reason

LIMITS = UnitLimits(busy_pressure=0.2)


def _outcome(tripped: int, pressure: float | None) -> dict:
    return {"status": "graded", "limits_tripped": tripped, "ran": {"cpu_pressure": pressure}}


def test_a_limit_tripped_beside_others_or_on_a_busy_machine_is_regraded():
    assert regrade_reason(_outcome(1, 0.0), True, LIMITS) == "other units ran beside it"
    assert regrade_reason(_outcome(2, 0.35), False, LIMITS) == \
        "the machine was busy (processes waited for a CPU 35% of the time)"
    late = "grading took longer than 420 s (staging, running and feedback together), so it was stopped"
    assert regrade_reason(late, True, LIMITS) == "other units ran beside it"


def test_a_limit_tripped_alone_on_a_quiet_machine_and_other_outcomes_stand():
    assert regrade_reason(_outcome(1, 0.05), False, LIMITS) is None  # the submission's own doing
    assert regrade_reason(_outcome(1, None), False, LIMITS) is None  # no PSI: alone is enough
    assert regrade_reason(_outcome(0, 0.9), True, LIMITS) is None  # no limit tripped: nothing to redo
    assert regrade_reason("the grader failed on this submission (ValueError: x)", True, LIMITS) is None
    assert regrade_reason(_outcome(1, 0.9), True, UnitLimits(regrade_alone=False)) is None
