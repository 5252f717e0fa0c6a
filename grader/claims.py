"""Claims in the prose, checked against the run: no result typed in by hand.

A sentence of a markdown cell that states what an experiment showed (a number, a ranking,
"the gradient shrinks twenty orders of magnitude") is either printed by the code from the
learner's own run, or tagged as a **claim** in that cell's metadata, with a Python
expression that one run of the solution notebook evaluates where the claim stands::

    "metadata": {"course": {"claims": [
        {"text": "shrinks by more than twenty orders of magnitude",
         "check": "g_raw[0] / g_raw[-1] > 1e20"},
        {"text": "$e_{it}\\cdot e_{animal} = 5.35$",
         "value": "f'{E[it] @ E[animal]:.2f}'"},
        {"text": "the gradients stay level", "check": "max(grads) / min(grads) < 2",
         "after": "encoder-fig-depth"}
    ]}}

- ``text``: words of the cell, verbatim (any run of spaces and line breaks counts as one
  space). A claim whose words are gone from the prose fails, so prose and claim are edited
  together.
- ``check``: an expression that must be true (a bool, a numpy bool or a 0-d tensor of one).
- ``value``: an expression whose value, a str or an int, must occur in ``text``; for a
  float, format it as the prose writes it (``f"{x:.2f}"``).
- ``after`` (optional): the id of the code cell after which the expression is evaluated;
  by default the first code cell below the markdown cell (the one the prose introduces), or
  the end of the notebook when none follows.

Exactly one of ``check`` and ``value``. The expressions see the notebook's namespace as it
is at that point of the run. ``tests/test_prose_claims.py`` runs every solution notebook
that has claims once (nbclient, a fresh kernel; a run is kept until something it depends on
changes, tests/runs.py) and fails on the first claim that does not hold;
``python -m grader.claims NOTEBOOK...`` prints every claim's verdict, for the author.
"""
from __future__ import annotations

import copy
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import nbformat

MARK = "course-claims: "   # starts the one line each probe cell prints
KINDS = ("check", "value")


@dataclass(frozen=True)
class Claim:
    """One tagged claim: the markdown cell it belongs to, its words and its expression."""
    cell: str          # the markdown cell's id
    text: str
    kind: str          # "check" or "value"
    expression: str
    after: str | None  # the code cell after which it is evaluated (None: end of the notebook)


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    holds: bool
    why: str           # what the run gave, or what is wrong with the claim

    def __str__(self) -> str:
        return f"{'ok  ' if self.holds else 'FAIL'} [{self.claim.cell}] {self.claim.text!r}: {self.why}"


def claims(nb) -> list[Claim]:
    """Every claim tagged in the markdown cells of ``nb``, in cell order.

    Raises:
        ValueError: a claim is malformed (no text, not exactly one of check and value, an
            ``after`` that names no code cell, a cell without an id).
    """
    code_ids = [c.get("id") for c in nb.cells if c.cell_type == "code"]
    found = []
    for index, cell in enumerate(nb.cells):
        tagged = cell.metadata.get("course", {}).get("claims")
        if not tagged:
            continue
        if cell.cell_type != "markdown" or not cell.get("id"):
            raise ValueError(f"cell {index}: claims belong to markdown cells with an id")
        below = next((c.get("id") for c in nb.cells[index + 1:] if c.cell_type == "code"), None)
        for entry in tagged:
            kinds = [k for k in KINDS if k in entry]
            if not entry.get("text") or len(kinds) != 1 or set(entry) - {"text", "after", *KINDS}:
                raise ValueError(f"cell {cell.id}: a claim is {{text, check or value, after?}}, got {entry}")
            after = entry.get("after", below)
            if after is not None and after not in code_ids:
                raise ValueError(f"cell {cell.id}: 'after' names no code cell: {after!r}")
            found.append(Claim(cell.id, entry["text"], kinds[0], entry[kinds[0]], after))
    return found


def _probe_source(expressions: list[str]) -> str:
    """A code cell that evaluates ``expressions`` in the notebook's namespace and prints one
    line, MARK + a JSON list of [kind of result, result]. It leaves no name behind."""
    return (
        "def __course_claims(expressions, namespace):\n"
        "    import json\n"
        "    results = []\n"
        "    for expression in expressions:\n"
        "        try:\n"
        "            value = eval(expression, namespace)\n"
        "            value = value.item() if hasattr(value, 'item') and getattr(value, 'ndim', 0) == 0 else value\n"
        "            results.append(['bool', value] if isinstance(value, bool) else\n"
        "                           ['str', str(value)] if isinstance(value, (str, int)) else\n"
        "                           ['type', type(value).__name__])\n"
        "        except Exception as error:\n"
        "            results.append(['error', f'{type(error).__name__}: {error}'])\n"
        f"    print({MARK!r} + json.dumps(results))\n"
        f"__course_claims({expressions!r}, globals())\n"
        "del __course_claims\n")


def with_probes(nb, found: list[Claim]):
    """A copy of ``nb`` with a probe cell after each code cell that some claim names (and at
    the end, for the claims evaluated there)."""
    probed = copy.deepcopy(nb)
    at: dict[str | None, list[Claim]] = {}
    for claim in found:
        at.setdefault(claim.after, []).append(claim)
    cells = []

    def probe(claims_here: list[Claim]):
        # a fixed id, not nbformat's random one: the same notebook gives the same probed copy
        return nbformat.v4.new_code_cell(_probe_source([c.expression for c in claims_here]),
                                         id=f"course-claims-{len(cells)}")

    for cell in probed.cells:
        cells.append(cell)
        if cell.cell_type == "code" and cell.get("id") in at:
            cells.append(probe(at[cell.id]))
    if None in at:
        cells.append(probe(at[None]))
    probed.cells = cells
    return probed


def _results(executed) -> list[list]:
    """What the probe cells printed, in order."""
    out = []
    for cell in executed.cells:
        for output in cell.get("outputs", []):
            for line in output.get("text", "").split("\n") if output.get("output_type") == "stream" else []:
                if line.startswith(MARK):
                    out.extend(json.loads(line[len(MARK):]))
    return out


def _words(text: str) -> str:
    return " ".join(text.split())


def _judge(claim: Claim, source: str, result: list) -> Verdict:
    if _words(claim.text) not in _words(source):
        return Verdict(claim, False, "the prose no longer says these words")
    kind, value = result
    if kind == "error":
        return Verdict(claim, False, f"the expression raised {value}")
    if claim.kind == "check":
        if kind != "bool":
            return Verdict(claim, False, f"a check must give a bool, got {kind} {value!r}")
        return Verdict(claim, value, "true in the run" if value else "false in the run")
    if kind != "str":
        return Verdict(claim, False, f"a value must be a str or an int, got {kind} {value!r}")
    return Verdict(claim, value in claim.text, f"the run gives {value!r}")


def order(nb, found: list[Claim]) -> list[Claim]:
    """``found`` in the order the probes print them (by the cell they follow, then as tagged)."""
    position = {c.get("id"): i for i, c in enumerate(nb.cells)}
    return sorted(found, key=lambda c: position[c.after] if c.after is not None else len(position))


def execute(nb, folder: Path, timeout: int = 600):
    """``nb`` run top to bottom in a fresh kernel (nbclient), in ``folder``; returns it."""
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def verify(path: Path, run: Callable = execute) -> list[Verdict]:
    """Run the notebook at ``path`` once with probes, in its own folder, and judge every
    claim of its markdown cells. A notebook without claims is not run. ``run(nb, folder)``
    returns ``nb`` executed (by default ``execute``; the suite's keeps runs,
    tests/runs.py).

    Raises:
        ValueError: a claim is malformed (see ``claims``).
        nbclient.exceptions.CellExecutionError: a cell of the notebook raised.
    """
    nb = nbformat.read(path, as_version=4)
    found = order(nb, claims(nb))
    if not found:
        return []
    results = _results(run(with_probes(nb, found), Path(path).parent))
    if len(results) != len(found):
        raise RuntimeError(f"{len(found)} claims, but the probes printed {len(results)} results")
    sources = {c.get("id"): c.source for c in nb.cells}
    return [_judge(claim, sources[claim.cell], result) for claim, result in zip(found, results)]


def main(argv: list[str] | None = None) -> int:
    """``python -m grader.claims NOTEBOOK...``: every claim's verdict; exit code 1 if one fails."""
    failed = 0
    for name in argv if argv is not None else sys.argv[1:]:
        for verdict in verify(Path(name)):
            print(f"{Path(name).name}: {verdict}")
            failed += not verdict.holds
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
