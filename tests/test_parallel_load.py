"""A correct notebook never loses points to machine load or to a neighbour (issue 32, failure 9).

Two workers grade, side by side, a submission whose first cell starts 200 busy processes
and a correct classmate's, while CPU-bound processes of the test's own load the machine.
The limits are the course's own, lowered to a few CPU seconds in the workers (so that the
test is short and the load weighs): a kernel is charged for the CPU its processes used,
never for the time it waited for a CPU, and a unit that trips a limit beside others is
graded again alone. Before, with the same limits counted on the wall clock, the
classmate lost points ("not run: ..."). Needs root and bubblewrap, like the sandbox.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from grader.parallel import Unit, run
from grader.unit import Settings

pytestmark = pytest.mark.kernel

ROOT = Path(__file__).resolve().parent.parent
ASSIGNMENT = "01_similarity"
HONEST = "ada"  # earns all 10 points (sample_class/ada/expected.json)
MARK = "attention-course-load-hog-5d2e"  # argv of the hog's processes, to find survivors
# the hog: 200 processes that spin until killed, started before the answers run; each
# becomes a new Python (marked) in its own session, out of the kernel's process group
HOG = f"""import os, sys
for _ in range(200):
    if os.fork() == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", "while True: pass", {MARK!r}])
"""
# the machine's other work: one CPU-bound process per core, each ending by itself
# after five minutes should the test not get to kill it
LOAD = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 300: pass"


def _work(files, student_id, assignment_id, settings):
    """grade_submission in the worker, with the course's time limits lowered to 3 CPU-s a cell
    and a notebook (a wall-clock backstop of 10 times that: the machine may be loaded by
    more than this test). The same limits under the names they had while they were counted
    on the wall clock (Execute.timeout, notebook_timeout) are set too, so that this test
    measures the same limits on the code before issue 32; the grader now ignores them."""
    from grader import course, unit

    load = course.load_config

    def lowered():
        config = load()
        config.BudgetedExecute.cell_cpu_seconds = 3
        config.BudgetedExecute.notebook_cpu_seconds = 3
        config.BudgetedExecute.wall_factor = 10.0
        config.BudgetedExecute.notebook_timeout = 3
        config.Execute.timeout = 3
        return config

    course.load_config = lowered
    try:
        return unit.grade_submission(files, student_id, assignment_id, settings)
    finally:
        course.load_config = load


def _hog_submission(folder: Path) -> Path:
    """A copy of a correct submission with the hog as its first cell."""
    shutil.copytree(ROOT / "sample_class" / HONEST / ASSIGNMENT, folder)
    path = folder / f"{ASSIGNMENT}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(0, nbformat.v4.new_code_cell(HOG))
    nbformat.write(nb, path)
    return folder


def _survivors() -> list[int]:
    out = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and MARK.encode() in (p / "cmdline").read_bytes():
                out.append(int(p.name))
        except OSError:
            continue
    return out


def test_a_hog_beside_a_correct_classmate_on_a_loaded_machine_costs_the_classmate_nothing(tmp_path):
    if os.geteuid() != 0 or not shutil.which("bwrap"):
        pytest.fail("run the tests as root with bubblewrap (as CI does): the kernels' cgroups need it")
    settings = Settings(b"load-test-secret-0123456789abcdef")
    units = [Unit("hog", ASSIGNMENT, str(_hog_submission(tmp_path / "hog")), settings),
             Unit(HONEST, ASSIGNMENT, str(ROOT / "sample_class" / HONEST / ASSIGNMENT), settings)]
    load = [subprocess.Popen([sys.executable, "-c", LOAD]) for _ in range(os.cpu_count() or 1)]
    try:
        started = time.monotonic()
        outcomes = {u.student_id: o for u, o in run(units, jobs=2, progress=False, deadline=300, work=_work)}
        wall = time.monotonic() - started
        still_loaded = all(p.poll() is None for p in load)
    finally:
        for p in load:
            p.kill()
            p.wait()
    for name, o in outcomes.items():
        print(name, json.dumps({k: o.get(k) for k in ("status", "diagnoses", "limits_tripped", "timings", "ran")}
                               if isinstance(o, dict) else o))
    print(f"{wall:.0f} s for the two units on two workers beside {len(load)} busy processes")
    assert still_loaded, "the load ended before the grading did: this proves nothing"
    honest = outcomes[HONEST]
    assert isinstance(honest, dict), honest
    assert sum(honest["points"].values()) == 10, (honest["status"], honest["diagnoses"])
    assert honest["diagnoses"] == {} and honest["status"] == "graded"
    hog = outcomes["hog"]
    assert isinstance(hog, dict), hog
    assert hog["limits_tripped"] >= 1  # its 200 processes spent its own budget, graded alone too
    assert hog["status"].endswith("regraded alone: a time limit tripped while other units ran beside it")
    for _ in range(50):  # the kernel's cgroup is killed at its shutdown; allow the last to be reaped
        if not _survivors():
            break
        time.sleep(0.1)
    assert _survivors() == [], "processes of the hog survived its grading"
