"""What an attack achieved, measured on a grader's outputs: the same judges for ours and stock.

Each attack in ``tests/corpora/tamper.py`` names the harm it is after (``Attack.harm``);
``judge(harm, outcome)`` says in a few words what it got, and ``harmed`` whether that is
a win for the attacker. An ``Outcome`` is what any grader leaves behind for one
submission: its points, its status, the feedback page, the autograded notebook, the
grade table rows (CSV) and the terminal table. The judges read only those, so the
same attack can be scored on stock nbgrader (bench/tamper_vs_stock.py) and on ours
(tests/test_corpora.py).

Markers the attacks print when they succeed (the judges look for them in the outputs):
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

SHADOW_MARK = "SHADOW RAN"  # a submitted file ran as a module (at start-up or on import)
HOST_WRITE_MARK = "HOST WRITE"  # the kernel wrote outside its scratch (connection file, socket folder)
HELD_MARK = "HELD"  # "HELD 7.5 GiB": memory the kernel's processes held at once
BUDGET_MARK = "TICK"  # "TICK <monotonic seconds>": printed by each cell of the time-budget attack
READ_MARK = "READ:"  # "READ: <text>": a linked file's contents, printed by the kernel
SECRET = "ROOT-ONLY-7f3a9c"  # the contents of the root-only file the link attacks point at
SOLUTION_TEXT = "### BEGIN SOLUTION"  # the instructor's notebook, if it leaks into feedback
SURVIVOR_MARK = "attention-course-survivor-3c1e"  # argv of the process that tries to outlive its kernel

# Cells a spreadsheet would run as a formula (OWASP, CSV injection).
FORMULA = re.compile(r"^[=+\-@\t\r]")
# What a terminal would act on: C0 and C1 controls (escape sequences), DEL, bidi overrides.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


@dataclass
class Outcome:
    """What a grader left for one submission."""

    points: dict[str, float | None] = field(default_factory=dict)
    status: str = ""
    feedback: str | None = None  # the feedback HTML
    autograded: dict | None = None  # the autograded notebook's JSON
    csv_rows: list[list[str]] = field(default_factory=list)  # every grades-CSV row of this class
    table: str = ""  # the grade table as printed to the terminal (all students)
    reference_feedback: str | None = None  # an honest student's feedback from the same grader


# --- reading outputs ----------------------------------------------------------------

def outputs_text(nb: dict | None) -> str:
    """Every text the notebook's code cells showed (streams, plain text, errors)."""
    if not nb:
        return ""
    parts = []
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []) if cell.get("cell_type") == "code" else []:
            if out.get("output_type") == "stream":
                parts.append("".join(out.get("text", "")))
            elif out.get("output_type") == "error":
                parts.append(f"{out.get('ename')}: {out.get('evalue')}")
            else:
                parts.append("".join(out.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


class _Active(HTMLParser):
    """Collects what in a page can run or fetch by itself."""

    URL_ATTRS = {"src", "href", "action", "formaction", "data", "srcdoc", "poster", "background",
                 "xlink:href", "srcset", "lowsrc", "codebase", "ping"}
    ACTIVE_TAGS = {"script", "iframe", "frame", "object", "embed", "base", "form", "applet", "portal"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._script: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = [(k.lower(), v or "") for k, v in attrs]
        if tag == "script":
            self._script = [json.dumps(sorted(attrs))]
        elif tag in self.ACTIVE_TAGS:
            self.found.append(f"<{tag} {sorted(attrs)}>")
        if tag == "meta" and any(k == "http-equiv" and v.lower() == "refresh" for k, v in attrs):
            self.found.append(f"<meta refresh {attrs}>")
        if tag == "link" and any(k == "rel" and "stylesheet" in v.lower() for k, v in attrs):
            self.found.append(f"<link {sorted(attrs)}>")
        for key, value in attrs:
            v = re.sub(r"[\s\x00-\x1f]", "", value).lower()
            if key.startswith("on"):
                self.found.append(f"<{tag} {key}=...>")
            elif key in self.URL_ATTRS and (v.startswith(("javascript:", "vbscript:", "data:text/html", "//"))
                                             or (v.startswith(("http:", "https:")) and tag != "a")):
                self.found.append(f"<{tag} {key}={value[:60]}>")
            elif key == "style" and "url(" in v:
                self.found.append(f"<{tag} style=url(...)>")

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag == "script":
            self.handle_endtag(tag)

    def handle_data(self, data):
        if self._script is not None:
            self._script.append(data)

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.found.append("<script>" + "".join(self._script))
            self._script = None


def active_content(page: str | None, reference: str | None = None) -> list[str]:
    """What in ``page`` can run or fetch by itself, less what ``reference`` (an honest
    student's page from the same grader: the template's own scripts) has too."""
    if not page:
        return []
    parser = _Active()
    parser.feed(page)
    found = parser.found
    if reference:
        ref = _Active()
        ref.feed(reference)
        known = list(ref.found)
        left = []
        for item in found:
            if item in known:
                known.remove(item)
            else:
                left.append(item)
        found = left
    return found


# --- the judges ---------------------------------------------------------------------

def judge(harm: str, outcome: Outcome, targets: list[str]) -> tuple[str, bool]:
    """(what the attack achieved, in a few words; whether that is a win for the attacker)."""
    text = outputs_text(outcome.autograded)
    if harm == "points":
        got = [outcome.points.get(t) for t in targets]
        if any(g is None for g in got):
            return "no score", False
        return f"{sum(got):g} on its targets", sum(got) > 0
    if harm == "script":
        found = active_content(outcome.feedback, outcome.reference_feedback)
        return (f"{len(found)} active elements in feedback" if found else "no active content"), bool(found)
    if harm == "shadow":
        ran = SHADOW_MARK in text
        return ("its module ran" if ran else "its module never ran"), ran
    if harm == "host_write":
        wrote = [line for line in text.splitlines() if HOST_WRITE_MARK in line]
        return (wrote[0][:60] if wrote else "nothing written outside the scratch"), bool(wrote)
    if harm == "memory":
        held = [float(m) for m in re.findall(rf"{HELD_MARK} ([\d.]+) GiB", text)]
        most = max(held, default=0.0)
        return f"held {most:g} GiB at once", most > 4.0
    if harm == "budget":
        ticks = [float(t) for t in re.findall(rf"{BUDGET_MARK} ([\d.]+)", text)]
        span = (max(ticks) - min(ticks)) if len(ticks) > 1 else 0.0
        return f"{len(ticks)} cells ran over {span:.0f} s", span > 70
    if harm == "leak":
        places = {"status": outcome.status, "feedback": outcome.feedback or "", "outputs": text}
        leaked = [where for where, t in places.items() if SECRET in t or SOLUTION_TEXT in t]
        return ("leaked into " + ", ".join(leaked) if leaked else "nothing leaked"), bool(leaked)
    if harm == "graded_as_own":
        got = [p for p in outcome.points.values() if p is not None]
        return f"{sum(got):g} points", sum(got) > 0
    if harm == "formula":
        cells = [c for row in outcome.csv_rows for c in row if FORMULA.match(c)]
        return (f"{len(cells)} formula cells in the CSV" if cells else "no formula cell"), bool(cells)
    if harm == "control":
        places = [outcome.table, outcome.status] + [c for row in outcome.csv_rows for c in row]
        bad = sum(len(CONTROL.findall(p)) for p in places)
        return (f"{bad} control characters in table/CSV" if bad else "no control character"), bool(bad)
    if harm == "rows":
        return f"{len(outcome.csv_rows)} rows", False  # judged by the test on the whole class
    if harm == "batch":
        return ("graded, the batch went on" if outcome.status else "no row"), not outcome.status
    raise ValueError(f"unknown harm {harm!r}")
