"""The course's two environments on a hub, as cached venvs.

* ``student_env(extras)``: the student package as a learner or a hub's student gets it,
  the wheel built from coursekit/ (``build_wheel``, as ``make wheel`` builds it) installed
  with its pinned dependencies into a clean venv: no grader package, no solutions.
* ``instructor_env()``: this repository installed editable (``course-grader``, nbgrader
  with formgrader, the course's configuration) and the hub's jupyterhub.

Both are made from Debian's ``/usr/bin/python3.11``, which every account can run (the dev
venv's interpreter under /root cannot be), and are world-readable inside (the instructor's
sits in the checkout, which the course hub closes to every account but the instructor's:
hub/launch.py's ``closed_checkout``). Each is cached as
``<name>-<key>``, keyed by what goes into it (the wheel's bytes, the extras and the
interpreter; this checkout's path, pyproject.toml and constraints.txt), so that torch is installed once;
two processes asking for the same venv take turns on a lock file and the second reuses
the first's. The student venv depends on nothing of the checkout but the wheel, so it is
kept once per machine, outside any clone (``STUDENT_ENVS``: $ATTENTION_COURSE_ENVS, else,
as root, /var/cache/attention-from-scratch/envs), and a fresh clone reuses it; the
instructor's, an editable install of one checkout, is kept in that checkout's ``out/envs/``.
``python -m hub.environments [--extras hub]`` (``make student-env``) builds the student
venv ahead of the tests and prints its Python.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "out"
ENVS = OUT / "envs"  # the instructor's venv: an editable install of this checkout


MACHINE_CACHE = Path("/var/cache/attention-from-scratch")


def machine_folder(name: str, variable: str) -> Path:
    """Where things that depend only on their content are kept for the whole machine (see
    the module's docs): $``variable``, else, as root, MACHINE_CACHE/``name``, else this
    checkout's out/``name``. The suite keeps its notebook runs there too (tests/runs.py)."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    return MACHINE_CACHE / name if os.geteuid() == 0 else OUT / name


STUDENT_ENVS = machine_folder("envs", "ATTENTION_COURSE_ENVS")
INTERPRETER = Path("/usr/bin/python3.11")
HUB_PIN = "jupyterhub==6.1.1"  # the same hub in every environment: the single-user servers talk to it
WHEEL_GLOB = "attention_coursekit-*-py3-none-any.whl"
COMPLETE = ".complete"  # written last: a venv without it was interrupted and is rebuilt
# what a build leaves in a source folder; never part of the wheel's input
BUILD_LEFTOVERS = ("build", "dist", "*.egg-info", "__pycache__", ".ipynb_checkpoints")
# the dev session's variables that would let a clean venv import the checkout instead of what it installed
LEAKY = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYTHONSAFEPATH")


class EnvironmentMissing(RuntimeError):
    """Something an environment is built from is not installed; the message says how to install it."""


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the variables that point Python at the checkout
    (pip's configuration, e.g. where the torch CPU wheel is, stays), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def pip(prefix: Path, *args: str) -> None:
    """``pip install ARGS`` into the venv at ``prefix``.

    Raises:
        RuntimeError: pip failed (its output is in the message).
    """
    _run(str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-input", *args)


def build_venv(name: str, key: str, install: Callable[[Path], None], envs: Path = ENVS) -> Path:
    """The venv ``<envs>/<name>-<key>`` made from ``INTERPRETER`` and filled by
    ``install(prefix)``, unless a complete one is there; returns its python. Everything in
    it, and the folders above it, are world-readable (other accounts run it).

    Raises:
        EnvironmentMissing: /usr/bin/python3.11 with venv and ensurepip is not installed.
        RuntimeError: venv or pip failed (the tool's output is in the message).
    """
    if not INTERPRETER.is_file() or subprocess.run([str(INTERPRETER), "-c", "import venv, ensurepip"],
                                                   capture_output=True).returncode:
        raise EnvironmentMissing(f"{INTERPRETER} with venv and ensurepip is needed: "
                                 "run `apt-get install python3.11 python3.11-venv`")
    envs.mkdir(parents=True, exist_ok=True)
    for folder in (envs.parent, envs):
        folder.chmod(folder.stat().st_mode | 0o755)
    prefix = envs / f"{name}-{key}"
    if not (prefix / COMPLETE).is_file():
        with open(envs / f".{name}-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            if not (prefix / COMPLETE).is_file():
                shutil.rmtree(prefix, ignore_errors=True)  # half-built by a killed run
                _run(str(INTERPRETER), "-m", "venv", str(prefix))
                install(prefix)
                _run("chmod", "-R", "a+rX", str(prefix))
                (prefix / COMPLETE).write_text(f"{name} {key}\n")
                os.chmod(prefix / COMPLETE, 0o644)
    return prefix / "bin" / "python"


# ------------------------------------------------------------------------------ the student's

def build_wheel(dest: Path) -> Path:
    """Build the student wheel from coursekit/ into the folder ``dest`` (created if missing).

    The build runs in a copy of coursekit/ without build leftovers, so a stale
    ``coursekit/build/`` can put nothing in the wheel and nothing is written into the
    checkout. Returns the wheel's path.

    Raises:
        RuntimeError: pip could not build the wheel (its output is in the message), or
            the build did not give exactly one wheel.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="coursekit-build-") as tmp:
        source, built = Path(tmp) / "coursekit", Path(tmp) / "dist"
        shutil.copytree(ROOT / "coursekit", source, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                               "--quiet", "-w", str(built), str(source)],
                              capture_output=True, text=True, timeout=600)
        wheels = sorted(built.glob(WHEEL_GLOB))
        if done.returncode or len(wheels) != 1:
            raise RuntimeError(f"pip wheel coursekit/ failed (exit {done.returncode}, wheels {wheels}):\n"
                               f"{done.stdout}{done.stderr}")
        target = dest / wheels[0].name
        shutil.move(wheels[0], target)
    return target


def wheel_digest(wheel: Path, extras: str = "") -> str:
    """A hash of the wheel's member names and bytes (not of the zip, whose timestamps change
    with every build), the extras and the interpreter: the key of the cached venv."""
    digest = hashlib.sha256(f"{INTERPRETER}\0{extras}\0".encode())
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            digest.update(name.encode() + b"\0" + archive.read(name) + b"\0")
    return digest.hexdigest()[:16]


def student_env(extras: str = "") -> Path:
    """The Python of a clean venv holding the student wheel (with ``extras``, e.g. "hub").

    Builds the wheel, and the venv when no complete one with this wheel and these
    extras is cached. The first build installs torch: a few minutes.

    Raises:
        ValueError: ``extras`` is not a comma-separated list of extra names.
        EnvironmentMissing, RuntimeError: as ``build_venv``, or the wheel could not be built.
    """
    if not re.fullmatch(r"([a-z0-9_-]+(,[a-z0-9_-]+)*)?", extras):
        raise ValueError(f"extras should be names separated by commas, like 'hub', not {extras!r}")
    with tempfile.TemporaryDirectory(prefix="coursekit-wheel-") as tmp:
        wheel = build_wheel(Path(tmp))
        return build_venv("student", wheel_digest(wheel, extras),
                          lambda prefix: pip(prefix, f"{wheel}[{extras}]" if extras else str(wheel)), STUDENT_ENVS)


# --------------------------------------------------------------------------- the instructor's

def instructor_env() -> Path:
    """The instructor's environment's python: the course installed editable from this
    repository (``course-grader``, formgrader with the course's filters) and jupyterhub.

    Raises:
        EnvironmentMissing, RuntimeError: as ``build_venv``.
    """
    pyproject, constraints = (ROOT / "pyproject.toml").read_text(), ROOT / "constraints.txt"
    key = hashlib.sha256("\n".join([str(ROOT), pyproject, constraints.read_text()]).encode()).hexdigest()[:12]
    # the instructor's extra holds jupyterhub; constraints.txt pins it to HUB_PIN
    return build_venv("instructor", key,
                      lambda prefix: pip(prefix, "-c", str(constraints), "-e", f"{ROOT}[instructor]"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the student wheel's clean venv (cached once per "
                                                 "machine, see hub/environments.py).")
    parser.add_argument("--extras", default="", help="extras of the student package, e.g. hub")
    print(student_env(parser.parse_args(argv).extras))


if __name__ == "__main__":
    main()
