"""Staging: check one submitted folder and copy it into a grading workspace.

A problem with the submission (empty, not UTF-8, not JSON, not a notebook, too big,
missing, a link, a special file, an unusable name) raises ``BadSubmission`` whose
message is the row's one-line status; a problem with an extra file leaves that file
out and says so in the returned note. The input folder is never written.

Nothing is followed or trusted on the student's side of the path:

- The student folder and the assignment folder are opened with ``O_NOFOLLOW``, each
  relative to the descriptor of the folder above it; every file is then looked at
  with ``lstat`` through the assignment folder's descriptor and opened with
  ``O_NOFOLLOW | O_NONBLOCK``, and the opened descriptor must be the very file that
  was looked at (same device and inode, still a regular file). So a link cannot be
  swapped in between the check and the read, and a FIFO is never opened at all.
- Symbolic links are never followed, whatever they point to.
- Hard links: a regular file with more than one link whose owner is not the owner of
  the assignment folder holding it is refused. A student can make such a link to a
  file they cannot read (a root-only file, a classmate's or the instructor's
  notebook) and the grader, reading as root, would hand its bytes back. Files the
  folder's owner owns, and files with a single link (copies made by ``nbgrader
  collect``, an unpacked archive), are kept: their contents are the owner's own.
- FIFOs, sockets and devices are refused without being opened.
- Names that are not valid UTF-8 or that hold control characters are refused; every
  name in a status is escaped (``grader.names.shown``).
- A status never holds bytes of a file that was refused.

Staging is linear in the number of files (one directory listing, one ``lstat`` each)
and bounded by the files' apparent size (``st_size``, which counts a sparse file at
full size, as every copy after this one writes it out): at most ``MAX_EXTRA_FILES``
extra files, each up to ``MAX_EXTRA_BYTES``, together up to ``MAX_EXTRA_TOTAL_BYTES``;
a folder with more than ``MAX_ENTRIES`` entries is not graded. nbgrader's own copy of
the folder (``nbgrader.utils.find_all_files``) is quadratic in the number of files,
so the cap on their number is what keeps a unit's time bounded.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

import nbformat

from coursekit.naming import graded_as

from . import course
from .names import name_problem, quoted, shown

MAX_NOTEBOOK_BYTES = 20 * 1024 * 1024
MAX_EXTRA_BYTES = 20 * 1024 * 1024  # one extra file
MAX_EXTRA_TOTAL_BYTES = 64 * 1024 * 1024  # all extra files of a submission, by apparent size
MAX_EXTRA_FILES = 100
MAX_ENTRIES = 100_000  # entries of a submitted folder: more is not graded
# Cells of a notebook (the course's have at most 40): every later step (nbformat's
# validation, nbgrader's preprocessors, the feedback page) costs time per cell.
MAX_CELLS = 2000
MAX_LISTED = 5  # names a note lists before "and N more"
PROBLEM = "/"  # read_files' key for a folder that cannot be read: no file can have this name
# Beside a graded submission's autograded and feedback notebooks: {notebook: the file name the
# student submitted}, by which its feedback is released (grader.exchange.ReleaseFeedbackAsSubmitted).
SUBMITTED_NAMES = "submitted_names.json"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_KINDS = {"symlink", "dir", "foreign", "FIFO", "socket", "character device", "block device", "special file",
          "unreadable"}


class BadSubmission(Exception):
    """A submission that cannot be graded; the message is the row's status."""


class _Unreadable(Exception):
    """A file that could not be read as the file that was checked; the message is a phrase
    to follow its name ("could not be read (Permission denied)", "changed while it was read")."""


@dataclass
class _Entry:
    name: str
    kind: str  # "file", or one of _KINDS
    size: int  # apparent size (st_size)
    key: object = None  # how the source finds it again: (st_dev, st_ino), or the sent data


def _kind(st: os.stat_result, owner: int) -> str:
    mode = st.st_mode
    if stat.S_ISREG(mode):
        return "foreign" if st.st_nlink > 1 and st.st_uid != owner else "file"
    for test, kind in ((stat.S_ISLNK, "symlink"), (stat.S_ISDIR, "dir"), (stat.S_ISFIFO, "FIFO"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return kind
    return "special file"


def _article(kind: str) -> str:
    return ("an " if kind[0] in "aeiouAEIOU" else "a ") + kind


def _open_folder(source: Path) -> int:
    """The descriptor of a submitted folder ``.../<student>/<assignment>``.

    The folder above the student folder (the class folder, the instructor's) is opened
    as it is named; the student folder and the assignment folder are opened relative to
    it with ``O_NOFOLLOW``, so that neither can be a link.

    Raises:
        BadSubmission: "no submission", or which folder is a link or not a folder.
    """
    source = Path(os.path.abspath(source))
    try:
        fd = os.open(source.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise BadSubmission("no submission") from None
    for what, name in (("student folder", source.parent.name), ("assignment folder", source.name)):
        try:
            inner = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            raise BadSubmission("no submission") from None
        except OSError as error:
            try:
                kind = _kind(os.stat(name, dir_fd=fd, follow_symlinks=False), -1)
            except OSError:
                kind = None
            if kind == "symlink":
                raise BadSubmission(f"the {what} {quoted(name)} is a symbolic link, which the grader does "
                                    "not follow: submit the folder itself") from None
            if kind not in (None, "dir"):
                raise BadSubmission(f"the {what} {quoted(name)} is {_article(kind.replace('foreign', 'file'))}"
                                    ", not a folder") from None
            raise BadSubmission(f"the {what} {quoted(name)} cannot be opened ({error.strerror})") from None
        finally:
            os.close(fd)
        fd = inner
    return fd


def folder_problem(source: Path) -> str | None:
    """Why a submitted folder cannot be staged at all (missing, a link, not a folder), or None."""
    try:
        os.close(_open_folder(source))
    except BadSubmission as error:
        return str(error)
    return None


class _Folder:
    """A submitted folder on this machine, read through its descriptor (see the module's docs)."""

    def __init__(self, source: Path):
        self.fd = _open_folder(source)
        try:
            owner = os.fstat(self.fd).st_uid
            self.owner = owner
            self.entries = []
            with os.scandir(self.fd) as listing:
                for entry in listing:
                    if len(self.entries) >= MAX_ENTRIES:
                        raise BadSubmission(f"the folder holds more than {MAX_ENTRIES} files: submit the "
                                            "notebook and the data files it reads, nothing else")
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:  # gone since it was listed
                        continue
                    self.entries.append(_Entry(entry.name, _kind(st, owner), st.st_size, (st.st_dev, st.st_ino)))
        except BaseException:
            os.close(self.fd)
            raise

    def read(self, entry: _Entry, limit: int) -> bytes:
        """Up to ``limit + 1`` bytes of ``entry``, which must still be the file that was listed.

        Raises:
            _Unreadable: it cannot be opened, or it is no longer that regular file.
        """
        try:
            fd = os.open(entry.name, _FILE_FLAGS, dir_fd=self.fd)
        except OSError as error:
            raise _Unreadable(f"could not be read ({error.strerror})") from None
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != entry.key or _kind(st, self.owner) != "file":
                raise _Unreadable("changed while it was read")
            chunks, left = [], limit + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)
        except OSError as error:
            raise _Unreadable(f"could not be read ({error.strerror})") from None
        finally:
            os.close(fd)

    def close(self) -> None:
        os.close(self.fd)


class _Sent:
    """A submitted folder received as ``read_files`` data (see there)."""

    def __init__(self, files: dict):
        if PROBLEM in files:
            raise BadSubmission(str(files[PROBLEM]))
        if len(files) > MAX_ENTRIES:
            raise BadSubmission(f"the folder holds more than {MAX_ENTRIES} files: submit the "
                                "notebook and the data files it reads, nothing else")
        self.entries = []
        for name, data in files.items():
            if not isinstance(name, str) or "/" in name or "\0" in name or name in ("", ".", ".."):
                raise BadSubmission(f"a submitted file has an unusable name ({quoted(str(name))})")
            if isinstance(data, bytes):
                self.entries.append(_Entry(name, "file", len(data), data))
            elif isinstance(data, int) and not isinstance(data, bool) and data >= 0:
                self.entries.append(_Entry(name, "file", data, None))
            elif isinstance(data, str) and data in _KINDS:
                self.entries.append(_Entry(name, data, 0, None))
            else:
                raise BadSubmission(f"the grader received {quoted(name)} in a form it does not know")

    def read(self, entry: _Entry, limit: int) -> bytes:
        if entry.key is None:
            raise _Unreadable("was not sent to the grading worker")  # only if the two plans differed
        return entry.key[: limit + 1]

    def close(self) -> None:
        pass


def _source(source) -> _Folder | _Sent:
    return _Sent(source) if isinstance(source, dict) else _Folder(Path(source))


def parse_notebook(name: str, data: bytes) -> tuple[nbformat.NotebookNode, int]:
    """Parse a submitted notebook's bytes as nbformat 4, or say in one line what is wrong.

    ``name`` is the file's name, for the message (escaped there). Returns the notebook
    and the nbformat major version it was saved in.

    Raises:
        BadSubmission: empty, over ``MAX_NOTEBOOK_BYTES``, not UTF-8, not JSON, not a notebook,
            more than ``MAX_CELLS`` cells.
    """
    q = quoted(name)
    if not data:
        raise BadSubmission(f"{q} is an empty file: save the notebook in Jupyter and resubmit")
    if len(data) > MAX_NOTEBOOK_BYTES:
        raise BadSubmission(f"{q} is {len(data) / 2**20:.0f} MB, over the "
                            f"{MAX_NOTEBOOK_BYTES // 2**20} MB limit: clear all outputs and resubmit")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadSubmission(f"{q} is not UTF-8 text: resubmit the .ipynb file Jupyter saved") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as error:
        raise BadSubmission(f"{q} is not valid notebook JSON (line {error.lineno}, column "
                            f"{error.colno}): open it in Jupyter, save it, and resubmit") from None
    except RecursionError:
        raise BadSubmission(f"{q} is not valid notebook JSON (nested too deeply): open it in "
                            "Jupyter, save it, and resubmit") from None
    if not isinstance(raw, dict) or "cells" not in raw and "worksheets" not in raw:
        raise BadSubmission(f"{q} is JSON but not a notebook: resubmit the .ipynb file")
    cells = _cell_count(raw)
    if cells > MAX_CELLS:
        raise BadSubmission(f"{q} has {cells:,} cells, over the {MAX_CELLS:,}-cell limit: delete the "
                            "cells you added, save, and resubmit")
    try:
        return nbformat.reads(text, as_version=4), raw.get("nbformat", 4)
    except Exception as error:  # nbformat raises several kinds for broken notebooks
        raise BadSubmission(f"{q} is not a valid notebook ({type(error).__name__}): "
                            "open it in Jupyter, save it, and resubmit") from None


def _cell_count(raw: dict) -> int:
    """Cells of a notebook's JSON, nbformat 4 (``cells``) or 3 (``worksheets``); 0 if malformed."""
    cells = raw.get("cells")
    if isinstance(cells, list):
        return len(cells)
    sheets = raw.get("worksheets")
    if isinstance(sheets, list):
        return sum(len(w.get("cells", [])) for w in sheets if isinstance(w, dict) and isinstance(w.get("cells"), list))
    return 0


def read_notebook(path: Path) -> tuple[nbformat.NotebookNode, int]:
    """Parse the notebook at ``path`` (a file the caller trusts, e.g. a released one).

    Returns the notebook and the nbformat major version it was saved in.

    Raises:
        BadSubmission: as ``parse_notebook``.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_NOTEBOOK_BYTES:
            raise BadSubmission(f"{quoted(path.name)} is {size / 2**20:.0f} MB, over the "
                                f"{MAX_NOTEBOOK_BYTES // 2**20} MB limit: clear all outputs and resubmit")
        return parse_notebook(path.name, f.read(MAX_NOTEBOOK_BYTES + 1))


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


def _listed(entries: list[_Entry]) -> str:
    names = ", ".join(quoted(e.name) for e in entries[:MAX_LISTED])
    return names + (f" and {len(entries) - MAX_LISTED} more" if len(entries) > MAX_LISTED else "")


def _refused_notebook(entry: _Entry, notebook: str) -> str | None:
    """The status of a notebook entry that must not be read, or None."""
    q = quoted(entry.name)
    why = name_problem(entry.name)
    if why:
        return f"the notebook's name {q} {why}: rename it '{notebook}.ipynb' and resubmit"
    if entry.kind == "symlink":
        return f"{q} is a symbolic link, which the grader does not follow: submit the notebook file itself"
    if entry.kind == "foreign":
        return f"{q} is a hard link to a file that belongs to someone else: submit your own copy of the notebook"
    if entry.kind == "unreadable":
        return f"{q} could not be read: resubmit the notebook"
    if entry.kind != "file":
        return f"{q} is {_article(entry.kind)}, not a file: submit the notebook file itself"
    return None


@dataclass
class _Plan:
    notebooks: dict[str, _Entry]  # notebook name (no .ipynb) -> the entry graded as it
    extras: list[_Entry]  # copied beside it
    notes: list[str]
    left: dict[str, list[_Entry]]  # note template -> the files it leaves out


_LEFT = {  # the note for each reason a file is left out; {names} is the list, {n} its length
    "not valid UTF-8": "left out files whose names are not valid UTF-8: {names}",
    "control": "left out files whose names hold control characters: {names}",
    "symlink": "left out symbolic links (not followed): {names}",
    "foreign": "left out hard links to files that belong to someone else: {names}",
    "special": "left out special files (FIFO, socket or device): {names}",
    "count": f"left out {{n}} files over the limit of {MAX_EXTRA_FILES} extra files: {{names}}",
    "total": f"left out files over the {MAX_EXTRA_TOTAL_BYTES // 2**20} MB total for extra files: {{names}}",
    "unreadable": "left out files that could not be read: {names}",
}


def _plan(entries: list[_Entry], notebooks: list[str]) -> _Plan:
    """Decide from names, kinds and sizes alone (no file is read) what is graded and copied.

    The same entries give the same plan, on the collector (``read_files``) and on a worker.

    Raises:
        BadSubmission: a notebook is missing, refused, empty or too big.
    """
    candidates = {e.name: e for e in entries if e.name.endswith(".ipynb") and not e.name.startswith(".")
                  and e.kind != "dir"}
    graded = graded_as(notebooks, sorted(candidates))
    chosen, notes = {}, []
    for notebook in notebooks:
        if notebook not in graded:
            listed = sorted(candidates)
            names = ", ".join(shown(n) for n in listed[:10]) or "no notebook"
            if len(listed) > 10:
                names += f" and {len(listed) - 10} more"
            raise BadSubmission(f"'{shown(notebook)}.ipynb' is missing (found {names}): "
                                "submit the notebook under its original name")
        found = candidates[graded[notebook]]
        if found.name != f"{notebook}.ipynb":
            notes.append(f"graded {quoted(found.name)} as '{notebook}.ipynb' (renamed)")
        refused = _refused_notebook(found, notebook)
        if refused:
            raise BadSubmission(refused)
        if found.size == 0:
            raise BadSubmission(f"{quoted(found.name)} is an empty file: save the notebook in Jupyter and resubmit")
        if found.size > MAX_NOTEBOOK_BYTES:
            raise BadSubmission(f"{quoted(found.name)} is {found.size / 2**20:.0f} MB, over the "
                                f"{MAX_NOTEBOOK_BYTES // 2**20} MB limit: clear all outputs and resubmit")
        chosen[notebook] = found
    used = {e.name for e in chosen.values()}
    extras, left, too_big, total = [], {k: [] for k in _LEFT}, [], 0
    for e in sorted(entries, key=lambda e: e.name):
        if e.name in used or e.name.endswith(".ipynb") or e.name == "timestamp.txt" \
                or e.name.startswith(".") or e.kind == "dir":
            continue  # as before: other notebooks, the student's timestamp, hidden files, folders
        why = name_problem(e.name)
        if why:
            left["not valid UTF-8" if "UTF-8" in why else "control"].append(e)
        elif e.kind in ("symlink", "foreign", "unreadable"):
            left[e.kind].append(e)
        elif e.kind != "file":
            left["special"].append(e)
        elif e.size > MAX_EXTRA_BYTES:
            too_big.append(e)
        elif len(extras) >= MAX_EXTRA_FILES:
            left["count"].append(e)
        elif total + e.size > MAX_EXTRA_TOTAL_BYTES:
            left["total"].append(e)
        else:
            extras.append(e)
            total += e.size
    if too_big:
        notes.append(f"left out files over {MAX_EXTRA_BYTES // 2**20} MB: "
                     + ", ".join(f"{shown(e.name)} ({e.size / 2**20:.0f} MB)" for e in too_big[:MAX_LISTED])
                     + (f" and {len(too_big) - MAX_LISTED} more" if len(too_big) > MAX_LISTED else ""))
    return _Plan(chosen, extras, notes, left)


def _left_notes(left: dict[str, list[_Entry]]) -> list[str]:
    return [_LEFT[k].format(n=len(v), names=_listed(v)) for k, v in left.items() if v]


def stage(source: Path | dict, dest: Path, notebooks: list[str], timestamp: str | None,
          submitted_as: dict[str, str] | None = None) -> str:
    """Copy one submission into the workspace; return a note on what was fixed up or left out.

    Args:
        source: the submitted folder ``.../<student_id>/<assignment_id>`` on this machine
            (the student and assignment folders must not be links), or ``read_files``
            data received from the collector.
        dest: the workspace's ``submitted/<student_id>/<assignment_id>``; emptied first.
        notebooks: the assignment's notebook names, without ``.ipynb``.
        timestamp: the instructor's record of the submission time, or None.
        submitted_as: when given, filled with each notebook's name (without ``.ipynb``) ->
            the name of the file graded as it, as the student submitted it.

    In a one-notebook assignment, a lone notebook under another name is graded as the
    expected one (students rename and copy files). Copied cells lose their grade ids.
    Other top-level regular files are copied within the limits in the module's docs;
    links, special files and unusable names are left out, each with a note. The
    student's own timestamp.txt is never used: ``timestamp`` is written instead.

    Returns:
        "" or notes joined by "; " (names escaped).

    Raises:
        BadSubmission: the submission cannot be graded; the message is its status.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    src = _source(source)
    try:
        plan = _plan(src.entries, notebooks)
        if submitted_as is not None:
            submitted_as.update({notebook: entry.name for notebook, entry in plan.notebooks.items()})
        notes = list(plan.notes)
        for notebook, entry in plan.notebooks.items():
            try:
                data = src.read(entry, MAX_NOTEBOOK_BYTES)
            except _Unreadable as error:
                raise BadSubmission(f"{quoted(entry.name)} {error}: resubmit the notebook") from None
            if len(data) != entry.size:
                raise BadSubmission(f"{quoted(entry.name)} changed while it was read: resubmit the notebook")
            nb, version = parse_notebook(entry.name, data)
            if version != 4:
                notes.append(f"converted from nbformat {shown(version)}")
            restored = _restore_metadata(nb, course.NOTEBOOKS / dest.name / f"{notebook}.ipynb")
            if restored:
                notes.append(f"restored the nbgrader metadata of {restored} cells")
            copied = _dedupe_grade_ids(nb)
            if copied:
                notes.append(f"copied cells ({', '.join(shown(c) for c in copied)}) were run as ordinary cells")
            nbformat.write(nb, dest / f"{notebook}.ipynb")
        for entry in plan.extras:
            try:
                data = src.read(entry, entry.size)
                if len(data) != entry.size:
                    raise _Unreadable("changed while it was read")
            except _Unreadable:
                plan.left["unreadable"].append(entry)
                continue
            with open(dest / entry.name, "xb") as f:
                f.write(data)
    finally:
        src.close()
    notes += _left_notes(plan.left)
    if timestamp:
        (dest / "timestamp.txt").write_text(timestamp + "\n", encoding="utf-8")
    return "; ".join(notes)


def write_files(files: dict, dest: Path, notebooks: list[str]) -> list[str]:
    """Write what ``read_files(folder, notebooks)`` read into the folder ``dest``, byte for byte.

    The notebooks and the extra files ``stage`` would keep are written as they were read
    (no notebook is parsed, changed or renamed; the student's timestamp.txt is not kept);
    nothing else is. ``dest`` is created if missing; a file already in it is an error.
    Used by ``grader.exchange`` to collect a submission from nbgrader's exchange.

    Returns:
        the notes ``stage`` gives on the files it leaves out, names escaped.

    Raises:
        BadSubmission: the folder could not be read, or ``stage`` would refuse the
            submission (the message is its status); nothing is written then.
    """
    plan = _plan(_Sent(files).entries, notebooks)
    dest.mkdir(parents=True, exist_ok=True)
    for entry in [*plan.notebooks.values(), *plan.extras]:
        if entry.key is None:  # only a size was read: only if read_files planned otherwise
            plan.left["unreadable"].append(entry)
            continue
        with open(dest / entry.name, "xb") as f:
            f.write(entry.key)
    return [note for note in plan.notes if note.startswith("left out")] + _left_notes(plan.left)


def read_files(folder: Path, notebooks: list[str] | None = None) -> dict[str, bytes | int | str]:
    """A submitted folder as data that can travel to a worker on another machine.

    Read as ``stage`` reads it (no link followed, the same limits). Values: the bytes
    of each file ``stage`` will read (the notebooks and the extra files it keeps); the
    size alone (an int) of every other top-level regular file, so that the worker gives
    the same "over the limit" notes without the bytes; the kind (a str: "symlink",
    "foreign", "FIFO", ...) of an entry that is refused. A folder that cannot be read
    at all is ``{PROBLEM: its status}``. ``notebooks``: the assignment's notebook names;
    by default those of the course assignment the folder is named after (else every
    ``.ipynb`` file up to the notebook limit travels). Never raises for bad input.
    """
    folder = Path(folder)
    if notebooks is None:
        notebooks = course.notebook_names(folder.name) if folder.name in course.assignments() else None
    try:
        src = _Folder(folder)
    except BadSubmission as error:
        return {PROBLEM: str(error)}
    try:
        try:
            plan = _plan(src.entries, notebooks or [])
            wanted = {id(e) for e in [*plan.notebooks.values(), *plan.extras]}
        except BadSubmission:  # the worker's plan, on the sizes and kinds sent, says the same
            wanted = set()
        if not notebooks:
            wanted |= {id(e) for e in src.entries if e.name.endswith(".ipynb") and e.kind == "file"
                       and 0 < e.size <= MAX_NOTEBOOK_BYTES}
        files: dict[str, bytes | int | str] = {}
        for e in src.entries:
            if e.name.startswith(".") or e.kind == "dir":
                continue
            if e.kind != "file":
                files[e.name] = e.kind
            elif id(e) in wanted:
                try:
                    files[e.name] = src.read(e, e.size)[: e.size]
                except _Unreadable:
                    files[e.name] = "unreadable"
            else:
                files[e.name] = e.size
        return files
    finally:
        src.close()
