"""docs/figures/ is what the solution notebooks of 09 and 10 draw (grader/docfigures.py):
every figure the README shows from there has a cell that draws it, and the PNG is taken
from that cell's output."""
from __future__ import annotations

import base64
import re

import nbformat
import pytest

from grader import course, docfigures


def test_every_figure_in_docs_figures_is_drawn_by_a_named_solution_cell():
    shown = set(re.findall(r"docs/figures/([\w.]+\.png)", (course.ROOT / "README.md").read_text()))
    assert shown == set(docfigures.FIGURES) == {p.name for p in docfigures.DOCS.glob("*.png")}
    for assignment, cell_id in docfigures.FIGURES.values():
        nb = nbformat.read(course.SOLUTIONS / assignment / f"{assignment}.ipynb", as_version=4)
        [cell] = [c for c in nb.cells if c.get("id") == cell_id]
        assert "plt.show()" in cell.source


def test_the_png_is_the_cell_s_output():
    nb = nbformat.v4.new_notebook()
    drawn, silent = nbformat.v4.new_code_cell("plot"), nbformat.v4.new_code_cell("x = 1")
    drawn.id, silent.id = "a-figure", "b"
    png = b"\x89PNG\r\n\x1a\nfake"
    drawn.outputs = [nbformat.v4.new_output("stream", name="stdout", text="hi\n"),
                     nbformat.v4.new_output("display_data", data={"image/png": base64.b64encode(png).decode()})]
    nb.cells = [silent, drawn]
    assert docfigures.figure_png(nb, "a-figure") == png
    with pytest.raises(KeyError, match="shows no PNG"):
        docfigures.figure_png(nb, "b")
    with pytest.raises(KeyError, match="no cell c"):
        docfigures.figure_png(nb, "c")
