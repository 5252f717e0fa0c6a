"""Time to grade one full submission: our trusted, sandboxed grader against stock nbgrader.

    .venv/bin/python bench/grading.py [--rounds N]      (part of `make bench`)

Both grade the same correct submission of notebook 01 (sample_class/ada) in the same
process, alternately, so that machine load hits both alike. Stock is nbgrader 0.9.6
with its default preprocessors: the hidden checks run inside the student's kernel.
Ours adds questions from the course secret, the bubblewrap sandbox, output limits
and the verdict outside the kernel. Both generate feedback afterwards, as a grading
run does. Prints the median seconds of each and their ratio (target: at most 1.3).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from grader import course  # noqa: E402
from grader.coursedir import CourseDir  # noqa: E402
from grader.grade import Grader  # noqa: E402
from bench.stock import grade_one, stock_workspace  # noqa: E402

ASSIGNMENT = "01_similarity"
STUDENT = "ada"


def stock_grader(work: Path):
    """nbgrader's defaults, pointed at a workspace: returns a function grading once."""
    api = stock_workspace(work, ASSIGNMENT, {STUDENT: course.SAMPLE_CLASS / STUDENT / ASSIGNMENT})
    return lambda: grade_one(api, ASSIGNMENT, STUDENT)


def ours_grader(work: Path):
    grader = Grader(CourseDir.open(work, submitted=course.SAMPLE_CLASS))

    def grade() -> None:
        row = grader.grade(course.SAMPLE_CLASS / STUDENT / ASSIGNMENT, STUDENT, ASSIGNMENT)
        assert row.score == row.max_score, row.status

    return grade


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as scratch:
        graders = {"stock nbgrader": stock_grader(Path(scratch) / "stock"),
                   "ours (trusted, sandboxed)": ours_grader(Path(scratch) / "ours")}
        times: dict[str, list[float]] = {name: [] for name in graders}
        for name, grade in graders.items():  # warm-up: imports, caches
            grade()
        for _ in range(args.rounds):
            for name, grade in graders.items():
                start = time.perf_counter()
                grade()
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    print(f"grading one submission of {ASSIGNMENT} (autograde + feedback), "
          f"median of {args.rounds} alternating rounds:")
    for name, median in medians.items():
        print(f"  {name:<28} {median:6.2f} s   (min {min(times[name]):.2f}, max {max(times[name]):.2f})")
    ratio = medians["ours (trusted, sandboxed)"] / medians["stock nbgrader"]
    print(f"  ratio ours / stock: {ratio:.2f}x (target <= 1.3x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
