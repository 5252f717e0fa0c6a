"""How much breadth a run covers. `make test` covers all of it; `make test-fast` (the edit
loop, COURSE_TEST_QUICK=1) keeps every kind of test but draws less of each: one student seed
where a test draws many, and one recorded submission per student and per assignment of the
sample class instead of all. A quick pass is not a pass of `make test`."""
from __future__ import annotations

import os

QUICK = os.environ.get("COURSE_TEST_QUICK") == "1"


def student_seeds(n: int) -> range:
    """The student seeds a test draws: all ``n``, or the last one in a quick run."""
    return range(n - 1, n) if QUICK and n else range(n)


def some_of_each(keys: list) -> list:
    """``keys`` of (student, assignment), all of them, or in a quick run a diagonal: each
    student's k-th assignment in turn, so every student and every assignment is kept."""
    if not QUICK:
        return keys
    students = sorted({k[0][0] for k in keys})
    assignments = sorted({k[0][1] for k in keys})
    kept = {(students[i % len(students)], assignments[i % len(assignments)])
            for i in range(max(len(students), len(assignments)))}
    return [k for k in keys if k[0] in kept]
