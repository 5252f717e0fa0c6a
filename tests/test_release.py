"""The student notebooks: generated from solutions/, free of solutions and hidden tests."""
from __future__ import annotations

import ast
import datetime
import re

import nbformat
import pytest

import coursekit
from grader import course
from grader.checks import exercise_ids
from grader.release import AddCheckCells
from pathlib import Path

HIDDEN_CALL = re.compile(r'^from grader\.checks import check; check\("(?P<id>[\w-]+)", \w+(, \w+)*\)$')
SECRETS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS", "grader")


def _cells(path):
    return nbformat.read(path, as_version=4).cells


def _comparable(path):
    nb = nbformat.read(path, as_version=4)
    return [(c.cell_type, c.get("id"), c.source, c.metadata.get("nbgrader"), c.metadata.get("course")) for c in nb.cells]


def test_notebooks_equal_a_fresh_release(released):
    """``released`` (tests/conftest.py) is grader.release.release() into a folder of its own."""
    fresh, folder = released["notebooks"], released["folder"]
    assert [p.relative_to(folder) for p in fresh] == [
        p.relative_to(course.NOTEBOOKS) for p in sorted(course.NOTEBOOKS.glob("*/*.ipynb"))]
    for path in fresh:
        assert _comparable(path) == _comparable(course.NOTEBOOKS / path.relative_to(folder)), (
            f"{path.name} is out of date: run `make release` and commit notebooks/")


def test_nbgrader_s_generate_assignment_ends_with_the_check_cells():
    """nbgrader_config.py keeps nbgrader's own preprocessors, after the release-order check
    (which writes nothing), and appends AddCheckCells, so `nbgrader generate_assignment`
    (into release/) writes what `make release` writes."""
    from nbgrader.converters import GenerateAssignment
    from traitlets.utils.importstring import import_item

    from grader.release import ReleaseOrder

    configured = course.load_config().GenerateAssignment.preprocessors
    assert [import_item(p) for p in configured] == (
        [ReleaseOrder] + GenerateAssignment.class_traits()["preprocessors"].default() + [AddCheckCells])
    assert course.load_config().CourseDirectory.release_directory == "release"


def test_check_cells_end_every_notebook_unknown_to_the_gradebook():
    """AddCheckCells' two cells have fixed ids and no nbgrader metadata (no grade, no lock)."""
    for path in sorted(course.NOTEBOOKS.glob("*/*.ipynb")):
        cells = _cells(path)[-2:]
        assert [(c.cell_type, c.id) for c in cells] == [
            ("markdown", "check-my-work-markdown"), ("code", "check-my-work-code")], path.name
        assert not any("nbgrader" in c.metadata for c in cells), path.name


def test_student_notebooks_hold_no_solution_hidden_test_or_output():
    for path in sorted(course.NOTEBOOKS.glob("*/*.ipynb")):
        for cell in _cells(path):
            for secret in SECRETS:
                assert secret not in cell.source, f"{path.name}: '{secret}' in cell {cell.get('id')}"
            assert not cell.get("outputs"), f"{path.name}: cell {cell.get('id')} has outputs"


def test_student_package_holds_no_solution_or_check():
    """coursekit defines none of the functions and classes the learner writes (their top-level
    names; methods such as forward or encode are the learner's only inside their class) and
    imports no grader code, but for check_my_work("name") in check.py: it imports
    grader.kernelcheck where the grader is installed beside coursekit (a self-learner's
    install), after asking importlib (tests/test_fast_check.py)."""
    learner_functions = set()
    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        for cell in _cells(path):
            if cell.metadata.get("nbgrader", {}).get("solution"):
                learner_functions |= {n.name for n in ast.parse(cell.source).body
                                      if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert learner_functions, "no solution functions found"
    for source in Path(coursekit.__file__).parent.rglob("*.py"):
        text = source.read_text()
        tree = ast.parse(text)
        defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        assert not defined & learner_functions, f"{source.name} defines {defined & learner_functions}"
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        if source.relative_to(Path(coursekit.__file__).parent).as_posix() == "check.py":
            imported.discard("grader.kernelcheck")
        assert not any(m.split(".")[0] == "grader" for m in imported), f"{source.name} imports grader"
        for secret in SECRETS[:4]:
            assert secret not in text


def test_hidden_tests_are_one_line_calls_by_exercise_id():
    """Solution cell grade_id = exercise id; its test cell = id + '-test' and holds one check call."""
    seen = []
    for path in sorted(course.SOLUTIONS.glob("*/*.ipynb")):
        cells = _cells(path)
        solutions = {c.metadata.nbgrader["grade_id"] for c in cells if c.metadata.get("nbgrader", {}).get("solution")}
        for cell in cells:
            meta = cell.metadata.get("nbgrader", {})
            if not (meta.get("grade") and not meta.get("solution")):
                continue
            exercise = course.exercise_id(meta["grade_id"])
            assert meta["grade_id"] == exercise + course.TEST_SUFFIX
            assert exercise in solutions, f"test cell {meta['grade_id']} has no solution cell {exercise}"
            hidden = re.search(r"### BEGIN HIDDEN TESTS\n(.*?)\n### END HIDDEN TESTS", cell.source, re.S)
            assert hidden, f"{meta['grade_id']} has no hidden tests"
            match = HIDDEN_CALL.match(hidden.group(1))
            assert match and match.group("id") == exercise, f"{meta['grade_id']}: {hidden.group(1)!r}"
            seen.append(exercise)
    assert sorted(seen) == exercise_ids(), "every check is used by exactly one test cell"


@pytest.mark.kernel
def test_validate_button_flags_the_student_version_and_passes_a_finished_one():
    """What nbgrader's Validate button runs, with the course configuration."""
    from nbgrader.validator import Validator

    validator = Validator(config=course.load_config())
    untouched = validator.validate(str(course.NOTEBOOKS / "01_similarity" / "01_similarity.ipynb"))
    assert len(untouched["failed"]) == 4
    finished = validator.validate(str(course.SAMPLE_CLASS / "ada" / "01_similarity" / "01_similarity.ipynb"))
    assert not finished.get("failed") and not finished.get("changed")


@pytest.mark.kernel
def test_new_gradebooks_get_nbgrader_s_alembic_revision(tmp_path):
    """grader.release answers nbgrader's revision question in process; it must be the
    revision nbgrader's own `alembic heads` command gives (the one upgrades start from)."""
    import os
    import subprocess
    import sys

    from nbgrader.api import Gradebook
    from nbgrader.dbutil import _temp_alembic_ini
    from sqlalchemy import create_engine, text

    import grader.release  # noqa: F401 - installs the in-process revision lookup

    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    with _temp_alembic_ini(f"sqlite:///{tmp_path / 'x.db'}") as ini:
        heads = subprocess.check_output(["alembic", "-c", ini, "heads"], env=env).decode().split()[0]
    url = f"sqlite:///{tmp_path / 'gradebook.db'}"
    with Gradebook(url):
        pass
    with create_engine(url).connect() as db:
        assert db.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == heads


# ---------------------------------------------------------------------------- release order

NOW = datetime.datetime(2026, 12, 1, 12, 0)  # the gradebook's naive UTC; no test reads the clock
DAY = datetime.timedelta(days=1)


def _gradebook(path: Path, duedates: dict) -> str:
    """A SQLite gradebook at ``path`` holding ``duedates`` (assignment id -> due date or None)."""
    from nbgrader.api import Gradebook

    import grader.release  # noqa: F401 - answers nbgrader's alembic question in process

    url = f"sqlite:///{path}"
    with Gradebook(url) as gb:
        for assignment_id, due in duedates.items():
            gb.update_or_create_assignment(assignment_id, duedate=due)
    return url


def _student_notebook_code(assignment: str) -> str:
    return "\n".join(c.source for c in _cells(course.NOTEBOOKS / assignment / f"{assignment}.ipynb"))


def test_answers_copied_are_the_solutions_a_student_notebook_holds_verbatim():
    """Independently of grader/assembled.py's bookkeeping: every top-level definition of every
    solution cell is looked for, verbatim, in every other assignment's student notebook; the
    assignments found are exactly what answers_copied names (12 holds 11's answers, 13 12's
    Block; 14 copies 06's given helper, which is no answer)."""
    from grader.assembled import answers_copied, defined_names, definitions, without_markers

    definitions_of = {}  # (assignment, solution cell) -> its top-level definitions' code
    for assignment in course.assignments():
        for cell in _cells(course.SOLUTIONS / assignment / f"{assignment}.ipynb"):
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution") and cell.cell_type == "code":
                code = without_markers(cell.source)
                definitions_of[(assignment, meta["grade_id"])] = [definitions(code, (n,)) for n in defined_names(code)]
    for assignment in course.assignments():
        student = _student_notebook_code(assignment)
        found = {}
        for (source, cell), parts in definitions_of.items():
            if source != assignment and any(part in student for part in parts):
                found.setdefault(source, []).append(cell)
        copied = answers_copied(assignment)
        assert {a: sorted(c) for a, c in copied.items()} == {a: sorted(c) for a, c in found.items()}, assignment
    assert "tokenization-helpers" not in answers_copied("12_gpt")["11_tokenization"]  # locked, given code
    assert answers_copied("13_rope")["12_gpt"] == ["gpt-Block"]
    assert answers_copied("14_efficient_attention") == {"04_softmax": ["softmax-stable_softmax"]}


def test_a_copy_of_an_assembled_cell_brings_the_answers_it_holds(monkeypatch):
    """A helper cell that copies another notebook's helper cell, itself assembled, hands out
    what that one holds: the chain is followed to the answers."""
    from grader import assembled

    chained = assembled.Assembly("14_efficient_attention", "efficient_attention-helpers", "",
                                 (assembled.Piece("12_gpt", "gpt-model-helpers"),))
    others = tuple(a for a in assembled.ASSEMBLIES if (a.assignment, a.cell) != (chained.assignment, chained.cell))
    monkeypatch.setattr(assembled, "ASSEMBLIES", (*others, chained))
    assert set(assembled.answers_copied("14_efficient_attention")) == {"03_masking", "06_multi_head", "07_encoder"}


def test_release_order_refuses_while_a_copied_assignment_is_open(tmp_path):
    """Open = in the gradebook with no due date, or with one (or a student's extension) to come."""
    from nbgrader.api import Gradebook

    from grader.release import ReleaseRefused, release_order

    url = _gradebook(tmp_path / "gradebook.db", {"03_masking": NOW - 7 * DAY, "11_tokenization": None})
    with pytest.raises(ReleaseRefused) as refused:
        release_order("12_gpt", url, now=NOW)
    message = str(refused.value)
    assert "\n" not in message and "11_tokenization has no due date" in message and "--force" in message
    assert "03_masking" not in message.split("still open")[0].split("answers of")[1]  # closed: not the reason
    forced = release_order("12_gpt", url, force=True, now=NOW)
    assert "forced" in forced and "11_tokenization" in forced
    assert release_order("01_similarity", url, now=NOW) is None  # copies nothing

    with Gradebook(url) as gb:
        gb.update_or_create_assignment("11_tokenization", duedate=NOW - DAY)
    allowed = release_order("12_gpt", url, now=NOW)
    assert "11_tokenization" in allowed and "closed" in allowed
    assert "03_masking, 11_tokenization closed" in allowed
    assert "06_multi_head, 07_encoder not in the gradebook" in allowed  # not assigned: said, not refused

    with Gradebook(url) as gb:  # one student may still submit 11: 12 would hand them its answers
        gb.update_or_create_student("kim")
        gb.update_or_create_submission("11_tokenization", "kim").extension = 2 * DAY
        gb.db.commit()
    with pytest.raises(ReleaseRefused, match="11_tokenization is due 2026-12-02 12:00 UTC"):
        release_order("12_gpt", url, now=NOW)


def test_release_order_with_no_gradebook_yet_allows_and_creates_none(tmp_path):
    from grader.release import release_order

    missing = tmp_path / "gradebook.db"
    assert "not in the gradebook" in release_order("12_gpt", f"sqlite:///{missing}", now=NOW)
    assert not missing.exists()


def _course_with_gradebook(root: Path, duedates: dict) -> Path:
    from grader.coursedir import CourseDir

    CourseDir.open(root)
    _gradebook(root / "gradebook.db", duedates)
    return root


def test_course_grader_release_refuses_before_writing_then_force_then_after_the_due_date(tmp_path, monkeypatch,
                                                                                       capsys):
    from nbgrader.api import Gradebook

    from grader import assembled, cli, release

    written = []
    monkeypatch.setattr(assembled, "update_sources", lambda: written.append("sources") or [])
    monkeypatch.setattr(release, "release", lambda **kw: written.append("notebooks") or [])
    root = _course_with_gradebook(tmp_path / "course", {"11_tokenization": None})

    assert cli.main(["release", "--course", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not releasing 12_gpt" in err and "11_tokenization" in err, err
    assert written == []

    assert cli.main(["release", "--course", str(root), "--force"]) == 0
    out = capsys.readouterr().out
    assert "12_gpt: its read-only cells hold the answers of" in out and "forced" in out
    assert written == ["sources", "notebooks"]

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        gb.update_or_create_assignment("11_tokenization", duedate=datetime.datetime(2020, 1, 1))
    assert cli.main(["release", "--course", str(root)]) == 0
    assert "forced" not in capsys.readouterr().out and written == ["sources", "notebooks"] * 2


@pytest.mark.slow
def test_nbgrader_generate_assignment_refuses_then_forced(tmp_path):
    """What formgrader's Generate button runs (NbGraderAPI.generate_assignment, with the course
    directory's configuration): refused with the reason as the log's first error and nothing
    written to release/; with --ReleaseOrder.force=True generated, the copied assignments named."""
    from grader.coursedir import CourseDir
    from grader.release import nbgrader_api

    root = _course_with_gradebook(tmp_path / "course", {"11_tokenization": None})
    config = CourseDir.open(root).config
    refused = nbgrader_api(config).generate_assignment("12_gpt")
    assert not refused["success"]
    first_error = next(line for line in refused["log"].splitlines() if "[ERROR]" in line)
    assert "not releasing 12_gpt" in first_error and "11_tokenization" in first_error, refused["log"]
    assert not (root / "release" / "12_gpt" / "12_gpt.ipynb").exists()

    config.ReleaseOrder.force = True
    forced = nbgrader_api(config).generate_assignment("12_gpt")
    assert forced["success"], forced.get("log")
    assert "12_gpt: its read-only cells hold the answers of" in forced["log"] and "forced" in forced["log"]
    assert (root / "release" / "12_gpt" / "12_gpt.ipynb").is_file()
