"""Staging and the batch around it, against what a student can put in a submitted folder.

Issue 21: links (symbolic and hard), special files, names that are not UTF-8 or hold
terminal escapes, folder names that are spreadsheet formulas, unknown assignment
folders, many and sparse files. Each case asserts its status or note, and that nothing
else changed: the input folder (every entry's kind, link target and bytes), the other
students' rows, and nothing written outside the workspace. In process and fast; one
small ``grade_class`` run (``test_a_class_with_every_case_at_once``) grades two
notebooks for real.
"""
from __future__ import annotations

import csv
import hashlib
import os
import shutil
import signal
import socket
import stat
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from grader import course, names
from grader.grade import Row, format_table, submissions, write_csv
from grader.stage import (MAX_EXTRA_FILES, MAX_EXTRA_TOTAL_BYTES, PROBLEM, BadSubmission, folder_problem,
                          read_files, stage)

A = "01_similarity"
NB = f"{A}.ipynb"
ADA = course.SAMPLE_CLASS / "ada" / A
OTHER_UID = 54321  # owns the "someone else's" files (the tests run as root, as the grader does)


# --- helpers -----------------------------------------------------------------------------


def _student(root: Path, student: str, source: Path = ADA) -> Path:
    folder = root / "class" / student / A
    shutil.copytree(source, folder)
    return folder


def _tree(folder: Path) -> dict:
    """Every entry under ``folder`` without following links or opening special files:
    its kind, and its link target or its bytes' digest."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                what = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:  # the first MiB is enough to see a write; sparse files stay cheap
                    what = ("file", hashlib.sha256(f.read(2**20)).hexdigest(), st.st_size, st.st_mtime_ns,
                            st.st_nlink, st.st_uid)
            else:
                what = ("other", stat.S_IFMT(st.st_mode))
            out[os.path.relpath(path, folder)] = what
    return out


@contextmanager
def _deadline(seconds: int):
    """Fail instead of hanging (a FIFO opened for reading blocks forever)."""
    def expired(*_):
        raise TimeoutError(f"took more than {seconds} s")
    old = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _stage(tmp_path: Path, folder: Path, student: str = "x") -> tuple[str | None, str | None, Path]:
    """Stage ``folder`` from disk and as ``read_files`` data; both must agree.

    Returns (note, status, dest): the note when it was staged, else the BadSubmission
    message; asserts the input is unchanged and nothing appeared outside the workspace.
    """
    before, around = _tree(tmp_path / "class"), sorted(p.name for p in tmp_path.iterdir())
    results, first = [], len(around)
    for n, source in enumerate((folder, read_files(folder)), start=first):
        dest = tmp_path / f"ws{n}" / "submitted" / student / A
        with _deadline(20):
            try:
                results.append((stage(source, dest, [A], None), None))
            except BadSubmission as error:
                results.append((None, str(error)))
        around.append(f"ws{n}")
    assert results[0] == results[1], "a worker given the data must stage what a local one stages"
    assert _tree(tmp_path / "class") == before, "the input folder changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(around), "something was written beside the workspace"
    return (*results[0], tmp_path / f"ws{first}" / "submitted" / student / A)


def _staged(dest: Path) -> list[str]:
    return sorted(os.listdir(dest))


def _foreign_file(tmp_path: Path, text: bytes) -> Path:
    """A file owned by someone else, readable only by its owner (like a root-only file)."""
    other = tmp_path / "elsewhere"
    other.mkdir(exist_ok=True)
    path = other / f"secret{len(list(other.iterdir()))}"
    path.write_bytes(text)
    os.chown(path, OTHER_UID, OTHER_UID)
    os.chmod(path, 0o600)
    return path


# --- the notebook ------------------------------------------------------------------------


def test_a_correct_submission_still_stages_with_its_data_files(tmp_path):
    folder = _student(tmp_path, "ada")
    (folder / "data.csv").write_text("word,score\nanimal,5.35\n")
    note, status, dest = _stage(tmp_path, folder)
    assert (note, status) == ("", None)
    assert _staged(dest) == [NB, "data.csv"]  # the student's timestamp.txt is dropped
    assert (dest / "data.csv").read_text() == "word,score\nanimal,5.35\n"


def test_a_lone_renamed_notebook_is_still_graded(tmp_path):
    folder = _student(tmp_path, "ada")
    (folder / NB).rename(folder / f"{A}-Copy1.ipynb")
    note, status, dest = _stage(tmp_path, folder)
    assert note == f"graded '{A}-Copy1.ipynb' as '{NB}' (renamed)" and status is None
    assert NB in _staged(dest)


@pytest.mark.parametrize("target", ["classmate", "solution", "root_only"])
def test_a_notebook_that_is_a_symlink_is_not_graded(tmp_path, target):
    ada = _student(tmp_path, "ada")
    folder = _student(tmp_path, "bob")
    (folder / NB).unlink()
    secret = _foreign_file(tmp_path, b'{"cells": [], SECRET-BYTES-OF-ROOT')
    (folder / NB).symlink_to({"classmate": ada / NB, "solution": course.SOLUTIONS / A / NB,
                              "root_only": secret}[target])
    note, status, dest = _stage(tmp_path, folder, "bob")
    assert status == f"'{NB}' is a symbolic link, which the grader does not follow: submit the notebook file itself"
    assert note is None and _staged(dest) == []
    assert _stage(tmp_path, ada, "ada")[:2] == ("", None)  # the classmate is unaffected


def test_a_lone_renamed_notebook_that_is_a_symlink_is_not_graded(tmp_path):
    folder = _student(tmp_path, "bob")
    (folder / NB).unlink()
    (folder / "mine.ipynb").symlink_to(ADA / NB)
    assert _stage(tmp_path, folder, "bob")[1] == ("'mine.ipynb' is a symbolic link, which the grader does not "
                                                  "follow: submit the notebook file itself")


def test_a_notebook_hard_linked_to_someone_elses_file_is_not_graded_and_leaks_nothing(tmp_path):
    folder = _student(tmp_path, "bob")
    (folder / NB).unlink()
    os.link(_foreign_file(tmp_path, b"{ not json: ROOT SECRET"), folder / NB)
    note, status, dest = _stage(tmp_path, folder, "bob")
    assert status == (f"'{NB}' is a hard link to a file that belongs to someone else: "
                      "submit your own copy of the notebook")
    assert "line" not in status and "column" not in status and _staged(dest) == []


def test_a_notebook_hard_linked_to_the_students_own_file_is_graded(tmp_path):
    folder = _student(tmp_path, "bob")
    os.link(folder / NB, tmp_path / "backup.ipynb")  # same owner as the folder: the student's own bytes
    assert _stage(tmp_path, folder, "bob")[:2] == ("", None)


@pytest.mark.parametrize("kind", ["FIFO", "socket", "character device"])
def test_a_notebook_that_is_a_special_file_is_refused_without_opening_it(tmp_path, kind):
    folder = _student(tmp_path, "bob")
    (folder / NB).unlink()
    path = folder / NB
    if kind == "FIFO":
        os.mkfifo(path)  # opening it for reading would block until a writer comes
    elif kind == "socket":
        # bound under a short name, then moved: AF_UNIX paths are limited to 107 bytes
        short = Path(tempfile.mkdtemp()) / "s"  # the temp folder tmp_path is in: same filesystem
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(short))
        sock.close()
        os.rename(short, path)
        short.parent.rmdir()
    else:
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    assert _stage(tmp_path, folder, "bob")[1] == f"'{NB}' is a {kind}, not a file: submit the notebook file itself"


def test_a_notebook_name_that_is_not_utf8_is_a_status_not_a_crash(tmp_path):
    folder = _student(tmp_path, "bob")
    os.rename(folder / NB, os.path.join(os.fsencode(folder), b"01_similarit\xe9.ipynb"))
    status = _stage(tmp_path, folder, "bob")[1]
    assert status == (r"the notebook's name '01_similarit\xe9.ipynb' is not valid UTF-8: "
                      f"rename it '{NB}' and resubmit")
    status.encode("utf-8")  # printable and writable as it is


def test_a_notebook_name_with_terminal_escapes_is_shown_escaped(tmp_path):
    folder = _student(tmp_path, "bob")
    (folder / NB).rename(folder / "\x1b]0;owned\x07\x1b[2A.ipynb")
    status = _stage(tmp_path, folder, "bob")[1]
    assert status == (r"the notebook's name '\x1b]0;owned\x07\x1b[2A.ipynb' holds control characters: "
                      f"rename it '{NB}' and resubmit")


def test_a_missing_notebook_lists_the_names_found_escaped(tmp_path):
    folder = _student(tmp_path, "bob")
    (folder / NB).rename(folder / "a\x1b[31m.ipynb")
    (folder / "b.ipynb").write_text("{}")
    assert _stage(tmp_path, folder, "bob")[1] == (rf"'{NB}' is missing (found a\x1b[31m.ipynb, b.ipynb): "
                                                  "submit the notebook under its original name")


# --- the folders ---------------------------------------------------------------------------


def test_an_assignment_folder_that_is_a_symlink_is_not_graded(tmp_path):
    ada = _student(tmp_path, "ada")
    (tmp_path / "class" / "bob").mkdir()
    (tmp_path / "class" / "bob" / A).symlink_to(ada)
    status = _stage(tmp_path, tmp_path / "class" / "bob" / A, "bob")[1]
    assert status == f"the assignment folder '{A}' is a symbolic link, which the grader does not follow: " \
                     "submit the folder itself"
    assert folder_problem(tmp_path / "class" / "bob" / A) == status
    assert read_files(tmp_path / "class" / "bob" / A) == {PROBLEM: status}
    assert folder_problem(ada) is None


def test_a_student_folder_that_is_a_symlink_is_not_followed(tmp_path):
    _student(tmp_path, "ada")
    (tmp_path / "class" / "ada" / "=HYPERLINK(1)").mkdir()  # ada's own: must not become bob's row
    (tmp_path / "class" / "bob").symlink_to(tmp_path / "class" / "ada")
    status = _stage(tmp_path, tmp_path / "class" / "bob" / A, "bob")[1]
    assert status == ("the student folder 'bob' is a symbolic link, which the grader does not follow: "
                      "submit the folder itself")
    rows = submissions(tmp_path / "class")
    assert [r[:2] for r in rows] == [("ada", A), ("ada", "=HYPERLINK(1)"), ("bob", A)]
    assert rows[2][3] is None and folder_problem(rows[2][2]) == status  # its row says why, via staging


def test_a_missing_assignment_folder_is_no_submission(tmp_path):
    (tmp_path / "class" / "bob").mkdir(parents=True)
    assert folder_problem(tmp_path / "class" / "bob" / A) == "no submission"
    assert read_files(tmp_path / "class" / "bob" / A) == {PROBLEM: "no submission"}


def test_an_assignment_folder_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    (tmp_path / "class" / "bob").mkdir(parents=True)
    os.mkfifo(tmp_path / "class" / "bob" / A)
    with _deadline(10):
        assert folder_problem(tmp_path / "class" / "bob" / A) == f"the assignment folder '{A}' is a FIFO, not a folder"
        assert [r[:2] for r in submissions(tmp_path / "class")] == [("bob", A)]


# --- extra files ---------------------------------------------------------------------------


def test_extra_files_that_are_links_special_or_badly_named_are_left_out_with_notes(tmp_path):
    ada = _student(tmp_path, "ada")
    folder = _student(tmp_path, "bob")
    (folder / "data.csv").write_text("kept\n")
    (folder / "shadow.csv").symlink_to("/etc/shadow")
    (folder / "hers.npy").symlink_to(ada / NB)
    os.link(_foreign_file(tmp_path, b"root only"), folder / "linked.txt")
    os.mkfifo(folder / "pipe")
    open(os.path.join(os.fsencode(folder), b"caf\xe9.csv"), "wb").close()
    (folder / "\x1b]0;title\x07.csv").write_text("x")
    (folder / "\u202eevil.txt").write_text("x")
    (folder / "sub").mkdir()  # folders are not copied, as before
    note, status, dest = _stage(tmp_path, folder, "bob")
    assert status is None
    assert note == ("left out files whose names are not valid UTF-8: 'caf\\xe9.csv'; "
                    "left out files whose names hold control characters: '\\x1b]0;title\\x07.csv', '\\u202eevil.txt'; "
                    "left out symbolic links (not followed): 'hers.npy', 'shadow.csv'; "
                    "left out hard links to files that belong to someone else: 'linked.txt'; "
                    "left out special files (FIFO, socket or device): 'pipe'")
    assert _staged(dest) == [NB, "data.csv"]
    assert names.shown(note) == note  # nothing left to escape


@pytest.mark.slow
def test_too_many_extra_files_are_cut_at_the_limit_in_linear_time(tmp_path):
    folder = _student(tmp_path, "bob")
    for i in range(6000):
        open(folder / f"f{i:05d}.dat", "wb").close()
    started = time.perf_counter()
    note, status, dest = _stage(tmp_path, folder, "bob")
    assert time.perf_counter() - started < 20  # twice over, from disk and as data; was quadratic downstream
    assert status is None
    assert note == (f"left out 5900 files over the limit of {MAX_EXTRA_FILES} extra files: "
                    "'f00100.dat', 'f00101.dat', 'f00102.dat', 'f00103.dat', 'f00104.dat' and 5895 more")
    assert len(_staged(dest)) == 1 + MAX_EXTRA_FILES


def test_sparse_files_count_at_their_apparent_size(tmp_path):
    folder = _student(tmp_path, "bob")
    for i in range(40):
        with open(folder / f"s{i:02d}.bin", "wb") as f:
            f.truncate(19 * 2**20)  # 19 MiB, 0 bytes on disk
    note, status, dest = _stage(tmp_path, folder, "bob")
    assert note == (f"left out files over the {MAX_EXTRA_TOTAL_BYTES // 2**20} MB total for extra files: "
                    "'s03.bin', 's04.bin', 's05.bin', 's06.bin', 's07.bin' and 32 more")
    kept = [n for n in _staged(dest) if n.endswith(".bin")]
    assert kept == ["s00.bin", "s01.bin", "s02.bin"]
    assert sum((dest / n).stat().st_size for n in kept) <= MAX_EXTRA_TOTAL_BYTES
    assert read_files(folder)["s39.bin"] == 19 * 2**20  # its size travels, not its bytes


def test_an_extra_file_over_the_size_limit_is_left_out_as_before(tmp_path):
    folder = _student(tmp_path, "bob")
    with open(folder / "weights.npy", "wb") as f:
        f.truncate(40 * 2**20)
    assert _stage(tmp_path, folder, "bob")[0] == "left out files over 20 MB: weights.npy (40 MB)"


# --- ids and the class folder ----------------------------------------------------------------

EVIL = ["=HYPERLINK(\"http:x\",\"y\")", "@SUM(1+1)", "<img src=x onerror=alert(1)>", "+1", "-2",
        "\x1b]0;title\x07\x1b[1A", " =1+1", "a\u202eb"]


def _class(tmp_path: Path) -> Path:
    root = tmp_path / "class"
    for student in ("ada", "ben"):
        _student(tmp_path, student)
    for name in EVIL:
        (root / name / A).mkdir(parents=True)
    os.mkdir(os.path.join(os.fsencode(root), b"caf\xe9"))
    (root / "ada" / "=HYPERLINK(\"http:x\")").mkdir()  # unknown assignment inside ada's own folder
    (root / "ada" / "notes.txt").write_text("plain files are skipped")
    (root / ".hidden").mkdir()
    return root


def test_folders_that_are_not_student_ids_are_one_row_each_and_never_rows_for_others(tmp_path):
    root = _class(tmp_path)
    before = _tree(root)
    rows = submissions(root)
    assert _tree(root) == before
    valid = [(s, a) for s, a, _, problem in rows if problem is None]
    assert valid == [("ada", A), ("ben", A)]  # no row for an unknown assignment, no row for a bad id
    odd = {(s, a): problem for s, a, _, problem in rows if problem is not None}
    assert odd[("ada", '=HYPERLINK("http:x")')] == \
        "not graded: there is no assignment '=HYPERLINK(\"http:x\")' in this course"
    rule = "is not a valid student id (letters and digits, and . _ - @ after the first character)"
    assert odd[("@SUM(1+1)", "")] == f"not graded: the folder '@SUM(1+1)' {rule}"
    assert odd[(r"caf\xe9", "")] == r"not graded: the folder 'caf\xe9' is not valid UTF-8"
    assert odd[(r"\x1b]0;title\x07\x1b[1A", "")] == \
        r"not graded: the folder '\x1b]0;title\x07\x1b[1A' holds control characters"
    assert len(rows) == 2 + 1 + len(EVIL) + 1
    for s, a, _, problem in rows:
        assert names.shown(s) == s and names.shown(a) == a and (problem is None or names.shown(problem) == problem)


def test_with_a_roster_only_its_students_are_graded(tmp_path):
    root = _class(tmp_path)
    rows = submissions(root, roster={"ada", "zoe"})
    assert [(s, a) for s, a, _, p in rows if p is None] == [("ada", A), ("zoe", A)]  # zoe: no folder
    assert dict(((s, a), p) for s, a, _, p in rows)[("ben", "")] == "not graded: the folder 'ben' is not on the roster"


def test_valid_ids_follow_nbgrader_and_the_spreadsheet(tmp_path):
    for ok in ("ada", "jane.doe@uni.example", "s12345", "zoë", "t12_forged_timestamp", "李华"):
        assert names.student_id_problem(ok) is None, ok
    for bad in ("", "a+b", "a*", "a?", "a[1]", "../x", ".hidden", "_x", "-x", "=x", "@x", "a b", " a", "a/b",
                "x" * 101):
        assert names.student_id_problem(bad), bad


# --- escaping and CSV ------------------------------------------------------------------------


def test_shown_escapes_every_control_bidi_and_undecodable_character():
    assert names.shown("plain name.ipynb") == "plain name.ipynb"
    assert names.shown("a\x00\x1b[2J\x07\r\n\t\x7f\x85\x9b") == r"a\x00\x1b[2J\x07\x0d\x0a\x09\x7f\x85\x9b"
    assert names.shown("x\u202ey\u2066z\u2069\u2028") == r"x\u202ey\u2066z\u2069\u2028"
    assert names.shown(os.fsdecode(b"caf\xe9")) == r"caf\xe9"
    assert names.shown("zoë 李华 \u200c") == "zoë 李华 \u200c"  # letters and joiners stay
    once = names.shown("\x1b]0;t\x07")
    assert names.shown(once) == once


def test_csv_cells_that_could_be_formulas_are_neutralised_and_numbers_stay_numbers():
    for evil in ("=1+1", "+1", "-1+1", "@SUM(A1)", " =1", "\u00a0@x", "\uff1d1+1", " \u3000-1"):
        cell = names.csv_cell(evil)
        assert cell.startswith("'"), (evil, cell)
    assert names.csv_cell("\t=1") == r"\x09=1" and names.csv_cell("\r=1") == r"\x0d=1"  # escaped: no formula
    assert names.csv_cell("ada") == "ada" and names.csv_cell("graded: fine") == "graded: fine"
    assert names.csv_cell(-1.0) == "-1" and names.csv_cell(2.5) == "2.5" and names.csv_cell(None) == ""


def _read(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))


def _formula(cell: str) -> bool:
    return cell.lstrip(" \u00a0").startswith(("=", "+", "-", "@", "\t", "\r"))


def test_grades_csv_neutralises_names_and_statuses(tmp_path):
    rows = [Row("ada", A, 10.0, 10.0, "graded", {"similarity-dot_product": 2.0}),
            Row('=HYPERLINK("http://x","y")', "", 0.0, 0.0, "not graded: the folder '=HYPERLINK' ..."),
            Row("ben", "@SUM(1)", 0.0, 0.0, "=cmd|' /C calc'!A0"),
            Row("kai", A, -1.0, 10.0, "graded: late", {"similarity-dot_product": -0.5}),
            Row(names.shown("\x1b]0;t\x07"), A, 0.0, 10.0, os.fsdecode(b"not graded: caf\xe9\x1b[2J"))]
    write_csv(rows, tmp_path / "grades.csv")
    table = _read(tmp_path / "grades.csv")
    assert table[0] == ["student_id", "assignment_id", "score", "max_score", "status", "similarity-dot_product"]
    assert table[1] == ["ada", A, "10", "10", "graded", "2"]
    assert table[2][:2] == ["'=HYPERLINK(\"http://x\",\"y\")", ""]
    assert table[3][1] == "'@SUM(1)" and table[3][4] == "'=cmd|' /C calc'!A0"
    assert table[4][2] == "-1" and table[4][5] == "-0.5"  # our numbers stay numbers
    assert table[5][4] == r"not graded: caf\xe9\x1b[2J"
    for line in table[1:]:
        for n, cell in enumerate(line):
            assert not _formula(cell) or n in (2, 3, 5) and float(cell) < 0, cell
            assert names.shown(cell) == cell


def test_lms_files_neutralise_names_and_keep_scores_numeric(tmp_path):
    from grader.classgrades import ClassGrades, Submission
    from grader.lms import write_canvas, write_moodle

    grades = ClassGrades(["ada", "=evil()"], {A: {"similarity-dot_product": 10.0}},
                         [Submission("ada", A, True, 10.0), Submission("=evil()", A, True, 5.0)])
    roster = {"ada": {"name": "@SUM(1)", "email": "-x@y", "sis_user_id": "+1", "canvas_id": "\t=1"},
              "zoe": {"name": "Zoë \x1b[2J"}}
    for write in (write_canvas, write_moodle):
        table = _read(write(grades, tmp_path / f"{write.__name__}.csv", roster))
        for line in table:
            for cell in line:
                assert not _formula(cell) and names.shown(cell) == cell, (write.__name__, cell)
        assert [line[-1] for line in table if line[0] in ("'@SUM(1)", "'=evil()")] in (["10", "5"], ["5", "10"])
    canvas = _read(tmp_path / "write_canvas.csv")
    assert canvas[1][-1] == "10" and canvas[3][0] == "'@SUM(1)" and canvas[3][2] == "'+1" and canvas[4][0] == r"Zoë \x1b[2J"


def test_the_terminal_table_cannot_be_rewritten_by_a_name(tmp_path):
    rows = [Row("ada", A, 10.0, 10.0, "graded"),
            Row(names.shown("\x1b[1A\x1b[2K\rada"), A, 10.0, 10.0, "graded"),
            Row("ben", A, 0.0, 10.0, os.fsdecode(b"not graded: '\x1b]0;pwned\x07\xff' ") + "\u202e")]
    table = format_table(rows)
    lines = table.split("\n")
    assert len(lines) == 4 and lines[1].startswith("ada ")
    assert not any(names._unsafe(c) for c in table if c != "\n")
    assert r"\x1b]0;pwned\x07\xff" in lines[3]


# --- the whole batch -------------------------------------------------------------------------


@pytest.mark.kernel
def test_a_class_with_every_case_at_once(tmp_path):
    """The batch finishes and writes grades.csv whatever is in the folder; honest rows as alone."""
    from grader.grade import grade_class

    root = _class(tmp_path)  # ada and ben honest, bad ids, an unknown assignment in ada's folder
    ben = root / "ben" / A
    (ben / NB).rename(ben / f"{A}-Copy1.ipynb")  # still graded
    for i in range(150):
        open(ben / f"f{i:03d}.dat", "wb").close()
    (ben / "s.bin").symlink_to("/etc/shadow")
    bob = root / "bob" / A
    bob.mkdir(parents=True)
    (bob / NB).symlink_to(root / "ada" / A / NB)
    (root / "carl").mkdir()
    (root / "carl" / A).symlink_to(root / "ada" / A)
    (root / "dora").symlink_to(root / "ada")
    eve = root / "eve" / A
    eve.mkdir(parents=True)
    os.mkfifo(eve / NB)
    fay = _student(tmp_path, "fay")
    os.rename(fay / NB, os.path.join(os.fsencode(fay), b"caf\xe9.ipynb"))
    gil = root / "gil" / A
    gil.mkdir(parents=True)
    os.link(_foreign_file(tmp_path, b"{ root secret"), gil / NB)
    before = _tree(root)
    with _deadline(120):
        rows = grade_class(tmp_path / "out", submitted=root, progress=False, jobs=1)
    assert _tree(root) == before
    assert sorted(os.listdir(tmp_path)) == ["class", "elsewhere", "out"]
    by = {}
    for r in rows:
        by.setdefault((r.student_id, r.assignment_id), []).append(r)
    status = {k: v[0].status for k, v in by.items()}
    assert status[("ada", A)] == "graded"
    assert by[("ada", A)][0].score == 10
    assert status[("ben", A)] == (f"graded: graded '{A}-Copy1.ipynb' as '{NB}' (renamed); "
                                  "left out symbolic links (not followed): 's.bin'; "
                                  "left out 50 files over the limit of 100 extra files: 'f100.dat', 'f101.dat', "
                                  "'f102.dat', 'f103.dat', 'f104.dat' and 45 more")
    assert by[("ben", A)][0].score == 10
    assert status[("bob", A)] == (f"not graded: '{NB}' is a symbolic link, which the grader does not follow: "
                                  "submit the notebook file itself")
    assert status[("carl", A)] == (f"not graded: the assignment folder '{A}' is a symbolic link, which the "
                                   "grader does not follow: submit the folder itself")
    assert status[("dora", A)] == ("not graded: the student folder 'dora' is a symbolic link, which the grader "
                                   "does not follow: submit the folder itself")
    assert status[("eve", A)] == f"not graded: '{NB}' is a FIFO, not a file: submit the notebook file itself"
    assert status[("fay", A)] == (r"not graded: the notebook's name 'caf\xe9.ipynb' is not valid UTF-8: "
                                  f"rename it '{NB}' and resubmit")
    assert status[("gil", A)] == (f"not graded: '{NB}' is a hard link to a file that belongs to someone else: "
                                  "submit your own copy of the notebook")
    assert status[("ada", '=HYPERLINK("http:x")')].startswith("not graded: there is no assignment")
    assert not any(a == '=HYPERLINK("http:x")' for s, a in by if s != "ada")
    assert len(rows) == 8 + 1 + len(EVIL) + 1
    table = _read(tmp_path / "out" / "grades.csv")
    assert len(table) == 1 + len(rows)
    for line in table[1:]:
        assert not any(_formula(c) for c in line) and all(names.shown(c) == c for c in line)
    assert all(not names._unsafe(c) for c in format_table(rows) if c != "\n")
