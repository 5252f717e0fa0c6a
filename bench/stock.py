"""Stock nbgrader, as the benchmarks run it: its default preprocessors in a workspace of its own.

The hidden checks run inside the student's kernel, with no sandbox; the submissions are
staged as ours are (grader.stage.stage), so that stock finds renamed notebooks too. Each
cell has the course's wall-clock limit per cell (``BudgetedExecute.cell_wall_seconds``:
ours counts CPU time, with this as its backstop), not nbgrader's default.
"""
from __future__ import annotations

from pathlib import Path

from traitlets.config import Config

from grader import course
from grader.execute import BudgetedExecute
from grader.release import generate, nbgrader_api
from grader.stage import stage


def stock_workspace(work: Path, assignment_id: str, submissions: dict[str, Path]):
    """nbgrader's API on a fresh workspace at ``work`` with ``submissions`` (student -> folder)
    staged; call ``grade_one(api, assignment_id, student)`` to grade one of them."""
    work.mkdir(parents=True)
    config = Config()
    config.CourseDirectory.root = str(course.ROOT)
    config.CourseDirectory.source_directory = str(course.SOLUTIONS)
    for step in ("release", "submitted", "autograded", "feedback"):
        setattr(config.CourseDirectory, f"{step}_directory", str(work / step))
    config.CourseDirectory.db_url = f"sqlite:///{work / 'gradebook.db'}"
    config.Execute.kernel_name = "python3"
    # the course's per-cell wall-clock limit (nbgrader's default is 30 s): like with like, so
    # that a sleeping cell costs stock what it may cost ours (ours also has CPU limits and a
    # notebook budget)
    ours = course.load_config()
    config.Execute.timeout = BudgetedExecute(config=ours).cell_wall_seconds()
    config.Execute.interrupt_on_timeout = ours.Execute.interrupt_on_timeout
    # no history database and no kernel log chatter: as quiet as our sandboxed kernels
    config.Execute.extra_arguments = ["--HistoryManager.hist_file=:memory:", "--IPKernelApp.log_level=ERROR"]
    generate(work / "release", config.CourseDirectory.db_url, [assignment_id])
    for student, folder in submissions.items():
        stage(folder, work / "submitted" / student / assignment_id, course.notebook_names(assignment_id), None)
    return nbgrader_api(config)


def grade_one(api, assignment_id: str, student: str) -> None:
    """Autograde one staged submission and generate its feedback, as an instructor would."""
    result = api.autograde(assignment_id, student, force=True, create=True)
    assert result["success"], result.get("log")
    api.generate_feedback(assignment_id, student, force=True)
