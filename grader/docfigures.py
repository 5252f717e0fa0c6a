"""docs/figures/: the figures of the trained models of notebooks 09, 10 and 13, as the solution
notebooks draw them after their full training budgets (a fixed number of steps, so any
machine draws the same figures).

    python -m grader.docfigures [EXECUTED.ipynb ...]      (make figures)

Without arguments it runs each solution notebook once (nbclient, a fresh kernel, minutes
of training); given executed solution notebooks, it takes the figures from their outputs.
"""
from __future__ import annotations

import base64
import sys
from pathlib import Path

import nbformat

from . import course

DOCS = course.ROOT / "docs" / "figures"
# file in docs/figures -> (assignment, the id of the figure cell that draws it)
FIGURES = {
    "09_cross_attention_alignment.png": ("09_transformer", "transformer-Transformer-figure"),
    "10_accuracy_by_length.png": ("10_seq2seq_rnn", "seq2seq_rnn-accuracy_by_length-figure"),
    "13_train_short_test_long.png": ("13_rope", "rope-RotaryMultiHeadAttention-figure"),
}


def figure_png(nb, cell_id: str) -> bytes:
    """The PNG that the executed notebook ``nb`` shows under the cell ``cell_id``.

    Raises:
        KeyError: no such cell, or it shows no PNG (the notebook was not executed).
    """
    for cell in nb.cells:
        if cell.get("id") == cell_id:
            for output in cell.get("outputs", []):
                if "image/png" in output.get("data", {}):
                    return base64.b64decode(output["data"]["image/png"])
            raise KeyError(f"cell {cell_id} shows no PNG: is the notebook executed?")
    raise KeyError(f"no cell {cell_id}")


def executed(assignment: str):
    """The solution notebook of ``assignment``, run top to bottom in a fresh kernel."""
    from nbclient import NotebookClient

    path = course.SOLUTIONS / assignment / f"{assignment}.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=3600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    return nb


def main(argv: list[str] | None = None) -> int:
    given = [nbformat.read(p, as_version=4) for p in (sys.argv[1:] if argv is None else argv)]
    by_assignment = {}
    for nb in given:
        ids = {c.get("id") for c in nb.cells}
        by_assignment.update({a: nb for a, cell in FIGURES.values() if cell in ids})
    DOCS.mkdir(parents=True, exist_ok=True)
    for name, (assignment, cell_id) in FIGURES.items():
        if assignment not in by_assignment:
            by_assignment[assignment] = executed(assignment)
        (DOCS / name).write_bytes(figure_png(by_assignment[assignment], cell_id))
        print(f"wrote {Path('docs/figures') / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
