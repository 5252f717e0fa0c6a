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
