"""Check my work from inside JupyterLab: the last cell of every student notebook.

``check_my_work("01_similarity.ipynb")`` grades the notebook as last SAVED, with the
hidden checks, by running ``course-grader check`` in a separate process (the grading
pipeline starts its own sandboxed kernel; it does not run in this one). It prints
per exercise pass or fail, points, the diagnosis and a hint, then the score and what
to revisit. While nbgrader runs the notebook (autograding, the Validate button:
``NBGRADER_EXECUTION`` is set) it prints one line and does nothing else.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parents[1]


def _notebook(name: str | None) -> Path | None:
    """The notebook to check: the one this kernel was started for (JupyterLab tells the
    kernel its path in ``JPY_SESSION_NAME``), else ``name`` in the working folder."""
    session = os.environ.get("JPY_SESSION_NAME", "")
    if session.endswith(".ipynb") and Path(session).is_file():
        return Path(session)
    if name and Path(name).is_file():
        return Path(name).resolve()
    return None


def check_my_work(notebook: str | None = None) -> int | None:
    """Grade the saved notebook with the hidden checks and print the tutor's comments.

    Args:
        notebook: the notebook's file name, used when the kernel does not know its
            notebook (outside JupyterLab); the kernel's own notebook comes first.

    Returns:
        The checker's exit code (0: graded), or None when nothing was checked.
        Never raises: every problem is one printed line saying what to do.
    """
    if os.environ.get("NBGRADER_EXECUTION"):
        print("check my work: skipped while this notebook is graded or validated")
        return None
    path = _notebook(notebook)
    if path is None:
        print(f"check my work: cannot find the notebook {notebook or ''} here: save it (Ctrl-S) and run "
              "`make check NOTEBOOK=path/to/it.ipynb` in the course folder")
        return None
    print(f"Checking the saved {path.name} (about 15 s; unsaved changes are not seen)...", flush=True)
    try:
        done = subprocess.run([sys.executable, "-m", "grader.cli", "check", str(path)], cwd=COURSE_ROOT,
                              capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        print(f"check my work: the checker did not run ({error}); try `make check NOTEBOOK={path}`")
        return None
    if done.stdout:
        print(done.stdout, end="")
    if done.returncode == 2 or not done.stdout:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        print(lines[-1] if lines else f"check my work: the checker stopped (exit code {done.returncode})")
    return done.returncode
