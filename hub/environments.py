"""The course's environments, as cached venvs.

* ``student_env(extras)``: the student package as a learner or a hub's student gets it,
  the wheel built from coursekit/ (``build_wheel``, as ``make wheel`` builds it) installed
  with its pinned dependencies into a clean venv: no grader package, no solutions.
* ``selfstudy_env()``: the self-learner's wheel (``build_selfstudy_wheel``, selfstudy/:
  coursekit, the notebooks, the hidden checks, ``attention-course``) in a clean venv; the
  three newest are kept (``prune``).
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
venv ahead of the tests and prints its Python; ``--selfstudy`` (``make selfstudy-env``) the
self-learner's; ``--wheel FOLDER`` builds only the wheel (``make wheel``, ``make selfstudy-wheel``).
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

def _pip_wheel(source: Path, built: Path, glob: str) -> Path:
    """``pip wheel`` the project in ``source`` into ``built``; the one wheel it gives.

    Raises:
        RuntimeError: pip failed (its output is in the message), or gave no single wheel.
    """
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "--quiet", "-w", str(built), str(source)],
                          capture_output=True, text=True, timeout=600)
    wheels = sorted(built.glob(glob))
    if done.returncode or len(wheels) != 1:
        raise RuntimeError(f"pip wheel {source.name}/ failed (exit {done.returncode}, wheels {wheels}):\n"
                           f"{done.stdout}{done.stderr}")
    return wheels[0]


def build_wheel(dest: Path) -> Path:
    """Build the student wheel from coursekit/ into the folder ``dest`` (created if missing).

    The build runs in a copy of coursekit/ without build leftovers, so a stale
    ``coursekit/build/`` can put nothing in the wheel and nothing is written into the
    checkout; the copy follows coursekit/assets, a link to the course's assets/. Returns
    the wheel's path.

    Raises:
        RuntimeError: pip could not build the wheel (its output is in the message), or
            the build did not give exactly one wheel.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="coursekit-build-") as tmp:
        source = Path(tmp) / "coursekit"
        shutil.copytree(ROOT / "coursekit", source, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
        wheel = _pip_wheel(source, Path(tmp) / "dist", WHEEL_GLOB)
        target = dest / wheel.name
        shutil.move(wheel, target)
    return target


# What the self-learner's wheel holds beyond selfstudy/'s own files, copied beside them for
# the build: the student package, the hidden checks and what check my work in a kernel needs
# of the grader (grader.kernelcheck and what it imports: the wire that reads answers, the
# seeds, the user's secret, the tutor's lines, the course's layout, names shown safely), the
# student notebooks as package data, and the learner's Jupyter configuration (lab/).
SELFSTUDY_GRADER = ("__init__.py", "checks", "wire.py", "kernelcheck.py", "seeds.py", "selfcheck.py",
                    "tutortext.py", "course.py", "names.py")
SELFSTUDY_COPIES = {"coursekit": "coursekit", **{f"grader/{name}": f"grader/{name}" for name in SELFSTUDY_GRADER},
                    "notebooks": "attention_course/notebooks", "lab": "attention_course/lab"}
SELFSTUDY_GLOB = "attention_from_scratch_course-*-py3-none-any.whl"


def build_selfstudy_wheel(dest: Path) -> Path:
    """Build the self-learner's wheel (selfstudy/pyproject.toml) into the folder ``dest``.

    selfstudy/ and the checkout's files named in ``SELFSTUDY_COPIES`` are copied into a
    temporary folder (without build leftovers, following links) and built there: nothing
    is written into the checkout. Returns the wheel's path.

    Raises:
        RuntimeError: as ``build_wheel``.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns(*BUILD_LEFTOVERS)
    with tempfile.TemporaryDirectory(prefix="selfstudy-build-") as tmp:
        source = Path(tmp) / "selfstudy"
        shutil.copytree(ROOT / "selfstudy", source, ignore=ignore)
        for there, here in SELFSTUDY_COPIES.items():
            (source / here).parent.mkdir(parents=True, exist_ok=True)
            if (ROOT / there).is_dir():
                shutil.copytree(ROOT / there, source / here, ignore=ignore)
            else:
                shutil.copyfile(ROOT / there, source / here)
        wheel = _pip_wheel(source, Path(tmp) / "dist", SELFSTUDY_GLOB)
        target = dest / wheel.name
        shutil.move(wheel, target)
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


def selfstudy_env() -> Path:
    """The Python of a clean venv holding the self-learner's wheel (``build_selfstudy_wheel``)
    and its dependencies at constraints.txt's pins, cached like the student's (``STUDENT_ENVS``,
    keyed by the wheel's bytes and the pins). The first build installs torch and JupyterLab:
    about a minute from the files on this machine's disk.

    Raises:
        EnvironmentMissing, RuntimeError: as ``build_venv``, or the wheel could not be built.
    """
    constraints = ROOT / "constraints.txt"  # the grading environment's pins: torch 2.13.0, the file on disk
    with tempfile.TemporaryDirectory(prefix="selfstudy-wheel-") as tmp:
        wheel = build_selfstudy_wheel(Path(tmp))
        key = hashlib.sha256((wheel_digest(wheel) + constraints.read_text()).encode()).hexdigest()[:16]
        python = build_venv("selfstudy", key, lambda prefix: pip(prefix, "-c", str(constraints), str(wheel)),
                            STUDENT_ENVS)
    prune("selfstudy", STUDENT_ENVS)
    return python


KEEP = 3  # the self-learner's venvs kept: a new one comes with every change of a check or notebook


def prune(name: str, envs: Path, keep: int = KEEP) -> list[Path]:
    """Remove all but the ``keep`` newest complete ``<name>-*`` venvs of ``envs`` (about 1.3 GB
    each); the ones being built are left alone. Only for venvs that tests alone use (the
    self-learner's): a hub's students run on the student venv, which is never pruned.
    Returns the venvs removed."""
    done = sorted((p for p in envs.glob(f"{name}-*") if (p / COMPLETE).is_file()),
                  key=lambda p: (p / COMPLETE).stat().st_mtime, reverse=True)
    for old in done[keep:]:
        shutil.rmtree(old, ignore_errors=True)
    return done[keep:]


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
    parser = argparse.ArgumentParser(description="Build the student wheel's clean venv, or the self-learner "
                                                 "wheel's (cached once per machine, see hub/environments.py).")
    parser.add_argument("--extras", default="", help="extras of the student package, e.g. hub")
    parser.add_argument("--selfstudy", action="store_true", help="the self-learner wheel's venv (selfstudy/)")
    parser.add_argument("--wheel", type=Path, metavar="FOLDER", help="only build the wheel (the student's, or "
                        "with --selfstudy the self-learner's) into FOLDER and print its path")
    args = parser.parse_args(argv)
    if args.wheel:
        print((build_selfstudy_wheel if args.selfstudy else build_wheel)(args.wheel))
    else:
        print(selfstudy_env() if args.selfstudy else student_env(args.extras))


if __name__ == "__main__":
    main()
