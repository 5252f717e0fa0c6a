"""Runs of whole notebooks, kept per machine and keyed by everything a run depends on, so
that the suite runs a solution notebook again only when something it reads has changed
(tests/test_prose_claims.py: 09 and 10 train for minutes).

A run depends on the notebook as run (every cell and its metadata but not its outputs, the claims' probes
included), on every file of the packages a solution imports (coursekit/, grader/) and of the
notebook's folder, on the installed distributions and their versions, on the Python, the
machine's architecture and the CPU capability torch computes with. The training notebooks
run a fixed number of steps with fixed seeds on one torch thread (coursekit/training.py;
tests/test_training.py), so one key gives one set of outputs; a change to any of these gives
a new key, and the notebook runs. Runs are kept like the student venv, outside any clone
(``hub.environments.machine_folder``: $ATTENTION_COURSE_RUNS, else, as root,
/var/cache/attention-from-scratch/runs, else out/runs), so a fresh clone on the same machine
reuses them; COURSE_TEST_FRESH_RUNS=1 runs every notebook anyway and keeps the new run.

Not jupyter-cache: it keys a notebook by its code cells alone, so an edit to coursekit would
give back the run of the old code.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.metadata
import os
import platform
import sys
import tempfile
from fnmatch import fnmatch
from pathlib import Path
from typing import Callable

import nbformat

from grader import claims, course
from hub.environments import BUILD_LEFTOVERS, machine_folder

PACKAGES = (course.ROOT / "coursekit", course.ROOT / "grader")
KEEP = 4  # runs kept per notebook folder (a few checkouts or branches on one machine), newest first


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not any(
        fnmatch(part, leftover) for part in p.relative_to(folder).parts for leftover in BUILD_LEFTOVERS))


def _platform() -> str:
    import torch  # what torch dispatches to (AVX2, AVX512, ...) can change a float's last bits

    distributions = sorted(f"{d.metadata['Name']}=={d.version}" for d in importlib.metadata.distributions())
    return "\n".join([sys.version, platform.machine(), torch.backends.cpu.get_cpu_capability(), *distributions])


def key(nb, folder: Path, packages: tuple[Path, ...] = PACKAGES) -> str:
    """The hex digest of what running ``nb`` in ``folder`` depends on (see the module's docs)."""
    unrun = copy.deepcopy(nb)  # outputs are what a run gives, not what it depends on
    for cell in unrun.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    digest = hashlib.sha256(nbformat.writes(unrun).encode())
    for root in (*packages, folder):
        for path in _files(root):
            digest.update(f"\0{path.relative_to(root.parent)}\0".encode())
            digest.update(path.read_bytes())
    digest.update(_platform().encode())
    return digest.hexdigest()


def kept(run: Callable = claims.execute, runs: Path | None = None,
         packages: tuple[Path, ...] = PACKAGES) -> Callable:
    """A ``run(nb, folder)`` for ``claims.verify`` that gives back the kept run of the same
    key, or runs ``nb`` with ``run`` and keeps what it gave. A kept run that cannot be read
    is run again; of one folder's runs the KEEP newest are kept."""
    runs = runs or machine_folder("runs", "ATTENTION_COURSE_RUNS")

    def keeping(nb, folder: Path):
        path = runs / f"{folder.name}-{key(nb, folder, packages)}.ipynb"
        if path.is_file() and not os.environ.get("COURSE_TEST_FRESH_RUNS"):
            try:
                return nbformat.read(path, as_version=4)
            except Exception:  # noqa: BLE001 - a torn or foreign file: run again
                pass
        executed = run(nb, folder)
        runs.mkdir(parents=True, exist_ok=True)
        # executed solutions: on a machine that also hosts students, only the suite's account reads them
        runs.chmod(0o700)
        with tempfile.NamedTemporaryFile("w", dir=runs, suffix=".part", delete=False) as part:
            nbformat.write(executed, part)
        os.replace(part.name, path)  # whole or not at all, for a run killed while writing
        for older in sorted(runs.glob(f"{folder.name}-*.ipynb"), key=lambda p: p.stat().st_mtime)[:-KEEP]:
            older.unlink(missing_ok=True)
        return executed

    return keeping
