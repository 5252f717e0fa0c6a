"""solutions/ -> notebooks/: the student versions, made by ``nbgrader generate_assignment``.

``make release`` writes them into notebooks/ (committed); nbgrader's own
``generate_assignment`` writes the same notebooks into release/ (its release directory,
git-ignored), which ``release_assignment`` hands out, so no nbgrader command touches a
committed file.
"""
from __future__ import annotations

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
    the course's generate_assignment preprocessors (nbgrader_config.py).

    Registers the assignments (cells, points, checksums) in the gradebook at
    ``db_url``, which autograding needs.

    Raises:
        RuntimeError: nbgrader failed on an assignment; its log is in the message.
    """
    config = course.load_config()
    config.CourseDirectory.release_directory = str(release_dir)
    config.CourseDirectory.db_url = db_url
    api = nbgrader_api(config)
    for assignment_id in assignment_ids or course.assignments():
        result = api.generate_assignment(assignment_id, force=True, create=True)
        if not result["success"]:
            raise RuntimeError(f"nbgrader generate_assignment {assignment_id} failed:\n"
                               f"{result.get('error', '')}\n{result.get('log', '')}")


CHECK_MARKDOWN = ("## Check my work\n\n"
                  "Save the notebook (**Ctrl-S**), then run the cell below. It grades the saved notebook "
                  "with the hidden checks (on your machine, or on the course's check service on a hub) and prints for each exercise whether it "
                  "passed, what went wrong and a hint, then your score and what to revisit. "
                  "(The same from a terminal: `make check NOTEBOOK=path/to/this.ipynb`.)")


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
        nb.cells += [nbformat.v4.new_markdown_cell(CHECK_MARKDOWN, id="check-my-work-markdown"),
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
