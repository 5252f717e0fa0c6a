"""solutions/ -> notebooks/: the student versions, made by ``nbgrader generate_assignment``."""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from nbgrader.apps import NbGraderAPI
from nbgrader.coursedir import CourseDirectory

from . import course


def use_this_environment() -> None:
    """Put this environment's bin/ first on PATH: nbgrader runs the `alembic` command
    (when it creates a gradebook) and starts kernels by name, and both must come from
    this environment even when it is not activated (`.venv/bin/course-grader`)."""
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
