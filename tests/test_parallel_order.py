"""Units are handed out longest assignment first, one more than the workers run at once."""
from __future__ import annotations

import pytest

from grader.parallel import Unit, run

pytestmark = pytest.mark.kernel


def test_the_assignment_that_took_longest_so_far_goes_first():
    def work(files, student_id, assignment_id, settings):  # a closure: sent to the worker by value
        import time

        began = time.time()
        time.sleep(0.6 if assignment_id == "long" else 0.05)
        return {"student_id": student_id, "began": began, "timings": {"total": time.time() - began}}

    given = [Unit(f"{a}{n}", a, "", None) for n, a in enumerate(["short", "long", "short", "short", "long", "long"])]
    outcomes = [o for _, o in run(given, jobs=1, progress=False, deadline=0, work=work)]
    order = [o["student_id"] for o in sorted(outcomes, key=lambda o: o["began"])]
    assert sorted(order) == sorted(u.student_id for u in given)  # each once
    # the first of each assignment in the given order (nothing timed yet; two in Dask at
    # once with one worker), then the untimed long one, then by the time each took
    assert order == ["short0", "long1", "long4", "long5", "short2", "short3"], order


def test_a_unit_never_waits_behind_a_long_one_on_a_busy_worker(tmp_path):
    """With two workers, one held by a unit that ends only when all the others have run, all
    the others run (on the other worker): none stays queued behind the held one."""
    def work(files, student_id, assignment_id, settings):
        import os
        import time
        from pathlib import Path

        if student_id == "held":  # ends when the six others are done (or after 120 s: then one waited)
            deadline = time.monotonic() + 120
            while len(list(Path(files).iterdir())) < 6 and time.monotonic() < deadline:
                time.sleep(0.05)
            return {"student_id": student_id, "pid": os.getpid(), "others": len(list(Path(files).iterdir()))}
        (Path(files) / student_id).touch()
        return {"student_id": student_id, "pid": os.getpid()}

    given = [Unit("held", "a", str(tmp_path), None)] + [Unit(f"quick{n}", "a", str(tmp_path), None) for n in range(6)]
    outcomes = {o["student_id"]: o for _, o in run(given, jobs=2, progress=False, deadline=0, work=work)}
    held = outcomes.pop("held")
    assert held["others"] == 6, (held, outcomes)
    assert set(outcomes) == {f"quick{n}" for n in range(6)}
