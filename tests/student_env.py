"""The student package as a learner gets it: the wheel built from coursekit/, installed
with its pinned dependencies into a clean virtual environment of its own.

``build_wheel(dest)`` builds ``attention_coursekit-0.1.0-py3-none-any.whl`` with this
environment's pip, as ``make wheel`` does. ``student_env(extras)`` returns the Python of
a venv made from Debian's ``/usr/bin/python3.11`` (world-usable, unlike the dev venv's
interpreter under /root, so that other Unix accounts, a JupyterHub's students, can run it)
with only that wheel installed. The venv is cached in ``out/student-env-<hash>/``, keyed by
the wheel's contents, the extras and the interpreter, so that torch is installed once, and
is world-readable. Two processes asking for the same venv at once take turns on a lock
file; the second finds the first one's venv.

``python -m tests.student_env [--extras hub]`` (``make student-env``) builds it ahead of
the tests and prints its Python.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "coursekit"
OUT = ROOT / "out"
INTERPRETER = Path("/usr/bin/python3.11")
WHEEL_GLOB = "attention_coursekit-*-py3-none-any.whl"
COMPLETE = ".complete"  # written last: a venv without it was interrupted and is rebuilt
# what a build leaves in a source folder; never part of the wheel's input
BUILD_LEFTOVERS = ("build", "dist", "*.egg-info", "__pycache__", ".ipynb_checkpoints")
# the dev session's variables that would let the clean venv import the checkout instead of the wheel
LEAKY = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "VIRTUAL_ENV", "PYTHONSAFEPATH")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without the variables that point Python at the checkout
    (pip's configuration, e.g. where the torch CPU wheel is, stays), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in LEAKY}
    env["PYTHONNOUSERSITE"] = "1"
    env.update(extra)
    return env


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
        shutil.copytree(SOURCE, source, ignore=shutil.ignore_patterns(*BUILD_LEFTOVERS))
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
    extras is cached in out/. The first build installs torch: a few minutes.

    Raises:
        ValueError: ``extras`` is not a comma-separated list of extra names.
        RuntimeError: /usr/bin/python3.11 (with venv and ensurepip) is missing, or the
            wheel or the venv could not be built (the tool's output is in the message).
    """
    if not re.fullmatch(r"([a-z0-9_-]+(,[a-z0-9_-]+)*)?", extras):
        raise ValueError(f"extras should be names separated by commas, like 'hub', not {extras!r}")
    if not INTERPRETER.is_file() or subprocess.run([str(INTERPRETER), "-c", "import venv, ensurepip"],
                                                   capture_output=True).returncode:
        raise RuntimeError(f"{INTERPRETER} with venv and ensurepip is needed for the student venv: "
                           "apt-get install python3.11 python3.11-venv")
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="coursekit-wheel-") as tmp:
        wheel = build_wheel(Path(tmp))
        venv = OUT / f"student-env-{wheel_digest(wheel, extras)}"
        python = venv / "bin" / "python"
        if (venv / COMPLETE).is_file():
            return python
        with open(OUT / f"{venv.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process dies
            if not (venv / COMPLETE).is_file():
                _create(venv, wheel, extras)
    return python


def _run(*cmd: str) -> None:
    done = subprocess.run(cmd, env=clean_env(), capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")


def _create(venv: Path, wheel: Path, extras: str) -> None:
    if venv.exists():  # an interrupted build
        shutil.rmtree(venv)
    _run(str(INTERPRETER), "-m", "venv", str(venv))
    _run(str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[{extras}]" if extras else str(wheel))
    _world_readable(venv)
    (venv / COMPLETE).write_text(f"{wheel.name} [{extras}]\n")
    os.chmod(venv / COMPLETE, 0o644)


def _world_readable(top: Path) -> None:
    # other accounts run this venv's python: they must read every file and enter every folder
    read = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
    enter = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
    for path in [OUT, top]:
        path.chmod(path.stat().st_mode | read | enter)
    for folder, dirs, files in os.walk(top):
        for name in dirs:
            path = Path(folder, name)
            if not path.is_symlink():
                path.chmod(path.stat().st_mode | read | enter)
        for name in files:
            path = Path(folder, name)
            if not path.is_symlink():
                mode = path.stat().st_mode
                path.chmod(mode | read | (enter if mode & stat.S_IXUSR else 0))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build the student wheel's clean venv (cached in out/).")
    parser.add_argument("--extras", default="", help="extras of the student package, e.g. hub")
    print(student_env(parser.parse_args(argv).extras))


if __name__ == "__main__":
    main()
