"""A unit of work past its deadline becomes a row's reason, and its worker is restarted."""
from __future__ import annotations

import time

import pytest

from grader.parallel import Unit, run

pytestmark = pytest.mark.kernel


def test_a_unit_past_its_deadline_is_stopped_and_the_batch_goes_on():
    def work(files, student_id, assignment_id, settings):  # a closure: sent to the worker by value
        import os
        import time

        if student_id == "slow":
            time.sleep(600)  # stands in for a unit that never ends (60,000 cells, a stuck step)
        return {"student_id": student_id, "pid": os.getpid()}

    units = [Unit("slow", "01_similarity", "", None), Unit("quick", "01_similarity", "", None)]
    started = time.monotonic()
    outcomes = {u.student_id: o for u, o in run(units, jobs=1, progress=False, deadline=3, work=work)}
    elapsed = time.monotonic() - started
    assert outcomes["slow"] == ("grading took longer than 3 s (staging, running and feedback together), "
                                "so it was stopped")
    assert outcomes["quick"]["student_id"] == "quick"  # ran on the restarted worker
    assert elapsed < 60, elapsed


def test_a_unit_that_tripped_a_limit_beside_others_is_graded_again_alone():
    """Issue 32 (failure 9): a time limit tripped while another unit ran beside it is not
    recorded as it is: the unit is graded again with nothing else running, and only that
    outcome comes back, saying so. The others come back once each, as they were."""
    def work(files, student_id, assignment_id, settings):
        import time

        began = time.time()
        time.sleep(0.5)
        return {"student_id": student_id, "status": "graded", "began": began, "ended": time.time(),
                "limits_tripped": int(student_id == "tripper"), "ran": {"cpu_pressure": 0.0}}

    units = [Unit(name, "01_similarity", "", None) for name in ("a", "tripper", "b", "c")]
    outcomes = [(u.student_id, o) for u, o in run(units, jobs=2, progress=False, deadline=0, work=work)]
    assert sorted(name for name, _ in outcomes) == ["a", "b", "c", "tripper"]  # each once
    got = dict(outcomes)
    assert got["tripper"]["status"] == "graded; regraded alone: a time limit tripped while other units ran beside it"
    assert [got[n]["status"] for n in "abc"] == ["graded"] * 3
    again = got["tripper"]
    overlapping = [n for n in "abc" if got[n]["began"] < again["ended"] and again["began"] < got[n]["ended"]]
    assert overlapping == [], f"the regrade ran beside {overlapping}"
