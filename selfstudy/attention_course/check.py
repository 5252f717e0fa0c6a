"""Check my work in the self-learner's install: the hidden checks judge the functions this
kernel defines, offline, with no re-execution.

``coursekit.check.check_my_work()`` calls ``check_in_kernel`` when this package is installed
and the instructor's grading pipeline is not. Every exercise of the notebook's assignment is
judged as the course's check of one exercise judges it (``grader.kernelcheck.verdicts``:
this user's own questions, the same verdicts as the full check, a failing upstream function
blamed first, the course's time limit, the learner's output kept out and the kernel's random
generators left as they were), and said in the tutor's lines (``grader.tutortext``). The
assignments' points, grade ids and headings are read from the student notebooks this package
holds (``grader.course`` points there when there is no solutions/).
"""
from __future__ import annotations

from pathlib import Path

# One line under the first, as course-grader check says it: the visible tests are not the grade.
OTHER_INPUTS = ("The hidden checks try other inputs than the visible tests (they are never shown), so a "
                "notebook that passes its visible tests can still fail one here.")


def diagnoses(assignment_id: str, namespace: dict) -> dict[str, str | None]:
    """Exercise id -> None (the hidden checks pass) or the diagnosis, for every exercise of the
    assignment as ``namespace`` defines it; one it does not define is not answered.

    Raises:
        OSError: the user's data folder, where the secret lives, cannot be written.
    """
    from grader import checks, kernelcheck
    from grader.selfcheck import CannotCheck

    found: dict[str, str | None] = {}
    for exercise in kernelcheck.points_of(assignment_id):
        try:
            found[exercise] = kernelcheck.verdicts(namespace, exercise)[exercise]
        except CannotCheck:  # not defined in this kernel
            found[exercise] = f"{checks.get(exercise).function}: not answered yet, this kernel has not run its cell"
    return found


def check_in_kernel(path: Path, namespace: dict) -> str:
    """What the learner reads of the notebook at ``path``: per exercise pass or fail, the
    points, the diagnosis and a hint, then the score and what to revisit.

    Raises:
        OSError: the user's data folder, where the secret lives, cannot be written.
    """
    from grader import kernelcheck, tutortext
    from grader.names import shown
    from grader.selfcheck import CannotCheck, assignment_of

    path = Path(path)
    try:
        assignment_id = assignment_of(path)
    except CannotCheck as error:
        return f"check my work: {shown(error)}"
    most = kernelcheck.points_of(assignment_id)
    found = diagnoses(assignment_id, namespace)
    points = {e: p if found.get(e) is None else 0.0 for e, p in most.items()}
    comments = tutortext.comments(assignment_id, points, most, found)
    head = (f"Checked the functions this kernel defines for {path.name} ({assignment_id}) with the hidden checks "
            "(as this kernel last ran them: run a cell you changed before checking):")
    text = tutortext.as_text(comments, sum(points.values()), sum(most.values()))
    return "\n".join(shown(line) for line in [head, OTHER_INPUTS, "", *text.splitlines()])  # quotes learners' text
