"""Whole-course throughput: the sample class graded by stock nbgrader and by ours, in one run.

    .venv/bin/python bench/throughput.py [--assignments ID ...] [--students ID ...] [--one-worker]
                                         [--timeline] [--no-stock]

The class is sample_class/ as it is: every student's submission of every assignment
(the endless loop, the broken file and the missing folders included). In this one run,
one after the other on the same machine:

- stock: nbgrader 0.9.6's autograde with its default preprocessors (the hidden checks
  run inside the student's kernel, no sandbox), then its feedback, one submission after
  another in one process (``bench/stock.py``);
- ours: ``grade_class`` with one worker per core (trusted verdicts, sandbox, forked
  kernels, feedback), timed end to end, Dask's cluster start and stop included;
- with ``--one-worker``, ours with one worker as well.

Ours must give every row the score sample_class/*/expected.json records. Peak memory
of a worker is the most its process tree held at once, by proportional set size (PSS:
a page shared by the fork server and its kernels counts once, split between them),
sampled every second. "cores got" is the CPU seconds of this process and everything it
started, per second of wall time: on a machine shared with other work, it shows how
much of the machine a run actually had. It can miss ours' forked kernels: they are
reaped inside their worker's fork server, whose count reaches this process only when the
fork server is reaped in turn (once, on 01+06, it counted 55 CPU-s where the
units' own counts added up to 100). The timeline's units' CPU (each worker's own, each
kernel's from its cgroup) does not depend on that. The load average before and after is
printed: compare ratios, measured side by side, not seconds. Target: ours with one
worker per core at least 3x stock's submissions per minute.

``--timeline`` prints, for each run of ours, every unit on its worker (start, end, CPU
of the worker and of the kernel, when the collector recorded it) and where each worker
sat idle: before its first unit, between units, after its last; and stock's slowest
submissions. ``--no-stock`` runs ours alone (no ratio), to look at its timeline.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import shutil
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from grader import course  # noqa: E402
from grader.grade import grade_class  # noqa: E402
from grader.stage import BadSubmission  # noqa: E402
from grader.names import shown  # noqa: E402 - student folder names are data in a terminal line
from bench.stock import grade_one, stock_workspace  # noqa: E402

TARGET = 3.0


def make_class(folder: Path, assignments: list[str], students: list[str]) -> dict[tuple[str, str], dict]:
    """The sample class's chosen students and assignments copied to ``folder``; returns
    (student, assignment) -> the row sample_class/<student>/expected.json records."""
    expected = {}
    for student in students:
        recorded = json.loads((course.SAMPLE_CLASS / student / "expected.json").read_text())
        for assignment_id in assignments:
            source = course.SAMPLE_CLASS / student / assignment_id
            if source.is_dir():
                shutil.copytree(source, folder / student / assignment_id, symlinks=True)
            expected[(student, assignment_id)] = recorded[assignment_id]
    return expected


class Sampler:
    """Every second, the PSS of each worker's process tree (a worker is a direct child of
    this process that multiprocessing spawned; with ``self_tree``, this process is the
    one worker). ``cores_used``: the CPU seconds of this process and of every process it
    started and reaped (its workers, their fork servers and kernels: each is reaped by
    its parent in this tree), per second of wall time."""

    def __init__(self, self_tree: bool = False):
        self.self_tree, self.peaks, self._stop = self_tree, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._wall, self._cpu = time.perf_counter(), _rusage()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.cores_used = (_rusage() - self._cpu) / (time.perf_counter() - self._wall)

    def _roots(self) -> list[psutil.Process]:
        me = psutil.Process()
        if self.self_tree:
            return [me]
        return [p for p in me.children() if "multiprocessing.spawn" in " ".join(_cmdline(p))
                and "resource_tracker" not in " ".join(_cmdline(p))]

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for root in self._roots():
                total = sum(_pss(p) for p in [root, *_descendants(root)])
                self.peaks[root.pid] = max(self.peaks.get(root.pid, 0), total)


def _rusage() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _pss(p: psutil.Process) -> int:
    """Proportional set size of a process, bytes (its resident size if unreadable)."""
    try:
        with open(f"/proc/{p.pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return p.memory_info().rss
    except psutil.Error:
        return 0


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def _descendants(p: psutil.Process) -> list[psutil.Process]:
    try:
        return p.children(recursive=True)
    except psutil.Error:
        return []


def stock(class_dir: Path, work: Path, assignments: list[str], students: list[str],
          seconds: dict[str, float]) -> tuple[int, int]:
    """Stock nbgrader grades (autograde, then feedback) every submission it can read, one
    after another; returns (graded, not graded: a file stock cannot open or a failed run).
    ``seconds`` gets each submission's wall seconds ("student/assignment")."""
    graded = failed = 0
    for assignment_id in assignments:
        folders = {}
        for student in students:
            folder = class_dir / student / assignment_id
            if folder.is_dir():
                folders[student] = folder
        try:
            api = stock_workspace(work / assignment_id, assignment_id, {})
        except Exception as error:  # noqa: BLE001 - reported; the run goes on
            print(f"stock could not set up {assignment_id}: {error}", file=sys.stderr)
            failed += len(folders)
            continue
        for student, folder in folders.items():
            began = time.perf_counter()
            try:  # as ours, stock gets the submission through staging (a bad file is refused there)
                stock_stage(folder, work / assignment_id, student, assignment_id)
                grade_one(api, assignment_id, student)
                graded += 1
            except (BadSubmission, AssertionError):
                failed += 1
            seconds[f"{student}/{assignment_id}"] = time.perf_counter() - began
    return graded, failed


def stock_stage(folder: Path, work: Path, student: str, assignment_id: str) -> None:
    from grader.stage import stage

    stage(folder, work / "submitted" / student / assignment_id, course.notebook_names(assignment_id), None)


class Timeline(logging.Handler):
    """The collector's record of each unit (``grader.grade``'s debug line): where and when
    it ran, its CPU, and when the collector received and recorded it."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.units: list[dict] = []

    def __enter__(self):
        self.start = time.time()
        logger = logging.getLogger("grader.grade")
        self._level, logger.level = logger.level, logging.DEBUG
        logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.end = time.time()
        logger = logging.getLogger("grader.grade")
        logger.removeHandler(self)
        logger.level = self._level

    def emit(self, record: logging.LogRecord) -> None:
        if hasattr(record, "unit"):
            self.units.append({"unit": shown("/".join(record.unit)), "received": record.received,
                               "recorded": record.recorded, **record.ran})

    def report(self, label: str) -> str:
        """Each unit on its worker (seconds from the run's start), then where the workers sat idle."""
        t = lambda x: x - self.start  # noqa: E731
        ran = sorted((u for u in self.units if "worker" in u), key=lambda u: (u["worker"], u["start"]))
        workers = sorted({u["worker"] for u in ran})
        lines = [f"timeline of {label} (seconds from grade_class's call; CPU seconds of the worker and of the kernel):",
                 f"  {'worker':>6} {'unit':<28} {'start':>6} {'end':>6} {'wall':>6} {'grader':>7} {'kernel':>7}"
                 f" {'recorded':>8}"]
        for u in ran:
            lines.append(f"  {workers.index(u['worker']):>6} {u['unit']:<28} {t(u['start']):6.1f} {t(u['end']):6.1f} "
                         f"{u['end'] - u['start']:6.1f} {u['grader_cpu']:7.1f} {u['kernel_cpu']:7.1f} "
                         f"{t(u['recorded']):8.1f}")
        whole = self.end - self.start
        if not ran:
            return "\n".join(lines + ["  no unit came back with its timeline"])
        busy = {w: sum(u["end"] - u["start"] for u in ran if u["worker"] == w) for w in workers}
        first = {w: min(u["start"] for u in ran if u["worker"] == w) for w in workers}
        last = {w: max(u["end"] for u in ran if u["worker"] == w) for w in workers}
        cpu = sum(u["grader_cpu"] + u["kernel_cpu"] for u in ran)
        collector = sum(u["recorded"] - u["received"] for u in self.units)
        for w in workers:
            gaps = (last[w] - first[w]) - busy[w]
            lines.append(f"  worker {workers.index(w)}: {busy[w]:.1f} s in units of {whole:.1f} s; idle "
                         f"{t(first[w]):.1f} s before its first unit, {gaps:.1f} s between units, "
                         f"{self.end - last[w]:.1f} s after its last")
        lines.append(f"  units' CPU (workers and kernels): {cpu:.1f} s = {cpu / whole:.2f} cores over the run; "
                     f"the collector spent {collector:.1f} s recording; "
                     f"the last unit ended {self.end - max(last.values()):.1f} s before grade_class returned")
        return "\n".join(lines)


def ours(class_dir: Path, out: Path, jobs: int, expected: dict) -> tuple[int, list[str]]:
    """``grade_class`` on the class; returns (rows, rows whose score differs from expected)."""
    rows = grade_class(out, submitted=class_dir, progress=False, jobs=jobs)
    wrong = [f"{r.student_id}/{r.assignment_id}: {r.score:g} (expected {expected[(r.student_id, r.assignment_id)]['score']:g}"
             f", status {r.status!r})"
             for r in rows if (r.student_id, r.assignment_id) in expected
             and r.score != expected[(r.student_id, r.assignment_id)]["score"]]
    return len(rows), wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--assignments", nargs="*", default=None, help="default: every assignment")
    parser.add_argument("--students", nargs="*", default=None, help="default: every student of sample_class/")
    parser.add_argument("--one-worker", action="store_true", help="also ours with a single worker")
    parser.add_argument("--timeline", action="store_true",
                        help="print each unit of ours: its worker, start, end and CPU, and the workers' idle time")
    parser.add_argument("--no-stock", action="store_true",
                        help="ours only (no ratio): e.g. with --timeline, to see where ours waits")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    assignments = args.assignments or course.assignments()
    students = args.students or sorted(p.name for p in course.SAMPLE_CLASS.iterdir() if p.is_dir())
    cores = os.cpu_count() or 1
    results = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        class_dir = Path(scratch) / "class"
        expected = make_class(class_dir, assignments, students)
        submissions = sum(1 for s in students for a in assignments if (class_dir / s / a).is_dir())
        each: dict[str, float] = {}
        if not args.no_stock:
            with Sampler(self_tree=True) as sampled:
                start = time.perf_counter()
                graded, failed = stock(class_dir, Path(scratch) / "stock", assignments, students, each)
                seconds = time.perf_counter() - start
            results.append((f"stock nbgrader ({graded} graded, {failed} refused)", seconds, sampled))
            if args.timeline:
                slowest = sorted(each.items(), key=lambda kv: -kv[1])[:5]
                print(f"stock's slowest submissions (wall s): {', '.join(f'{shown(k)} {v:.1f}' for k, v in slowest)}",
                      flush=True)
        wrong: list[str] = []
        for jobs in ([1] if args.one_worker and cores > 1 else []) + [cores]:
            with Sampler() as sampled, Timeline() as timeline:
                start = time.perf_counter()
                _, mistakes = ours(class_dir, Path(scratch) / f"ours-{jobs}", jobs, expected)
                seconds = time.perf_counter() - start
            wrong += mistakes
            results.append((f"ours, {jobs} worker{'s' if jobs > 1 else ''}", seconds, sampled))
            if args.timeline:
                print(timeline.report(results[-1][0]), flush=True)
    base = None if args.no_stock else submissions / results[0][1] * 60
    print(f"throughput on the sample class: {submissions} submissions of {len(assignments)} assignments by "
          f"{len(students)} students (autograde + feedback), {cores} cores, load average {load[0]:.1f} "
          f"before and {os.getloadavg()[0]:.1f} after:")
    print(f"  {'grader':<34} {'wall s':>7} {'subs/min':>9} {'vs stock':>9} {'cores got':>10}   "
          "peak memory of one worker (PSS, its kernels included)")
    for label, seconds, sampled in results:
        rate = submissions / seconds * 60
        mib = sorted(v / 2**20 for v in sampled.peaks.values())
        memory = (f"{mib[-1]:.0f} MiB" + (f" (workers: {', '.join(f'{m:.0f}' for m in mib)})" if len(mib) > 1 else "")
                  if mib else "not sampled")
        versus = f"{rate / base:8.2f}x" if base else f"{'-':>9}"
        print(f"  {label:<34} {seconds:7.1f} {rate:9.1f} {versus} {sampled.cores_used:10.2f}   {memory}")
    if base:
        ratio = (submissions / results[-1][1] * 60) / base
        print(f"  ours with one worker per core / stock: {ratio:.2f}x (target >= {TARGET}x: "
              f"{'met' if ratio >= TARGET else 'MISSED'})")
    if wrong:
        print(f"  ours graded {len(wrong)} rows differently from sample_class/*/expected.json: {wrong[:5]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
