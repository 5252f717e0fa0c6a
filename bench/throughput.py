"""Submissions graded per minute: stock nbgrader, ours with 1 worker, ours with one per core.

    .venv/bin/python bench/throughput.py [--copies N]      (part of `make bench`)

The class is generated: every quick sample submission of notebook 01 (all but the
endless loop and the broken file) copied under new student ids, 9 x N of them (45 by
default). All three grade it in this one run, one after the other:

- stock: nbgrader 0.9.6's autograde with its default preprocessors (the hidden
  checks run inside the student's kernel, no sandbox), then its feedback, one
  submission after another in one process, as bench/grading.py runs it;
- ours, 1 worker: ``grade_class`` with jobs=1 (trusted verdicts, sandbox, feedback);
- ours, one worker per core: ``grade_class`` with jobs=os.cpu_count().

Ours is timed end to end, Dask cluster start and stop included. Peak memory is the
largest resident set of one worker's process tree (the worker and its kernel),
sampled every 0.2 s. "cores got" is the CPU time of this process and everything it
started, per second of wall time: on a machine shared with other work, it shows
whether a slow run lacked CPU. Target: ours with one worker per core at least 1.7x
stock.
"""
from __future__ import annotations

import argparse
import os
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
from bench.stock import grade_one, stock_workspace  # noqa: E402

ASSIGNMENT = "01_similarity"
QUICK = ["ada", "ben", "chloe", "dev", "emma", "femi", "hana", "jo", "kai"]  # not gus (timeout), ivan (bad JSON)
TARGET = 1.7


def make_class(folder: Path, copies: int) -> dict[str, str]:
    """New student id -> the sample student whose notebook 01 it hands in."""
    made = {}
    for n in range(copies):
        for student in QUICK:
            made[f"{student}-{n:02d}"] = student
            shutil.copytree(course.SAMPLE_CLASS / student / ASSIGNMENT, folder / f"{student}-{n:02d}" / ASSIGNMENT)
    return made


class Sampler:
    """Every 0.2 s: the resident memory of each worker's process tree (a worker is a
    direct child of this process that multiprocessing spawned; with ``self_tree``, this
    process is the one worker), and the CPU time of everything this process started.

    ``cores_used``: CPU seconds of this process and all its descendants (kernels
    included) per second of wall time. On a machine shared with other work it shows
    how many of the cores the run actually got.
    """

    def __init__(self, self_tree: bool = False):
        self.self_tree, self.peaks, self._stop = self_tree, {}, threading.Event()
        self._cpu: dict[int, float] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._wall, self._own = time.perf_counter(), time.process_time()
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        wall = time.perf_counter() - self._wall
        self.cores_used = (sum(self._cpu.values()) + time.process_time() - self._own) / wall

    def _roots(self) -> list[psutil.Process]:
        me = psutil.Process()
        if self.self_tree:
            return [me]
        return [p for p in me.children() if "multiprocessing.spawn" in " ".join(_cmdline(p))
                and "resource_tracker" not in " ".join(_cmdline(p))]

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for p in _descendants(psutil.Process()):
                try:
                    times = p.cpu_times()
                    self._cpu[p.pid] = times.user + times.system
                except psutil.Error:
                    pass
            for root in self._roots():
                total = 0
                for p in [root, *_descendants(root)]:
                    try:
                        total += p.memory_info().rss
                    except psutil.Error:
                        pass
                self.peaks[root.pid] = max(self.peaks.get(root.pid, 0), total)


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


def stock(class_dir: Path, work: Path, students: list[str]) -> float:
    """Seconds for stock nbgrader to autograde and give feedback to every student."""
    api = stock_workspace(work, ASSIGNMENT, {s: class_dir / s / ASSIGNMENT for s in students})
    start = time.perf_counter()
    for student in students:
        grade_one(api, ASSIGNMENT, student)
    return time.perf_counter() - start


def ours(class_dir: Path, out: Path, jobs: int, expected: dict[str, int]) -> float:
    start = time.perf_counter()
    rows = grade_class(out, submitted=class_dir, progress=False, jobs=jobs)
    seconds = time.perf_counter() - start
    wrong = [r.student_id for r in rows if r.score != expected[r.student_id]]
    assert not wrong, f"ours graded these differently from sample_class/*/expected.json: {wrong}"
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=5, help="copies of each quick sample submission (default 5)")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import json

    cores = os.cpu_count() or 1
    recorded = {s: json.loads((course.SAMPLE_CLASS / s / "expected.json").read_text())[ASSIGNMENT]["score"]
                for s in QUICK}
    results = []
    load = os.getloadavg()
    with tempfile.TemporaryDirectory() as scratch:
        class_dir = Path(scratch) / "class"
        made = make_class(class_dir, args.copies)
        expected = {new: recorded[old] for new, old in made.items()}
        n = len(made)
        with Sampler(self_tree=True) as sampled:
            seconds = stock(class_dir, Path(scratch) / "stock", sorted(made))
        results.append(("stock nbgrader autograde", seconds, sampled))
        for jobs in (1, cores):
            label = f"ours, {jobs} worker{'s' if jobs > 1 else ''}"
            with Sampler() as sampled:
                seconds = ours(class_dir, Path(scratch) / f"ours-{jobs}", jobs, expected)
            results.append((label, seconds, sampled))
    base = n / results[0][1] * 60
    print(f"throughput on {n} submissions of {ASSIGNMENT} (autograde + feedback), {cores} cores, "
          f"load average {load[0]:.1f} before and {os.getloadavg()[0]:.1f} after:")
    print(f"  {'grader':<26} {'wall s':>7} {'subs/min':>9} {'vs stock':>9} {'cores got':>10}   "
          "peak RSS of one worker (with its kernel)")
    for label, seconds, sampled in results:
        rate = n / seconds * 60
        mib = sorted(v / 2**20 for v in sampled.peaks.values())
        memory = (f"{mib[-1]:.0f} MiB" + (f" (workers: {', '.join(f'{m:.0f}' for m in mib)})" if len(mib) > 1 else "")
                  if mib else "not sampled")
        print(f"  {label:<26} {seconds:7.1f} {rate:9.1f} {rate / base:8.2f}x {sampled.cores_used:10.2f}   {memory}")
    ratio = (n / results[-1][1] * 60) / base
    print(f"  ours with one worker per core / stock: {ratio:.2f}x (target >= {TARGET}x: "
          f"{'met' if ratio >= TARGET else 'MISSED'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
