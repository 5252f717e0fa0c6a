"""formgrader's Autograde button grades a submission as ``course-grader grade`` does.

Stock, the button runs nbgrader's own autograde on ``submitted/<student>/<assignment>/``:
it grades a notebook only under its released name, so a renamed one ("my masking
(final).ipynb", which course-grader grades as the released notebook) is "Skipping
unknown notebook", then "No notebooks found", and nbgrader deletes the graded copy in
``autograded/<student>/<assignment>``, leaving formgrader's "needs autograding" beside a
grades.csv that says otherwise. It would also read the student's own timestamp.txt and
refuse a notebook with a copied test cell, which course-grader stages and grades.

Here the button runs ``course-grader grade`` for that one row (``grade_class`` with
that student and assignment), in a process of its own: the same staging, sandbox,
trusted submission time, gradebook rows, ``autograded/``, ``feedback/`` and grades.csv
as any grading run. A submission that cannot be graded keeps what was graded before
(course-grader writes a graded copy only in place of another), and the button's dialog
shows the row's one-line status.

nbgrader has no setting for what formgrader grades with (``NbGraderAPI.autograde``
builds nbgrader's ``Autograde``), so ``install()``, which nbgrader_config.py calls,
gives the API objects formgrader's handlers make this ``autograde``. It does so only in
a process where formgrader is loaded: every other reader of nbgrader_config.py (the
grading units themselves, nbgrader's commands) keeps nbgrader's own.

Run as ``python -m grader.formgrading COURSE_ROOT ASSIGNMENT STUDENT``: grade that row;
print its status; exit 0 when it was graded, 1 when not, 2 when grading could not start.
"""
from __future__ import annotations

import subprocess
import sys
from functools import partial
from pathlib import Path

_FORMGRADER = "nbgrader.server_extensions.formgrader.base"  # where formgrader's handlers make their API


def autograde(root: str, assignment_id: str, student_id: str, force: bool = True, create: bool = True) -> dict:
    """``NbGraderAPI.autograde``'s answer ({"success", "log", "error"}) for formgrader, from
    ``course-grader grade`` of one row of the course directory ``root``. ``force`` and
    ``create`` are nbgrader's; course-grader always regrades and adds the student."""
    where = Path(__file__).resolve().parent.parent  # `-m grader...` finds the package from here
    done = subprocess.run([sys.executable, "-m", "grader.formgrading", str(root), assignment_id, student_id],
                          cwd=where, capture_output=True, text=True)
    log = (done.stdout + done.stderr).strip()
    status = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if done.returncode == 0:
        return {"success": True, "log": log}
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    return {"success": False, "log": log,
            "error": status or (lines[-1] if lines else f"course-grader stopped (exit code {done.returncode})")}


def install() -> None:
    """Make formgrader's Autograde button run ``autograde`` (see the module); idempotent,
    and nothing in a process without formgrader."""
    base = sys.modules.get(_FORMGRADER)
    if base is None or getattr(base.BaseHandler.api.fget, "course_grader", False):
        return
    stock = base.BaseHandler.api.fget

    def api(handler):
        made = stock(handler)
        made.autograde = partial(autograde, made.coursedir.root)
        return made

    api.course_grader = True
    base.BaseHandler.api = property(api)


def _main(argv: list[str]) -> int:
    import warnings

    from .coursedir import CourseDir, CourseDirError
    from .grade import grade_class
    from .names import shown
    from .parallel import EngineUnavailable

    warnings.filterwarnings("ignore", module="nbgrader")  # as course-grader grade: its table is what counts
    warnings.filterwarnings("ignore", module="nbformat")
    root, assignment_id, student_id = argv
    try:
        rows = grade_class(CourseDir.open(root, create=False), assignments=[assignment_id], students=[student_id],
                           progress=False, jobs=1)
    except (EngineUnavailable, CourseDirError, RuntimeError, FileNotFoundError) as error:
        print(f"course-grader: {shown(error)}", file=sys.stderr)
        return 2
    [row] = [r for r in rows if (r.student_id, r.assignment_id) == (student_id, assignment_id)]
    print(f"{shown(student_id)} {shown(assignment_id)}: {row.score:g}/{row.max_score:g}, {shown(row.status)}")
    return 0 if row.status.startswith("graded") else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
