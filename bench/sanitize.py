"""What student markup costs the feedback page: ratios measured side by side in one run.

    .venv/bin/python bench/sanitize.py [--rounds N]      (part of `make bench`)

Issue 32's reports, as tests/test_html_safety.py builds them: a feedback page with one
markdown cell of 16,000 nested <b><i> (93 KiB) against the same page with as much honest
prose (markdown, code, math, links), and with twice the payload against once; then each
shape of markup whose cleaning was quadratic (test_html_safety.COSTLY) at four times its
size against once. Rounds alternate which side goes first, so that machine load hits both
alike; each ratio printed is the median of the per-round ratios of CPU times. Linear is
at most 1 for the first, about 2 for the second and at most about 4 for the rest (the
deep shapes stop at MAX_DEPTH and cost less); a square would be 4 and 16. The suite
holds looser bounds (twice, three times, eight times) that load cannot cross.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import nbformat  # noqa: E402

from grader.sanitize import clean_html  # noqa: E402
from tests.test_html_safety import COSTLY, feedback_page, graded, honest  # noqa: E402

PAYLOAD = "<b><i>" * 16_000
PROSE = "The **mask** sets `scores[i, j]` to $-\\infty$ where *j > i*: see [the docs](https://pytorch.org/).\n\n"


def cpu(work) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


def page(text: str):
    nb = graded(honest(cells=9), message="f(a) returned the wrong shape")
    nb.cells.insert(3, nbformat.v4.new_markdown_cell(text))
    return lambda: feedback_page(nb)


def ratio(top, bottom, rounds: int) -> float:
    ratios = []
    for i in range(rounds):
        if i % 2:
            b, t = cpu(bottom), cpu(top)
        else:
            t, b = cpu(top), cpu(bottom)
        ratios.append(t / b)
    return statistics.median(ratios)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    page(PROSE)()  # the exporter is built once, outside the rounds
    prose = PROSE * (len(PAYLOAD) // len(PROSE))
    print(f"{'feedback page, 16,000 nested <b><i> / as much prose':<58} "
          f"{ratio(page(PAYLOAD), page(prose), args.rounds):6.2f}   (linear: 1 or less)")
    print(f"{'feedback page, twice the payload / once':<58} "
          f"{ratio(page(PAYLOAD * 2), page(PAYLOAD), args.rounds):6.2f}   (linear: about 2)")
    for name, make, k in COSTLY:
        big, small = make(4 * k), make(k)
        print(f"{'clean_html, ' + name + ', 4x / 1x':<58} "
              f"{ratio(lambda: clean_html(big), lambda: clean_html(small), args.rounds):6.2f}   (linear: 4 or less)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
