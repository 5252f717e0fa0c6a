"""The learner's install (`pip install -e .`, the base of pyproject.toml, no extras) resolves
on every Python from 3.11 to 3.13 this machine has, without constraints (the pip line) and
at constraints.txt's exact pins (`make lab`), and is refused on 3.10 with pip's own message.

Each resolution is pip's dry run (``pip --python PY install --dry-run --ignore-installed
--report``) run by this venv's pip for the other interpreter, so no venv is made. pip
reads each wheel's metadata, not the wheel: the index here gives no PEP 658 metadata files,
so without ``--use-feature=fast-deps`` pip downloads every wheel it considers (torch's
alone is 555 MB); with it, pip reads the METADATA of each wheel with HTTP range requests
(about 37 MB for the whole resolution, measured on eth0). Network: the package index, as
every install. The three interpreters resolve side by side (most of the time is waiting).
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from grader import course

pytestmark = pytest.mark.kernel

VERSIONS = ("3.11", "3.12", "3.13")
INSTRUCTOR_ONLY = {"jupyterhub", "dask", "distributed", "psycopg", "pytest", "pytest-xdist", "playwright",
                   "jupyter-server-mathjax"}


def _interpreter(minor: str) -> str | None:
    """A python``minor`` that runs: on PATH (a pyenv shim of an inactive version does not
    run), Debian's, or pyenv's."""
    pyenv = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    candidates = [shutil.which(f"python{minor}"), f"/usr/bin/python{minor}",
                  *sorted(glob.glob(f"{pyenv}/versions/{minor}.*/bin/python{minor}"), reverse=True)]
    for candidate in filter(None, candidates):
        if not os.access(candidate, os.X_OK):
            continue
        done = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == minor:
            return candidate
    return None


def _dry_run(python: str, report: Path, pinned: bool = False) -> subprocess.CompletedProcess:
    """pip's dry run of the learner install for ``python``; ``pinned``: at constraints.txt's
    exact versions, as `make lab` installs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
    return subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "--dry-run",
                           "--ignore-installed", "--use-feature=fast-deps", "--quiet", "--no-input",
                           "--report", str(report), *(["-c", str(course.ROOT / "constraints.txt")] if pinned else []),
                           str(course.ROOT)],
                          capture_output=True, text=True, env=env, timeout=600)


def test_the_learner_install_resolves_on_every_python_from_3_11_to_3_13(tmp_path):
    found = {minor: _interpreter(minor) for minor in VERSIONS}
    assert all(found.values()), (f"no working python{', python'.join(m for m, p in found.items() if not p)} "
                                 "here: install it (pyenv install 3.13, or apt-get install python3.11-venv)")
    torch_range = next(Requirement(r) for r in tomllib.loads((course.ROOT / "pyproject.toml").read_text())
                       ["project"]["dependencies"] if r.startswith("torch"))
    pins = {Requirement(line).name.lower().replace("_", "-"): str(Requirement(line).specifier).lstrip("=")
            for line in (course.ROOT / "constraints.txt").read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")}
    # each Python twice: as pip alone resolves it, and at the pins `make lab` installs
    jobs = [(minor, pinned) for minor in found for pinned in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        runs = dict(zip(jobs, pool.map(lambda j: _dry_run(found[j[0]], tmp_path / f"{j[0]}-{j[1]}.json", j[1]), jobs)))
    for (minor, pinned), done in runs.items():
        how = "at constraints.txt's pins (make lab)" if pinned else "(pip install -e .)"
        assert done.returncode == 0, f"Python {minor} ({found[minor]}): the learner install {how} does not resolve:\n{done.stderr}"
        report = json.loads((tmp_path / f"{minor}-{pinned}.json").read_text())
        assert report["environment"]["python_version"] == minor
        resolved = {i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]}
        assert torch_range.specifier.contains(resolved["torch"]), (minor, resolved["torch"])
        assert {"numpy", "matplotlib", "jupyterlab", "ipywidgets", "ipykernel", "nbgrader"} <= set(resolved)
        assert set(resolved) & INSTRUCTOR_ONLY == set(), f"Python {minor}: the learner would get {set(resolved) & INSTRUCTOR_ONLY}"
        if pinned:
            off = {name: (version, pins[name]) for name, version in resolved.items()
                   if name in pins and version.split("+")[0] != pins[name]}
            assert not off, f"Python {minor}, make lab: not at the pins {off}"


def test_the_learner_install_is_refused_on_python_3_10(tmp_path):
    """requires-python says so before anything is downloaded (the issue: a 3.12 learner was
    told only after pip had fetched torch)."""
    python = _interpreter("3.10")
    if python is None:
        pytest.skip("no Python 3.10 on this machine to be refused")
    done = _dry_run(python, tmp_path / "3.10.json")
    assert done.returncode != 0
    assert "requires a different Python" in done.stderr and "<3.14,>=3.11" in done.stderr, done.stderr
    assert "torch" not in done.stderr
