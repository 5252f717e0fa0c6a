"""solutions/ -> notebooks/: the student versions, made by ``nbgrader generate_assignment``."""
from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path

import nbgrader.api
from alembic.script import ScriptDirectory
from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory
from nbgrader.dbutil import ALEMBIC_DIR

from . import course


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
    """Generate the student version of each assignment into ``release_dir/<id>/``.

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


def release(release_dir: Path = course.NOTEBOOKS) -> list[Path]:
    """Regenerate the student notebooks (``make release``); returns the notebooks written."""
    with tempfile.TemporaryDirectory() as scratch:
        generate(release_dir, f"sqlite:///{Path(scratch) / 'gradebook.db'}")
    return sorted(release_dir.glob("*/*.ipynb"))
