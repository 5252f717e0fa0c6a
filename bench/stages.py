"""Where the time of one graded submission goes, per assignment, beside a plain nbclient run.

    .venv/bin/python bench/stages.py [--assignments 01_similarity ...] [--student ada]

For each assignment the grader grades the student's submission twice in this process
(``grader.grade.Grader.grade``, as a one-worker run does): the first run pays what a
worker does once per assignment (the release, the template gradebook, imports), the
second is profiled stage by stage. Then the same notebook runs in a plain nbclient
kernel (no nbgrader, no sandbox, the learner's visible tests only; NBGRADER_EXECUTION
set, as while graded). Each stage shows its wall seconds, the CPU seconds of the
grader's process, and the CPU seconds of the kernel side (the kernel's cgroup, which
holds bubblewrap, the copy and every process of the kernel; with the fork server also
what the zygote spent forking it). The stages:

- staging: checking and copying the submitted folder (``grader.stage``);
- nbgrader: set-up and writing: what ``api.autograde`` does besides its preprocessors
  (course directory, gradebook rows, files, writing the autograded notebook);
- nbgrader: sanitize: its preprocessors before execution (ClearOutput, OverwriteCells...);
- questions: ``AskQuestions``;
- sandbox and kernel start: cgroup, bubblewrap, the kernel until it answers;
- setup cell (imports): the notebook's first code cell (numpy, torch, matplotlib...);
- the notebook's cells: every other cell, hidden checks included;
- kernel shutdown and clean-up;
- verdict: ``SaveVerifiedGrades`` (decoding and judging the answers, the gradebook write);
- nbgrader: other preprocessors after execution (IgnorePattern, LimitOutput, late penalty...);
- gradebook read-back: the unit's snapshot of its throwaway gradebook;
- feedback: ``api.generate_feedback`` (the HTML page);
- collector: recording the result in the course's gradebook and folders;
- other: the rest of the unit (templates, secrets, reading files back).

Machine load inflates wall seconds; CPU seconds are what a loaded machine cannot
inflate, and what bounds throughput. The load average is printed.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402
import psutil  # noqa: E402
from nbclient import NotebookClient  # noqa: E402
from nbconvert.preprocessors import Preprocessor  # noqa: E402

from grader import course, grade as grade_module, unit  # noqa: E402
from grader.coursedir import CourseDir  # noqa: E402
from grader.execute import BudgetedExecute  # noqa: E402
from grader.grade import Grader  # noqa: E402
from grader.release import use_this_environment  # noqa: E402

STAGES = ["staging", "nbgrader: set-up and writing", "nbgrader: sanitize", "questions",
          "sandbox and kernel start", "setup cell (imports)", "the notebook's cells",
          "kernel shutdown and clean-up", "verdict", "nbgrader: other preprocessors",
          "gradebook read-back", "feedback", "collector", "other"]
SANITIZE = {"ClearOutput", "DeduplicateIds", "OverwriteKernelspec", "OverwriteCells", "CheckCellMetadata"}


def _cpu() -> float:
    return time.process_time()


@dataclass
class Timer:
    """Exclusive wall and CPU seconds per stage: a stage's time minus that of the stages
    it contains, so that the stages add up to the whole."""

    kernel_cpu: callable = lambda: 0.0  # the kernel side's CPU seconds so far
    stages: dict = field(default_factory=dict)
    _stack: list = field(default_factory=list)

    @contextmanager
    def stage(self, name: str):
        start = [time.perf_counter(), _cpu(), self.kernel_cpu()]
        self._stack.append([0.0, 0.0, 0.0, name])  # what nested stages took, and the name
        try:
            yield
        finally:
            inner = self._stack.pop()[:3]
            took = [time.perf_counter() - start[0], _cpu() - start[1], self.kernel_cpu() - start[2]]
            own = [t - i for t, i in zip(took, inner)]
            total = self.stages.setdefault(name, [0.0, 0.0, 0.0])
            for k in range(3):
                total[k] += own[k]
            if self._stack:
                for k in range(3):
                    self._stack[-1][k] += took[k]


class Instrumented:
    """Wraps the grader's and nbgrader's steps so that each runs inside its ``Timer`` stage."""

    def __init__(self):
        self.timer: Timer | None = None
        self._kernel_base = 0.0
        self._km = None
        self._first_cell = True

    def kernel_cpu(self) -> float:
        """CPU seconds of the kernel side: the current kernel's cgroup (kept once the kernel
        is gone), plus what the fork server spent, when there is one."""
        km = self._km
        if km is not None and getattr(km, "cgroup", None) is not None:
            used = km.cgroup.cpu_seconds()
            if used is not None:
                self._last_kernel = used
        return self._kernel_base + getattr(self, "_last_kernel", 0.0) + _forkserver_cpu()

    def wrap(self, owner, name: str, stage) -> None:
        original = getattr(owner, name)
        me = self

        def wrapped(*args, **kwargs):
            label = stage(args[0]) if callable(stage) else stage
            if me.timer is None or label is None:
                return original(*args, **kwargs)
            with me.timer.stage(label):
                return original(*args, **kwargs)

        setattr(owner, name, wrapped)

    def install(self) -> None:
        from nbgrader.apps import NbGraderAPI

        self.wrap(unit, "stage", "staging")
        self.wrap(unit, "_snapshot", "gradebook read-back")
        self.wrap(NbGraderAPI, "autograde", "nbgrader: set-up and writing")
        self.wrap(NbGraderAPI, "generate_feedback", "feedback")
        self.wrap(Grader, "record", "collector")

        def preprocessor_stage(pp):
            name = type(pp).__name__
            if name == "BudgetedExecute":
                return "kernel shutdown and clean-up"  # what is left of it besides start and cells
            if name == "AskQuestions":
                return "questions"
            if name == "SaveVerifiedGrades":
                return "verdict"
            if self.timer is None or {"feedback", "collector"} & {s[3] for s in self.timer._stack}:
                return None  # part of the page, or of the collector's own nbgrader run
            if not self._executed:
                return "nbgrader: sanitize" if name in SANITIZE else "nbgrader: other preprocessors"
            return "nbgrader: other preprocessors"

        self.wrap(Preprocessor, "__call__", preprocessor_stage)
        me = self
        start = BudgetedExecute.start_new_kernel
        start_client = BudgetedExecute.start_new_kernel_client
        cell = BudgetedExecute.preprocess_cell
        preprocess = BudgetedExecute.preprocess

        def timed_preprocess(pp, nb, resources=None, *args, **kwargs):
            me._first_cell, me._km = True, None
            try:
                return preprocess(pp, nb, resources, *args, **kwargs)
            finally:
                me._executed = True

        def timed_start(pp, **kwargs):
            if me.timer is None:  # a grading that is not profiled
                return start(pp, **kwargs)
            with me.timer.stage("sandbox and kernel start"):
                me._km = pp.km
                me._last_kernel = 0.0
                return start(pp, **kwargs)

        def timed_start_client(pp):
            if me.timer is None:
                return start_client(pp)
            with me.timer.stage("sandbox and kernel start"):
                return start_client(pp)

        def timed_cell(pp, cell_, resources, index):
            if me.timer is None or cell_.cell_type != "code" or not cell_.source.strip():
                return cell(pp, cell_, resources, index)
            label = "setup cell (imports)" if me._first_cell else "the notebook's cells"
            me._first_cell = False
            with me.timer.stage(label):
                return cell(pp, cell_, resources, index)

        BudgetedExecute.preprocess = timed_preprocess
        BudgetedExecute.start_new_kernel = timed_start
        BudgetedExecute.start_new_kernel_client = timed_start_client
        BudgetedExecute.preprocess_cell = timed_cell

    @contextmanager
    def profiling(self):
        self.timer = Timer(kernel_cpu=self.kernel_cpu)
        self._kernel_base, self._last_kernel, self._executed = 0.0, 0.0, False
        try:
            with self.timer.stage("other"):
                yield self.timer
        finally:
            self.timer = None


def _forkserver_cpu() -> float:
    """CPU seconds the fork server has spent in this process's life (0 without one)."""
    try:
        from grader import forkserver
    except ImportError:
        return 0.0
    return forkserver.cpu_seconds()


def plain_run(assignment_id: str, student: str) -> dict[str, list[float]]:
    """The submitted notebook in a plain nbclient kernel, as a learner's machine runs it:
    the kernel start, the setup cell, the other cells; wall and the kernel's CPU seconds."""
    folder = course.SAMPLE_CLASS / student / assignment_id
    path = next(folder.glob("*.ipynb"))
    nb = nbformat.read(path, as_version=4)
    marks: dict[str, float] = {}
    cpu: dict[str, float] = {}
    client = NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(folder)}},
                            extra_arguments=["--HistoryManager.hist_file=:memory:", "--IPKernelApp.log_level=ERROR"])

    def kernel_cpu() -> float:
        try:
            process = psutil.Process(client.km.provisioner.process.pid)
            times = process.cpu_times()
            return times.user + times.system + sum(
                c.cpu_times().user + c.cpu_times().system for c in process.children(recursive=True))
        except (psutil.Error, AttributeError):
            return cpu.get("last", 0.0)

    def started(**_):
        marks["ready"], cpu["ready"] = time.perf_counter(), kernel_cpu()

    def cell_done(cell, **_):
        if "setup" not in marks and cell.cell_type == "code" and cell.source.strip():
            marks["setup"], cpu["setup"] = time.perf_counter(), kernel_cpu()
        cpu["last"] = kernel_cpu()

    client.on_notebook_start = started
    client.on_cell_executed = cell_done
    os.environ["NBGRADER_EXECUTION"] = "autograde"  # as while graded: 09 and 10 train briefly
    try:
        begin = time.perf_counter()
        client.execute()
        end = time.perf_counter()
    finally:
        del os.environ["NBGRADER_EXECUTION"]
    return {"kernel start": [marks["ready"] - begin, cpu["ready"]],
            "setup cell (imports)": [marks["setup"] - marks["ready"], cpu["setup"] - cpu["ready"]],
            "the other cells and shutdown": [end - marks["setup"], cpu["last"] - cpu["setup"]],
            "total": [end - begin, cpu["last"]]}


def profile(assignments: list[str], student: str) -> list[tuple[str, dict, dict, float]]:
    """(assignment, stages, plain run, seconds of the first, unprofiled grading) per assignment."""
    probe = Instrumented()
    probe.install()
    out = []
    with tempfile.TemporaryDirectory() as scratch:
        grader = Grader(CourseDir.open(Path(scratch) / "course", submitted=course.SAMPLE_CLASS))
        for assignment_id in assignments:
            folder = course.SAMPLE_CLASS / student / assignment_id
            start = time.perf_counter()
            warm = grader.grade(folder, student, assignment_id)
            first = time.perf_counter() - start
            if not warm.status.startswith("graded"):
                print(f"{assignment_id}: the first grading: {warm.status}", file=sys.stderr)
            with probe.profiling() as timer:
                row = grader.grade(folder, student, assignment_id)
            expected = json.loads((course.SAMPLE_CLASS / student / "expected.json").read_text())[assignment_id]
            if row.score != expected["score"]:  # e.g. a time limit reached on a loaded machine
                print(f"{assignment_id}: {row.status} ({row.score:g}, expected {expected['score']:g}); "
                      "left out of the profile", file=sys.stderr)
                continue
            out.append((assignment_id, dict(timer.stages), plain_run(assignment_id, student), first))
    return out


def report(results, load_before: float) -> str:
    lines = [f"where the time of one graded submission goes ({os.cpu_count()} cores, load average "
             f"{load_before:.1f} before and {os.getloadavg()[0]:.1f} after; wall s / grader CPU s / kernel CPU s):"]
    for assignment_id, stages, plain, first in results:
        total = [sum(v[k] for v in stages.values()) for k in range(3)]
        lines.append(f"\n  {assignment_id}: graded in {total[0]:.2f} s wall, {total[1]:.2f} CPU-s in the grader, "
                     f"{total[2]:.2f} CPU-s on the kernel side (first grading of it on this worker: {first:.2f} s)")
        lines.append(f"    {'stage':<32} {'wall s':>7} {'grader':>7} {'kernel':>7}")
        for name in STAGES:
            if name in stages:
                wall, cpu, kcpu = stages[name]
                lines.append(f"    {name:<32} {wall:7.2f} {cpu:7.2f} {kcpu:7.2f}")
        lines.append(f"    plain nbclient run of the same notebook: {plain['total'][0]:.2f} s wall, "
                     f"{plain['total'][1]:.2f} kernel CPU-s (kernel start {plain['kernel start'][0]:.2f} s, "
                     f"setup cell {plain['setup cell (imports)'][0]:.2f} s, the rest "
                     f"{plain['the other cells and shutdown'][0]:.2f} s)")
        lines.append(f"    ratio graded / plain: {total[0] / plain['total'][0]:.2f}x wall, "
                     f"{(total[1] + total[2]) / plain['total'][1]:.2f}x CPU")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assignments", nargs="*", default=None, help="default: every assignment")
    parser.add_argument("--student", default="ada", help="whose submissions (sample_class/), default ada")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    use_this_environment()
    load = os.getloadavg()[0]
    results = profile(args.assignments or course.assignments(), args.student)
    print(report(results, load))
    return 0


if __name__ == "__main__":
    sys.exit(main())
