"""Staging: check one submitted folder and copy it into a grading workspace.

A problem with the submission (empty, not UTF-8, not JSON, not a notebook, too big,
missing) raises ``BadSubmission`` whose message is the row's one-line status. The
input folder is never written.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat

from . import course

MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024
MAX_EXTRA_BYTES = 20 * 1024 * 1024


class BadSubmission(Exception):
    """A submission that cannot be graded; the message is the row's status."""


def read_notebook(path: Path) -> tuple[nbformat.NotebookNode, int]:
    """Parse a submitted notebook as nbformat 4, or say in one line what is wrong with it.

    Returns the notebook and the nbformat major version it was saved in.
    """
    size = path.stat().st_size
    if size == 0:
        raise BadSubmission(f"'{path.name}' is an empty file: save the notebook in Jupyter and resubmit")
    if size > MAX_NOTEBOOK_BYTES:
        raise BadSubmission(f"'{path.name}' is {size / 2**20:.0f} MB, over the "
                            f"{MAX_NOTEBOOK_BYTES // 2**20} MB limit: clear all outputs and resubmit")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise BadSubmission(f"'{path.name}' is not UTF-8 text: resubmit the .ipynb file Jupyter saved") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadSubmission(f"'{path.name}' is not valid notebook JSON (line {error.lineno}, column "
                            f"{error.colno}): open it in Jupyter, save it, and resubmit") from None
    if not isinstance(raw, dict) or "cells" not in raw and "worksheets" not in raw:
        raise BadSubmission(f"'{path.name}' is JSON but not a notebook: resubmit the .ipynb file")
    try:
        return nbformat.reads(text, as_version=4), raw.get("nbformat", 4)
    except Exception as error:  # nbformat raises several kinds for broken notebooks
        raise BadSubmission(f"'{path.name}' is not a valid notebook ({type(error).__name__}): "
                            "open it in Jupyter, save it, and resubmit") from None


def _dedupe_grade_ids(nb: nbformat.NotebookNode) -> list[str]:
    """Make copied cells ordinary cells: nbgrader aborts on a grade id seen twice.

    The first cell with a grade id keeps it; later copies lose their nbgrader
    metadata and still run. Returns the grade ids that were duplicated.
    """
    seen, copied = set(), []
    for cell in nb.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id is None:
            continue
        if grade_id in seen:
            del cell.metadata["nbgrader"]
            copied.append(grade_id)
        seen.add(grade_id)
    return sorted(set(copied))


def _restore_metadata(nb: nbformat.NotebookNode, released: Path) -> int:
    """Give back nbgrader metadata that a tool or a copy stripped, matching cells by id.

    The released notebook's cells carry ids; a cell that kept its id but lost its
    nbgrader metadata gets the released cell's. Returns how many cells were restored.
    """
    if not released.is_file():
        return 0
    known = {c.get("id"): c.metadata["nbgrader"] for c in nbformat.read(released, as_version=4).cells
             if "nbgrader" in c.get("metadata", {})}
    restored = 0
    for cell in nb.cells:
        if "nbgrader" not in cell.get("metadata", {}) and cell.get("id") in known:
            cell.metadata["nbgrader"] = dict(known[cell["id"]])
            restored += 1
    return restored


def stage(source: Path, dest: Path, notebooks: list[str], timestamp: str | None) -> str:
    """Copy one submission into the workspace; return a note on what was fixed up.

    In a one-notebook assignment, a lone notebook under another name is graded as the
    expected one (students rename and copy files). Copied cells lose their grade ids.
    Other files are copied up to ``MAX_EXTRA_BYTES`` each. The student's own
    timestamp.txt is never used: ``timestamp`` is the instructor's record, if any.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    notes, used = [], set()
    for notebook in notebooks:
        found = source / f"{notebook}.ipynb"
        if not found.is_file():
            candidates = sorted(p for p in source.glob("*.ipynb") if p.is_file())
            if len(candidates) != 1 or len(notebooks) != 1:
                names = ", ".join(p.name for p in candidates) or "no notebook"
                raise BadSubmission(f"'{notebook}.ipynb' is missing (found {names}): "
                                    "submit the notebook under its original name")
            found = candidates[0]
            notes.append(f"graded '{found.name}' as '{notebook}.ipynb' (renamed)")
        used.add(found.name)
        nb, version = read_notebook(found)
        if version != 4:
            notes.append(f"converted from nbformat {version}")
        restored = _restore_metadata(nb, course.NOTEBOOKS / dest.name / f"{notebook}.ipynb")
        if restored:
            notes.append(f"restored the nbgrader metadata of {restored} cells")
        copied = _dedupe_grade_ids(nb)
        if copied:
            notes.append(f"copied cells ({', '.join(copied)}) were run as ordinary cells")
        nbformat.write(nb, dest / f"{notebook}.ipynb")
    skipped = []
    for extra in sorted(source.iterdir()):
        if extra.name in used or extra.suffix == ".ipynb" or extra.name == "timestamp.txt" \
                or extra.name.startswith(".") or not extra.is_file() or extra.is_symlink():
            continue
        if extra.stat().st_size > MAX_EXTRA_BYTES:
            skipped.append(f"{extra.name} ({extra.stat().st_size / 2**20:.0f} MB)")
        else:
            shutil.copyfile(extra, dest / extra.name)
    if skipped:
        notes.append(f"left out files over {MAX_EXTRA_BYTES // 2**20} MB: {', '.join(skipped)}")
    if timestamp:
        (dest / "timestamp.txt").write_text(timestamp + "\n", encoding="utf-8")
    return "; ".join(notes)


def read_files(folder: Path) -> dict[str, bytes | int]:
    """A submitted folder as data that can travel to a worker on another machine.

    Top-level regular files only (what ``stage`` looks at; symlinks are left out).
    A file too big to be graded or kept travels as its size alone (an int), so that
    the worker gives the same "over the limit" status without the bytes.
    """
    cap = max(MAX_NOTEBOOK_BYTES, MAX_EXTRA_BYTES)
    files: dict[str, bytes | int] = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink() or not path.is_file():
            continue
        size = path.stat().st_size
        files[path.name] = size if size > cap else path.read_bytes()
    return files


def materialize(files: dict[str, bytes | int], dest: Path) -> Path:
    """Write ``read_files``'s data back as a folder; a size stands for a sparse file of that size."""
    dest.mkdir(parents=True)
    for name, data in files.items():
        if "/" in name or name in ("", ".", ".."):
            raise BadSubmission(f"a submitted file has an unusable name ({name!r})")
        path = dest / name
        if isinstance(data, int):
            with open(path, "wb") as f:
                f.truncate(data)
        else:
            path.write_bytes(data)
    return dest
