"""STAND-IN for the student environment (to be replaced at merge by the real
``tests/student_env.py``, which installs the student wheel ``attention-coursekit``).

Same API: ``student_env(extras) -> Path``, the python of a venv made from
``/usr/bin/python3.11`` (which every account can run, unlike the dev venv's pyenv
interpreter under /root), cached under ``out/envs/`` and keyed by a hash of its inputs.
This stand-in pip-installs the course's pins and, for the ``hub`` extra, jupyterhub, then
copies the repository's ``coursekit`` package into the venv's site-packages: no grader
package, no solutions. Known: matplotlib's course font may fail to load here (being fixed
with the real wheel; not fixed in this stand-in).
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

from grader import course
from hub.launch import EnvironmentMissing, build_venv, digest, pip  # noqa: F401  (EnvironmentMissing: raised)

PINS = ["jupyterlab==4.6.6", "nbgrader==0.9.6", "numpy==2.4.6", "matplotlib==3.11.2", "torch==2.13.0",
        "ipykernel==7.4.0"]
EXTRAS = {"hub": ["jupyterhub==6.1.1"]}


def student_env(extras: str = "") -> Path:
    """The student environment's python (STAND-IN, see the module's docs).

    Args:
        extras: comma-separated extras of the student wheel; "hub" adds jupyterhub.

    Raises:
        ValueError: an unknown extra.
        EnvironmentMissing: /usr/bin/python3.11 is not installed.
        subprocess.CalledProcessError: the venv could not be built (pip's error above it).
    """
    wanted = sorted(e.strip() for e in extras.split(",") if e.strip())
    unknown = [e for e in wanted if e not in EXTRAS]
    if unknown:
        raise ValueError(f"unknown extras {unknown}; known: {sorted(EXTRAS)}")
    pins = PINS + [p for e in wanted for p in EXTRAS[e]]
    key = digest(pins, [course.ROOT / "coursekit"])

    def install(prefix: Path) -> None:
        pip(prefix, *pins)
        site = next((prefix / "lib").glob("python3.*/site-packages"))
        shutil.copytree(course.ROOT / "coursekit", site / "coursekit",
                        ignore=shutil.ignore_patterns("__pycache__"))

    return build_venv("student" + "".join(f"-{e}" for e in wanted), key, install)


if __name__ == "__main__":
    print(student_env(*sys.argv[1:]))
