"""Malformed corpus: submissions that are broken, odd or oversized, generated from a correct one.

``build(dest)`` writes one submission per case under ``dest/<student_id>/`` (nbgrader's
submitted layout, ``<student_id>/01_similarity/01_similarity.ipynb``), starting from
``sample_class/ada`` (correct, 10/10), and returns what our grader must give each::

    {student_id: {"01_similarity": {"score": 10, "status": "graded"}, "what": "one line"}}

``status`` is a short lower-case keyword that the row's status must contain (compare
with ``status_matches``: the keyword ``"graded"`` means the status STARTS with
"graded", since "not graded: ..." also contains the word). All keywords are in
:data:`STATUS`, to be adjusted in one place.

Submissions a good grader still grades (stripped metadata, duplicated grade ids, a
deleted or retyped test cell, a renamed notebook, extra files, a foreign kernelspec)
expect the full score, 10. The others expect 0 and a plain-language reason.

The huge notebook (~300 MB) is not written by ``build``: it writes a marker file,
``<student>/01_similarity/01_similarity.ipynb.huge``, and the test that needs it calls
``materialize_huge(dest)`` (or ``huge_notebook(path)``), which streams the notebook to
disk without building it in memory and removes the marker.

Usage: ``python tests/corpora/malformed.py DEST [--huge]``.
"""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import nbformat
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "sample_class" / "ada" / "01_similarity" / "01_similarity.ipynb"
ASSIGNMENT = "01_similarity"
NOTEBOOK = "01_similarity"
FULL = 10
HUGE_STUDENT = "m11_huge_notebook"
HUGE_MARKER = f"{NOTEBOOK}.ipynb.huge"

# What a row's status must contain, per kind of case (lower case; see status_matches).
STATUS = {
    "graded": "graded",  # graded in full: the status starts with "graded"
    "invalid_json": "not valid notebook json",
    "empty": "empty file",
    "nbformat3": "converted from nbformat 3",
    "not_utf8": "not utf-8",
    "too_large": "mb limit",
    "no_submission": "no submission",
    "not_a_notebook": "not a notebook",
    "no_metadata": "lost the course's cell metadata",
}


def status_matches(keyword: str, status: str) -> bool:
    """Whether a row's ``status`` satisfies an expected ``keyword`` from :data:`STATUS`."""
    if keyword == STATUS["graded"]:
        return status.startswith("graded")
    return keyword in status.lower()


def _expect(score: int, kind: str, what: str) -> dict:
    return {ASSIGNMENT: {"score": score, "status": STATUS[kind]}, "what": what}


def _ada():
    return nbformat.read(SOURCE, as_version=4)


def _index(nb, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def _folder(dest: Path, student: str) -> Path:
    folder = dest / student / ASSIGNMENT
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _write(dest: Path, student: str, nb, name: str = NOTEBOOK) -> Path:
    path = _folder(dest, student) / f"{name}.ipynb"
    nbformat.write(nb, path)
    return path


def _v3(nb) -> dict:
    """The notebook as nbformat 3 JSON (worksheets, code in "input"), written by hand."""
    cells = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            cells.append({"cell_type": "code", "collapsed": False, "input": cell.source.splitlines(True),
                          "language": "python", "metadata": copy.deepcopy(dict(cell.metadata)),
                          "outputs": [], "prompt_number": None})
        else:
            cells.append({"cell_type": cell.cell_type, "metadata": copy.deepcopy(dict(cell.metadata)),
                          "source": cell.source.splitlines(True)})
    return {"metadata": {"name": NOTEBOOK, "signature": ""}, "nbformat": 3, "nbformat_minor": 0,
            "worksheets": [{"cells": cells, "metadata": {}}]}


def build(dest: Path) -> dict[str, dict]:
    """Write every malformed submission under ``dest``; return {student_id: expected}."""
    dest = Path(dest)
    expected: dict[str, dict] = {}
    text = SOURCE.read_text(encoding="utf-8")

    student = "m01_truncated_json"
    (_folder(dest, student) / f"{NOTEBOOK}.ipynb").write_text(text[: len(text) // 2], encoding="utf-8")
    expected[student] = _expect(0, "invalid_json", "the notebook's JSON is cut off half way (an interrupted upload)")

    student = "m02_empty_file"
    (_folder(dest, student) / f"{NOTEBOOK}.ipynb").write_bytes(b"")
    expected[student] = _expect(0, "empty", "a 0-byte 01_similarity.ipynb")

    student = "m03_nbformat3"
    (_folder(dest, student) / f"{NOTEBOOK}.ipynb").write_text(json.dumps(_v3(_ada()), indent=1), encoding="utf-8")
    expected[student] = _expect(FULL, "nbformat3", "a correct notebook saved in the old nbformat 3 (worksheets, 'input')")

    student = "m04_stripped_metadata"
    nb = _ada()
    for cell in nb.cells:
        cell.metadata.pop("nbgrader", None)
    _write(dest, student, nb)
    expected[student] = _expect(FULL, "graded", "correct answers, nbgrader metadata removed from every cell")

    student = "m05_duplicate_grade_ids"
    nb = _ada()
    for grade_id in ("similarity-dot_product-test", "similarity-cosine_similarity"):
        i = _index(nb, grade_id)
        twin = copy.deepcopy(nb.cells[i])
        twin["id"] = f"{nb.cells[i].get('id', 'cell')}-copy"[:64]
        nb.cells.insert(i + 1, twin)
    _write(dest, student, nb)
    expected[student] = _expect(FULL, "graded", "correct answers; a test cell and an answer cell copied (same grade ids twice)")

    student = "m06_deleted_test_cell"
    nb = _ada()
    del nb.cells[_index(nb, "similarity-score_matrix-test")]
    _write(dest, student, nb)
    expected[student] = _expect(FULL, "graded", "correct answers; the score_matrix test cell deleted")

    student = "m07_retyped_test_cell"
    nb = _ada()
    i = _index(nb, "similarity-cosine_similarity-test")
    visible = nb.cells[i].source
    nb.cells[i] = nbformat.v4.new_code_cell(visible)  # a plain cell: no nbgrader metadata, a new id
    _write(dest, student, nb)
    expected[student] = _expect(FULL, "graded", "correct answers; the cosine test cell deleted, then retyped as a plain cell")

    student = "m08_renamed_notebook"
    _write(dest, student, _ada(), name=f"{NOTEBOOK}-Copy1")
    expected[student] = _expect(FULL, "graded", "a correct notebook submitted as 01_similarity-Copy1.ipynb")

    student = "m09_extra_files"
    folder = _folder(dest, student)
    _write(dest, student, _ada())
    (folder / "data.csv").write_text("word,score\nanimal,5.35\nit,5.25\nstreet,1.10\n", encoding="utf-8")
    np.save(folder / "weights.npy", np.arange(5 * 2**20, dtype=np.float64))  # 40 MiB
    expected[student] = _expect(FULL, "graded", "a correct notebook with data.csv and a 40 MB weights.npy beside it")

    student = "m10_latin1_bytes"
    nb = _ada()
    placeholder = "@@LATIN1@@"
    nb.cells[_index(nb, "similarity-dot_product")].source += f"\n# {placeholder}\n"
    raw = json.dumps(json.loads(nbformat.writes(nb)), ensure_ascii=True, indent=1).encode("ascii")  # \u escapes
    raw = raw.replace(placeholder.encode(), "Grüße aus Köln, à bientôt: ½ café".encode("latin-1"))
    (_folder(dest, student) / f"{NOTEBOOK}.ipynb").write_bytes(raw)
    expected[student] = _expect(0, "not_utf8", "a comment in latin-1 bytes: the file is not UTF-8")

    student = HUGE_STUDENT
    (_folder(dest, student) / HUGE_MARKER).write_text(json.dumps(
        {"megabytes": 300, "build": "tests.corpora.malformed.materialize_huge(dest)"}) + "\n")
    expected[student] = _expect(0, "too_large", "a valid ~300 MB notebook (one huge output); built by materialize_huge")

    student = "m12_no_assignment_folder"
    (dest / student).mkdir(parents=True, exist_ok=True)
    expected[student] = _expect(0, "no_submission", "a student folder without the 01_similarity folder")

    student = "m13_json_list"
    (_folder(dest, student) / f"{NOTEBOOK}.ipynb").write_text(json.dumps([json.loads(text)]), encoding="utf-8")
    expected[student] = _expect(0, "not_a_notebook", "valid JSON, but a list holding the notebook instead of the notebook")

    student = "m14_r_kernelspec"
    nb = _ada()
    nb.metadata["kernelspec"] = {"name": "ir", "display_name": "R", "language": "R"}
    nb.metadata["language_info"] = {"name": "R", "codemirror_mode": "r", "file_extension": ".r",
                                    "mimetype": "text/x-r-source", "pygments_lexer": "r", "version": "4.3.1"}
    _write(dest, student, nb)
    expected[student] = _expect(FULL, "graded", "a correct notebook whose metadata says kernel 'ir', language R")

    student = "m15_new_notebook"
    nb = nbformat.v4.new_notebook(metadata=_ada().metadata)
    nb.cells = [nbformat.v4.new_code_cell(c.source) for c in _ada().cells if c.cell_type == "code"]
    _write(dest, student, nb)
    expected[student] = _expect(0, "no_metadata", "the answers pasted into a new notebook: no nbgrader metadata, new cell ids")

    for student, e in expected.items():
        (dest / student / "expected.json").write_text(json.dumps(e, indent=2) + "\n")
    return expected


def huge_notebook(path: Path, megabytes: int = 300) -> Path:
    """Stream a valid notebook of about ``megabytes`` MiB to ``path``: ada's correct
    notebook with one huge stream output, written in 1 MiB pieces (never in memory)."""
    nb = _ada()
    placeholder = "@@HUGE_OUTPUT@@"
    cell = next(c for c in nb.cells if c.cell_type == "code" and "nbgrader" not in c.metadata)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=placeholder)]
    head, tail = nbformat.writes(nb).split(placeholder)
    line = "x" * 99 + "\\n"  # one JSON-escaped newline every 100 characters
    piece = line * (2**20 // len(line))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(head)
        for _ in range(megabytes):
            f.write(piece)
        f.write(tail)
    return path


def materialize_huge(dest: Path, megabytes: int | None = None) -> list[Path]:
    """Replace every huge-notebook marker under ``dest`` by the notebook it stands for."""
    made = []
    for marker in sorted(Path(dest).glob(f"*/{ASSIGNMENT}/{HUGE_MARKER}")):
        size = megabytes or json.loads(marker.read_text())["megabytes"]
        made.append(huge_notebook(marker.parent / f"{NOTEBOOK}.ipynb", size))
        marker.unlink()
    return made


def main(argv: list[str]) -> int:
    if not argv or argv[0].startswith("-"):
        print("usage: python tests/corpora/malformed.py DEST [--huge]", file=sys.stderr)
        return 2
    expected = build(Path(argv[0]))
    if "--huge" in argv:
        materialize_huge(Path(argv[0]))
    for student, e in expected.items():
        print(f"{student:26} {e[ASSIGNMENT]['score']:>3}  {e[ASSIGNMENT]['status']:24} {e['what']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
