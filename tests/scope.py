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


def some_of_each(rows: list) -> list:
    """``rows`` of ((student, assignment), expected): all of them, or in a quick run each
    student's submissions in turn (the i-th student's i-th, wrapping round) and then the first
    row of any assignment no student was given, so every student and every assignment is kept."""
    if not QUICK:
        return rows
    students = sorted({key[0] for key, _ in rows})
    kept = []
    for i, student in enumerate(students):
        theirs = [row for row in rows if row[0][0] == student]
        kept.append(theirs[i % len(theirs)])
    covered = {key[1] for key, _ in kept}
    for row in rows:
        if row[0][1] not in covered:
            kept.append(row)
            covered.add(row[0][1])
    return [row for row in rows if row in kept]


# Assignments whose notebook, run in process, trains or decodes whole models: seconds of CPU
# for each submission judged or each cell run above a visible test. Those cases are `slow`
# (left to `make test`); the edit loop keeps every other assignment's.
COSTLY = ("09_transformer", "10_seq2seq_rnn", "12_gpt", "13_rope")


def slow_if_costly(assignment: str, *values, **kwargs):
    """``pytest.param(*values)``, marked `slow` when ``assignment`` is one of COSTLY."""
    import pytest

    return pytest.param(*values, marks=[pytest.mark.slow] if assignment in COSTLY else [], **kwargs)
