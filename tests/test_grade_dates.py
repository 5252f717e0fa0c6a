"""Due dates given to a grading run (`make grade DUEDATE=...`, `course-grader grade --duedate`)
and a failed run that leaves nothing behind: every date and extension is checked before
anything is written, and a first run in a new folder that fails leaves no half-made course
directory (a leftover nbgrader_config.py would pin the failed run's gradebook and folders)."""
from __future__ import annotations

import shlex
import shutil
import subprocess

import pytest
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import parse_utc

from grader import course
from grader.coursedir import CourseDir
from grader.grade import grade_class

A = "03_masking"
MAKE_DUEDATE = "03_masking=2026-12-01 23:59 UTC 04_softmax=2026-12-08T23:59Z"


def test_duedate_pairs_are_split_where_a_word_names_an_assignment():
    from grader.grade import parse_duedates

    assert parse_duedates([MAKE_DUEDATE, "01_similarity=2026-11-20"]) == {
        "03_masking": "2026-12-01 23:59 UTC", "04_softmax": "2026-12-08T23:59Z", "01_similarity": "2026-11-20"}
    assert parse_duedates([]) == {}


@pytest.mark.parametrize("value, says", [
    ("2026-12-01 03_masking=2026-12-02", "wants ASSIGNMENT=DATE"),
    ("", "wants ASSIGNMENT=DATE"),
    ("03_maskin=2026-12-01", "no assignment '03_maskin'"),
    ("03_masking=2026-12-01 03_masking=2026-12-02", "two due dates"),
    ("03_masking=next friday", "is not a date and time"),
])
def test_a_bad_duedate_is_one_line_that_says_what_is_wrong(value, says):
    from grader.grade import parse_duedates

    with pytest.raises(RuntimeError, match=says) as error:
        parse_duedates([value])
    assert "\n" not in str(error.value)


@pytest.fixture
def tiny_class(tmp_path):
    """One student's submission of 03_masking, from the sample class."""
    submitted = tmp_path / "submitted"
    shutil.copytree(course.SAMPLE_CLASS / "ada" / A, submitted / "ada" / A)
    extensions = {("ada", A): "2026-12-09 23:59 UTC"}
    return submitted, extensions


def test_a_failed_first_run_leaves_no_course_directory(tmp_path, tiny_class):
    """The issue's case: an extension on an assignment with no due date, in a new course
    directory. It fails before any release/ or gradebook is written, and whatever the run
    made is gone, the folder and its new parents included."""
    submitted, extensions = tiny_class
    new = tmp_path / "new" / "course"
    with pytest.raises(RuntimeError, match=f"which has no due date: give one \\(--duedate {A}=") as error:
        grade_class(new, submitted=submitted, extensions=extensions, progress=False)
    assert not (tmp_path / "new").exists()
    assert "DUEDATE" in str(error.value)  # make's way too

    kept = tmp_path / "kept"  # a folder that was there: only what the run added goes
    (kept / "notes").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="no due date"):
        grade_class(kept, submitted=submitted, extensions=extensions, progress=False)
    assert sorted(p.name for p in kept.iterdir()) == ["notes"]


def test_an_existing_course_directory_is_checked_before_anything_is_written(tmp_path, tiny_class):
    """A course directory of the term keeps its files; the bad run writes no release/ and
    registers nothing in its gradebook."""
    submitted, extensions = tiny_class
    course_dir = CourseDir.open(tmp_path / "course", submitted=submitted)
    with pytest.raises(RuntimeError, match="no due date"):
        grade_class(course_dir, extensions=extensions, progress=False)
    assert not course_dir.folder("release").exists()
    assert (course_dir.root / "nbgrader_config.py").is_file()
    with Gradebook(course_dir.db_url) as gb, pytest.raises(MissingEntry):
        gb.find_assignment(A)

    with pytest.raises(RuntimeError, match="not an assignment of this course"):
        grade_class(course_dir, extensions={("ada", "03_maskin"): "2026-12-09"}, progress=False)


def test_the_cli_says_it_in_one_line_and_leaves_nothing(tmp_path, tiny_class, capsys):
    from grader.cli import main

    submitted, _ = tiny_class
    csv = tmp_path / "extensions.csv"
    csv.write_text(f"student_id,assignment_id,duedate\nada,{A},2026-12-09 23:59 UTC\n")
    new = tmp_path / "new"
    assert main(["grade", "--course", str(new), "--submitted", str(submitted), "--extensions", str(csv)]) == 2
    assert not new.exists()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "DUEDATE" in err, err


def _make_grade_args(**variables) -> list[str]:
    """The course-grader arguments `make grade` would run with these variables (make -n)."""
    done = subprocess.run(["make", "-n", "grade", *(f"{k}={v}" for k, v in variables.items())], cwd=course.ROOT,
                          capture_output=True, text=True, check=True)
    line = next(x for x in done.stdout.splitlines() if "course-grader grade" in x)
    words = shlex.split(line)
    return words[words.index("grade"):]


@pytest.mark.kernel
def test_make_grade_duedate_reaches_the_gradebook(tmp_path):
    """make grade DUEDATE="ID=DATE ID=DATE" passes the pairs to --duedate, and a whole
    course-grader run with make's arguments keeps them in the gradebook, with the student's
    extension on top. (The class's one submission is a link, which is refused before any
    kernel starts: what is tested is the run's dates, in seconds.)"""
    from grader.cli import main

    submitted = tmp_path / "submitted"
    (submitted / "ada").mkdir(parents=True)
    (submitted / "ada" / A).symlink_to(course.SAMPLE_CLASS / "ada" / A)
    csv = tmp_path / "extensions.csv"
    csv.write_text(f"student_id,assignment_id,duedate\nada,{A},2026-12-09 23:59 UTC\n")
    root = tmp_path / "course"
    args = _make_grade_args(COURSE=root, DUEDATE=MAKE_DUEDATE, EXTENSIONS=csv, ASSIGNMENT=A, JOBS=1)
    assert args[args.index("--duedate") + 1] == MAKE_DUEDATE
    assert main([*args, "--submitted", str(submitted)]) == 0
    with Gradebook(CourseDir.open(root, create=False).db_url) as gb:
        assert gb.find_assignment(A).duedate == parse_utc("2026-12-01 23:59 UTC")
        assert gb.find_submission(A, "ada").duedate == parse_utc("2026-12-09 23:59 UTC")
    assert "not graded" in (root / "grades.csv").read_text()


def test_a_folder_another_run_made_a_course_directory_meanwhile_is_left_alone(tmp_path):
    """Two first runs into one new folder: the one that finds the other's configuration (or
    its grader's lock) fails with a CourseDirError and removes nothing of the other's."""
    from grader.coursedir import CourseBusy, CourseDirError, undone_if_new

    root = tmp_path / "course"
    with pytest.raises(CourseDirError), undone_if_new(root):
        CourseDir.open(root)  # what the other run wrote while this one started
        raise CourseBusy("another grader is already working")
    assert (root / "nbgrader_config.py").is_file()
