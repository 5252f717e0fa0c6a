"""solutions/ -> notebooks/: the student versions, made by ``nbgrader generate_assignment``.

``make release`` writes them into notebooks/ (committed); nbgrader's own
``generate_assignment`` writes the same notebooks into release/ (its release directory,
git-ignored), which ``release_assignment`` hands out, so no nbgrader command touches a
committed file.
"""
from __future__ import annotations

import datetime
import functools
import os
import sys
import tempfile
from pathlib import Path

import nbformat
import nbgrader.api
from alembic.script import ScriptDirectory
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from nbgrader.dbutil import ALEMBIC_DIR
from nbgrader.preprocessors.base import NbGraderPreprocessor
from sqlalchemy.engine import make_url
from traitlets import Bool

from . import assembled, course


@functools.cache
def _alembic_head() -> str:
    """The revision nbgrader stamps on a new gradebook, read from its own alembic scripts."""
    return ScriptDirectory(ALEMBIC_DIR).get_current_head()


# nbgrader 0.9.6 asks a new `alembic heads` subprocess for this revision each time it
# creates a gradebook: 3 s, paid by the collector and by every grading worker. Alembic's
# Python API gives the same answer from the same scripts in 0.05 s.
nbgrader.api.get_alembic_version = _alembic_head


def use_this_environment() -> None:
    """Put this environment's bin/ first on PATH: nbgrader starts kernels by name, and
    they must come from this environment even when it is not activated
    (`.venv/bin/course-grader`)."""
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def nbgrader_api(config) -> NbGraderAPI:
    """An nbgrader API object whose course directory follows ``config``."""
    use_this_environment()
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def generate(release_dir: Path, db_url: str, assignment_ids: list[str] | None = None) -> None:
    """Generate the student version of each assignment into ``release_dir/<id>/``, with
    the course's generate_assignment preprocessors (nbgrader_config.py), the release-order
    check (``ReleaseOrder``) left out: the callers are grading, which registers an
    assignment that is already out, and ``release``, which checks the course's gradebook
    itself before (``generate`` registers each assignment without a due date, so it would
    count as open).

    Registers the assignments (cells, points, checksums) in the gradebook at
    ``db_url``, which autograding needs.

    Raises:
        RuntimeError: nbgrader failed on an assignment; its log is in the message.
    """
    config = course.load_config()
    config.CourseDirectory.release_directory = str(release_dir)
    config.CourseDirectory.db_url = db_url
    config.ReleaseOrder.enabled = False
    api = nbgrader_api(config)
    for assignment_id in assignment_ids or course.assignments():
        result = api.generate_assignment(assignment_id, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment {assignment_id} failed:\n"
                               f"{result.get('error', '')}\n{result.get('log', '')}")


class ReleaseRefused(RuntimeError):
    """A notebook would hand out the answers of an assignment that is still open; the
    message says which, until when, and how to release it anyway."""


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)  # the gradebook's naive UTC


def open_assignments(db_url: str, assignment_ids, now: datetime.datetime | None = None
                     ) -> tuple[dict[str, datetime.datetime | None], list[str]]:
    """Those of ``assignment_ids`` that are open in the gradebook at ``db_url``: in it, and
    without a due date, or with one (or a student's extension) still to come at ``now``
    (naive UTC, as nbgrader keeps dates; default: now), each -> the last due date of its
    students (None when it has none); and those not in the gradebook at all (not assigned,
    so not open). A SQLite gradebook that does not exist holds none (it is not created).

    Raises:
        sqlalchemy.exc.SQLAlchemyError: the gradebook cannot be read.
    """
    url = make_url(db_url)
    if url.drivername.startswith("sqlite") and url.database and not Path(url.database).exists():
        return {}, list(assignment_ids)
    now = now or _utc_now()
    found, absent = {}, []
    with nbgrader.api.Gradebook(db_url) as gb:
        for assignment_id in assignment_ids:
            try:
                assignment = gb.find_assignment(assignment_id)
            except nbgrader.api.MissingEntry:
                absent.append(assignment_id)
                continue
            if assignment.duedate is None:
                found[assignment_id] = None
                continue
            last = max([assignment.duedate] + [s.duedate for s in assignment.submissions if s.duedate])
            if last > now:
                found[assignment_id] = last
    return found, absent


def release_order(assignment_id: str, db_url: str, force: bool = False,
                  now: datetime.datetime | None = None) -> str | None:
    """Whether ``assignment_id`` may be handed out now: its read-only cells copy the answers
    of the assignments ``grader.assembled.answers_copied`` names, and none of those may be
    open in the gradebook at ``db_url`` (``open_assignments``). Returns the line that tells
    the instructor which assignments it copies (None when it copies none).

    Raises:
        ReleaseRefused: one of them is open and ``force`` is False.
    """
    copied = assembled.answers_copied(assignment_id)
    if not copied:
        return None
    still_open, absent = open_assignments(db_url, copied, now)
    names = ", ".join(f"{a} ({len(cells)} cell{'s' * (len(cells) > 1)})" for a, cells in copied.items())
    note = f"{assignment_id}: its read-only cells hold the answers of {names}"
    if not still_open:
        closed = [a for a in copied if a not in absent]
        return note + ": " + "; ".join(
            ([f"{', '.join(closed)} closed in the gradebook"] if closed else [])
            # not assigned in this gradebook: assigned after this release, their answers are out
            + ([f"{', '.join(absent)} not in the gradebook (assign them before this, not after)"] if absent else []))
    until = "; ".join(f"{a} {'has no due date' if due is None else f'is due {due:%Y-%m-%d %H:%M} UTC'}"
                      for a, due in still_open.items())
    if force:
        return f"{note}: forced, while {until}"
    raise ReleaseRefused(f"not releasing {assignment_id}: its read-only cells hold the answers of "
                         f"{', '.join(still_open)}, still open in the gradebook ({until}); release it once "
                         "they are closed (past their due dates and students' extensions), or force it "
                         "(course-grader release --force, nbgrader generate_assignment --ReleaseOrder.force=True)")


class ReleaseOrder(NbGraderPreprocessor):
    """Refuse to generate a notebook whose read-only cells hand out the answers of an
    assignment still open in the course's gradebook (``release_order``): the first of
    ``nbgrader generate_assignment``'s preprocessors (nbgrader_config.py), so formgrader's
    Generate button refuses too, with the reason as the first line of its log. Otherwise it
    logs which earlier assignments the notebook copies."""

    force = Bool(False, help="Generate even while an assignment whose answers the notebook's "
                             "read-only cells copy is open.").tag(config=True)

    def preprocess(self, nb, resources):
        info = resources["nbgrader"]
        try:
            note = release_order(info["assignment"], info["db_url"], self.force)
        except ReleaseRefused as refused:
            self.log.error("%s", refused)
            raise
        if note:
            self.log.warning("%s", note)
        return nb, resources


CHECK_MARKDOWN = ("## Check my work\n\n"
                  "Run the cell below. It checks your work with the hidden checks and prints for each exercise "
                  "whether it passed, what went wrong and a hint, then your score and what to revisit.\n\n"
                  "- In a class (on the course's hub, or with the package your instructor gave you) and in a "
                  "clone of the course, it grades the notebook as last saved: save it first (**Ctrl-S**). "
                  "From a terminal in a clone: `make check NOTEBOOK=path/to/this.ipynb`.\n"
                  "- With the self-learner's package (`attention-course`), it judges the functions your "
                  "kernel defines now: run your cells first (**Run > Run All Cells**).")


def one_exercise_markdown(function: str) -> str:
    """The paragraph under CHECK_MARKDOWN on checking one exercise in the kernel
    (``check_my_work("name")``, grader.kernelcheck), with the notebook's first function."""
    return ("**One exercise, in seconds.** In a self-learner's install of the course (one that has its hidden "
            f'checks), a cell with `from coursekit.check import check_my_work; check_my_work("{function}")` checks '
            f"`{function}` (or any other exercise, by its function's or class's name) as your kernel defines it "
            "now: the same hidden checks and the same lines for it, without saving or re-running the notebook. "
            "In a class it says in one line that the cell below is the check.")


def check_cell_source() -> str:
    """The code of the check-my-work cell that ends every student notebook. It names no
    notebook: the cell finds the one it runs in, so a renamed copy checks itself."""
    return "from coursekit.check import check_my_work\ncheck_my_work()"


class AddCheckCells(NbGraderPreprocessor):
    """End a student notebook with the check-my-work cells (``coursekit.check``): the last
    of ``nbgrader generate_assignment``'s preprocessors (nbgrader_config.py).

    They are ordinary cells, unknown to the gradebook (no nbgrader metadata): nbgrader runs
    them like any cell a student adds, and the code cell only prints one line while
    nbgrader runs it. Their ids are fixed, so a fresh release equals the committed one.
    """

    def preprocess(self, nb, resources):
        first = next((c.metadata.nbgrader["grade_id"].split("-", 1)[1] for c in nb.cells
                      if c.get("metadata", {}).get("nbgrader", {}).get("solution")
                      and "-" in c.metadata.nbgrader.get("grade_id", "")), None)
        text = CHECK_MARKDOWN + (f"\n\n{one_exercise_markdown(first)}" if first else "")
        nb.cells += [nbformat.v4.new_markdown_cell(text, id="check-my-work-markdown"),
                     nbformat.v4.new_code_cell(check_cell_source(), id="check-my-work-code")]
        return nb, resources


def release(release_dir: Path = course.NOTEBOOKS, update_sources: bool = True,
            db_url: str | None = None) -> list[Path]:
    """Regenerate the student notebooks (``make release``): what ``nbgrader
    generate_assignment`` writes into release/, written into notebooks/ instead; returns
    the notebooks written. The assignments are registered in the gradebook at ``db_url``
    (the tests keep it to restore cells from), by default a throwaway one.

    First, with ``update_sources``, the assembled cells of solutions/ (notebook 09's helpers,
    ``grader/assembled.py``) are rewritten from the cells they copy, so that nbgrader copies
    them as they are now. The tests pass False: they must find stale sources, not fix them.

    Raises:
        RuntimeError: nbgrader failed on an assignment (``generate``).
        KeyError: an assembled cell names a cell or definition that no longer exists.
    """
    if update_sources:
        assembled.update_sources()
    with tempfile.TemporaryDirectory() as scratch:
        generate(release_dir, db_url or f"sqlite:///{Path(scratch) / 'gradebook.db'}")
    return sorted(release_dir.glob("*/*.ipynb"))
