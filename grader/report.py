"""The class report (``make report``): what the class gets wrong, on one HTML page.

``course-grader report [--course DIR]`` reads the course directory's gradebook
(``grader.classgrades``; manual grades count) and writes ``DIR/report/``:

- ``index.html``: per assignment how many submissions were graded; the score
  distribution; each exercise's pass rate; the most common diagnosed mistakes with
  counts and percentages ("31% of graded submissions: ... "), grouped by the check's
  diagnosis;
- ``scores.png``, ``pass_rate.png``, ``mistakes.png``: the same drawn by matplotlib;
- ``canvas.csv`` and ``moodle.csv``: the grade table for an LMS import (``grader.lms``).

A progress bar (tqdm, on stderr) runs while it works.

Diagnoses can quote a student's exception message, and ids come from folder names:
every such string is text. In the page it is escaped (``grader.sanitize.text_html``)
and the page allows no script, no request elsewhere and no form (a
Content-Security-Policy, first in ``<head>``); in the figures matplotlib draws it as
it is (``parse_math=False``: a ``$`` starts no mathtext). Whatever a student wrote,
the report is written.
"""
from __future__ import annotations

import base64
import hashlib
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from . import lms
from .classgrades import ClassGrades, NoGrades, gradebook_url, mistake_key, read
from .coursedir import default_root
from .sanitize import one_line, text_html

__all__ = ["NoGrades", "Mistake", "common_mistakes", "pass_rates", "write_report"]
TOP_MISTAKES = 12
# A Text object's parse_math=False draws "$" as a dollar sign (matplotlib >= 3.5).
PLAIN = {"parse_math": False}
STYLE = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;line-height:1.4}\n"
         "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}\n"
         "img{max-width:100%}")


def content_security_policy(style: str = STYLE) -> str:
    """The report's policy: no script, plugin, frame, font or connection at all; images
    from the report's own folder; only the page's own style sheet (by its hash); no
    form, no <base>. Source: OWASP Content Security Policy Cheat Sheet; CSP Level 3
    (a <meta http-equiv> policy, placed before anything it governs)."""
    digest = base64.b64encode(hashlib.sha256(style.encode()).digest()).decode()
    return (f"default-src 'none'; img-src 'self'; style-src 'sha256-{digest}'; "
            "base-uri 'none'; form-action 'none'")


@dataclass(frozen=True)
class Mistake:
    assignment_id: str
    exercise: str
    diagnosis: str  # the most frequent wording of the group
    count: int
    graded: int  # graded submissions of the assignment

    @property
    def unanswered(self) -> bool:
        """Left as released: counted, but listed after the mistakes a teacher can address."""
        return "not answered yet" in self.diagnosis

    @property
    def percent(self) -> float:
        return 100.0 * self.count / self.graded if self.graded else 0.0

    def sentence(self) -> str:
        return (f"{self.percent:.0f}% of graded submissions of {self.assignment_id} "
                f"({self.count} of {self.graded}): {self.diagnosis}")


def pass_rates(grades: ClassGrades) -> dict[tuple[str, str], tuple[int, int]]:
    """(assignment, exercise) -> (graded submissions with full points, graded submissions)."""
    rates = {}
    for assignment_id, per in grades.assignments.items():
        graded = grades.of(assignment_id)
        for exercise, top in per.items():
            rates[(assignment_id, exercise)] = (sum(s.points.get(exercise, 0.0) >= top for s in graded), len(graded))
    return rates


def common_mistakes(grades: ClassGrades) -> list[Mistake]:
    """Every diagnosed mistake with its count among graded submissions, most common first;
    exercises left unanswered come after every real mistake."""
    found = []
    for assignment_id in grades.assignments:
        graded = grades.of(assignment_id)
        groups: dict[tuple[str, str], Counter] = {}
        for s in graded:
            for exercise, diagnosis in s.diagnoses.items():
                groups.setdefault((exercise, mistake_key(diagnosis)), Counter())[diagnosis] += 1
        for (exercise, _), wordings in groups.items():
            found.append(Mistake(assignment_id, exercise, wordings.most_common(1)[0][0],
                                 sum(wordings.values()), len(graded)))
    return sorted(found, key=lambda m: (m.unanswered, -m.count, -m.percent, m.assignment_id, m.exercise))


def _figures(grades: ClassGrades, folder: Path, rates, mistakes: list[Mistake]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    ids = list(grades.assignments) or ["(none)"]
    cols = min(4, len(ids))
    rows = -(-len(ids) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows + 0.5), squeeze=False)
    for ax in axes.flat[len(ids):]:
        ax.set_visible(False)
    for ax, assignment_id in zip(axes.flat, grades.assignments):
        top = grades.max_score(assignment_id)
        scores = [s.score for s in grades.of(assignment_id)]
        ax.hist(scores, bins=[x - 0.5 for x in range(int(top) + 2)], color="#4878a8", edgecolor="white")
        ax.set_title(f"{one_line(assignment_id, 60)} ({len(scores)} graded)", fontsize=9, **PLAIN)
        ax.set_xlabel(f"score (of {top:g})")
        ax.set_xlim(-0.5, top + 0.5)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    for row in axes:
        row[0].set_ylabel("submissions")
    fig.suptitle("Score distribution per assignment")
    fig.tight_layout()
    written.append(folder / "scores.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)

    labels = [one_line(e, 80) for (_, e) in rates]
    values = [100.0 * p / n if n else 0.0 for p, n in rates.values()]
    fig, ax = plt.subplots(figsize=(7.5, 0.28 * len(labels) + 1.2))
    ax.barh(range(len(labels)), values, color="#59a14f")
    ax.set_yticks(range(len(labels)), labels, fontsize=8, **PLAIN)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("graded submissions that pass every hidden check (%)")
    ax.set_title("Pass rate per exercise")
    fig.tight_layout()
    written.append(folder / "pass_rate.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)

    top = mistakes[:TOP_MISTAKES]
    fig, ax = plt.subplots(figsize=(8.5, 0.5 * max(len(top), 1) + 1.2))
    ax.barh(range(len(top)), [m.percent for m in top], color="#e15759")
    ax.set_yticks(range(len(top)), [_label(m) for m in top], fontsize=7, **PLAIN)
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of the assignment's graded submissions (%)")
    ax.set_title("Most common mistakes")
    for i, m in enumerate(top):
        ax.text(m.percent + 1, i, f"{m.count}", va="center", fontsize=7)
    fig.tight_layout()
    written.append(folder / "mistakes.png")
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    return written


def _label(m: Mistake) -> str:
    """The exercise and what went wrong, on two short lines: a diagnosis reads "what was
    called: what went wrong", and the second half is the mistake."""
    import textwrap

    said = one_line(m.diagnosis).split(": ", 1)[-1]
    lines = textwrap.wrap(f"{one_line(m.exercise.split('-', 1)[-1], 60)}: {said}", 60)
    return "\n".join(lines[:2]) + ("…" if len(lines) > 2 else "")


def _html(grades: ClassGrades, rates, mistakes: list[Mistake]) -> str:
    e = text_html
    rows = []
    for a in grades.assignments:
        graded = grades.of(a)
        recorded = grades.of(a, graded_only=False)
        mean = sum(s.score for s in graded) / len(graded) if graded else 0.0
        rows.append(f"<tr><td>{e(a)}</td><td>{len(graded)}</td><td>{len(recorded) - len(graded)}</td>"
                    f"<td>{len(grades.students) - len(recorded)}</td>"
                    f"<td>{mean:.1f} / {grades.max_score(a):g}</td></tr>")
    rate_rows = "".join(f"<tr><td>{e(a)}</td><td><code>{e(x)}</code></td><td>{p} of {n}</td>"
                        f"<td>{100.0 * p / n if n else 0:.0f}%</td></tr>" for (a, x), (p, n) in rates.items())
    mistake_items = "".join(f"<li><strong>{m.percent:.0f}%</strong> ({m.count} of {m.graded}) of "
                            f"{e(m.assignment_id)}, <code>{e(m.exercise)}</code>: {e(m.diagnosis)}</li>"
                            for m in mistakes[:TOP_MISTAKES])
    return f"""<!DOCTYPE html>
<html><head><meta http-equiv="Content-Security-Policy" content="{content_security_policy()}">
<meta charset="utf-8"><title>Class report</title>
<style>{STYLE}</style></head><body>
<h1>Class report</h1>
<p>{len(grades.students)} students in the gradebook. Scores include late penalties and manual grades.</p>
<h2>Submissions</h2>
<table><tr><th>assignment</th><th>graded</th><th>not graded</th><th>no submission</th><th>mean score</th></tr>
{''.join(rows)}</table>
<h2>Score distribution</h2><img src="scores.png" alt="score distribution per assignment">
<h2>Pass rate per exercise</h2><img src="pass_rate.png" alt="pass rate per exercise">
<table><tr><th>assignment</th><th>exercise</th><th>passed</th><th>rate</th></tr>{rate_rows}</table>
<h2>Most common mistakes</h2><img src="mistakes.png" alt="most common mistakes">
<ol>{mistake_items}</ol>
<h2>Grade tables for your LMS</h2>
<p><a href="canvas.csv">canvas.csv</a> (Grades &gt; Import) and <a href="moodle.csv">moodle.csv</a>
(Grades &gt; Import &gt; CSV file). Empty cells: not graded or no submission.
The LMS ids are empty unless you pass <code>--roster</code>.</p>
</body></html>
"""


def write_report(course_dir: Path | str | None = None, roster: Path | None = None,
                 progress: bool = True) -> list[Path]:
    """Write ``report/`` in the course directory (see the module's docs; default: the one
    nbgrader_config.py names); return the files written.

    Raises:
        NoGrades: the course directory has no gradebook yet.
        grader.lms.BadRoster: ``roster`` cannot be read.
    """
    from tqdm import tqdm

    people = lms.read_roster(roster) if roster else {}
    grades = read(gradebook_url(course_dir), progress=progress)
    folder = (Path(course_dir).resolve() if course_dir is not None else default_root()) / "report"
    folder.mkdir(parents=True, exist_ok=True)
    with tqdm(total=4, desc="class report", unit="step", disable=not progress, file=sys.stderr) as bar:
        rates, mistakes = pass_rates(grades), common_mistakes(grades)
        bar.update()
        written = _figures(grades, folder, rates, mistakes)
        bar.update()
        (folder / "index.html").write_text(_html(grades, rates, mistakes), encoding="utf-8")
        written.insert(0, folder / "index.html")
        bar.update()
        written += [lms.write_canvas(grades, folder / "canvas.csv", people),
                    lms.write_moodle(grades, folder / "moodle.csv", people)]
        bar.update()
    return written
