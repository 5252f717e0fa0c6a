"""``course-grader``: the commands behind ``make release``, ``make grade``, ``make demo``,
``make check`` and ``make report``."""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from . import course
from .names import shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="course-grader", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    release = sub.add_parser("release", help="regenerate notebooks/ from solutions/ (the assembled helper cells "
                                             "first); refused while a notebook's helper cells would hand out "
                                             "the answers of an assignment open in the course's gradebook")
    release.add_argument("--course", type=Path, metavar="DIR",
                         help="the course directory whose gradebook says which assignments are open (default: "
                              "the one nbgrader_config.py names)")
    release.add_argument("--force", action="store_true",
                         help="release even while an assignment whose answers a notebook copies is open")
    grade = sub.add_parser("grade", help="autograde the course directory's submitted/<student_id>/<assignment_id>/")
    grade.add_argument("--course", type=Path, metavar="DIR",
                       help="the nbgrader course directory (default: the one nbgrader_config.py names, the "
                            "repository root); a folder without nbgrader_config.py gets one")
    grade.add_argument("--assignment", action="append", default=[], metavar="ID",
                       help="grade only this assignment (repeatable); the other rows stay as they are")
    grade.add_argument("--student", action="append", default=[], metavar="ID",
                       help="grade only this student (repeatable); the other rows stay as they are")
    grade.add_argument("--duedate", action="append", default=[], metavar="ASSIGNMENT=DATE",
                       help='an assignment\'s due date for everyone, kept in the gradebook, e.g. '
                            '01_similarity="2026-12-01 23:59 UTC" (repeatable; one value may hold several '
                            'pairs separated by spaces, as make grade DUEDATE="..." passes them)')
    grade.add_argument("--extensions", type=Path, metavar="CSV",
                       help="per-student due dates (student_id,assignment_id,duedate), kept in the gradebook "
                            "as nbgrader's extensions")
    grade.add_argument("--timestamps", type=Path, metavar="CSV",
                       help="submission times you trust (student_id,assignment_id,timestamp), in place of "
                            "the ones nbgrader collect recorded in submission_times.csv")
    grade.add_argument("--jobs", type=int, metavar="N",
                       help="submissions graded at once on this machine (default: the number of cores)")
    grade.add_argument("--scheduler", metavar="ADDRESS",
                       help="grade on the workers of this Dask scheduler (tcp://host:8786 or tls://...) "
                            "instead of on this machine")
    grade.add_argument("--db-url", metavar="URL",
                       help="the gradebook of a new course directory, e.g. postgresql://grader@dbhost/course "
                            "(an existing one uses its nbgrader_config.py's c.CourseDirectory.db_url)")
    grade.add_argument("--submitted", type=Path, metavar="DIR",
                       help="the submitted folder of a new course directory, laid out as "
                            "DIR/<student_id>/<assignment_id>/ (default: COURSE/submitted)")
    grade.add_argument("--roster", type=Path, metavar="CSV",
                       help="the class's student ids (a student_id column): other folders are not graded; "
                            "without it, folder names must be ids of letters, digits and . _ - @")
    check = sub.add_parser("check", help="check my work: grade one saved notebook with the hidden checks")
    check.add_argument("notebook", type=Path, help="the .ipynb file, e.g. notebooks/01_similarity/01_similarity.ipynb")
    serve = sub.add_parser("serve-checks", help="check my work on a hub: the course-check JupyterHub service "
                                                "(run by the hub, as the instructor's account; grader/README.md)")
    serve.add_argument("--slots", type=int, metavar="N", help="checks run at once (default: the number of cores)")
    serve.add_argument("--seconds", type=float, metavar="S", default=None,
                       help="a check that takes longer is stopped, with one line to the student (default: 180)")
    serve.add_argument("--daily", type=int, metavar="N", default=0,
                       help="checks each student may start per day (default: no limit)")
    where = sub.add_parser("where", help="list every part of one exercise: solution, tests, figures, check, "
                                         "reference, mistakes, driver, test cases, grade-table column")
    where.add_argument("exercise", metavar="ID", help="an exercise id, e.g. masking-causal_mask")
    report = sub.add_parser("report", help="the class report and LMS grade tables, after grading")
    report.add_argument("--course", type=Path, metavar="DIR",
                        help="the course directory (default: the one nbgrader_config.py names); writes DIR/report/")
    report.add_argument("--roster", type=Path, metavar="CSV",
                        help="student_id,name,email,sis_user_id,sis_login_id,section: fills the LMS columns")
    args = parser.parse_args(argv)

    if args.command == "check":
        return _check(args.notebook)
    if args.command == "serve-checks":
        from .checkservice import DEFAULT_SECONDS, serve

        if (args.slots is not None and args.slots < 1) or (args.seconds is not None and args.seconds <= 0) \
                or args.daily < 0:
            print("course-grader serve-checks: --slots and --seconds must be positive, --daily 0 (no limit) "
                  "or more", file=sys.stderr)
            return 2
        return serve(args.slots, args.seconds or DEFAULT_SECONDS, args.daily)
    if args.command == "where":
        return _where(args.exercise)
    if args.command == "report":
        return _report(args.course, args.roster)
    if args.command == "release":
        return _release(args.course, args.force)

    from .coursedir import CourseDir, CourseDirError
    from .grade import format_table, grade_class, parse_duedates, read_extensions, read_timestamps
    from .parallel import EngineUnavailable

    # nbgrader 0.9.6 warns on every autograde (SQLAlchemy session, re-inserted cells
    # without ids); the grade table is what the instructor needs to see.
    warnings.filterwarnings("ignore", module="nbgrader")
    warnings.filterwarnings("ignore", module="nbformat")

    def fail(message: str) -> int:
        print(f"course-grader: {shown(message)}", file=sys.stderr)
        return 2

    if args.duedate and args.student:
        return fail("--duedate sets an assignment's due date for every student: for one student's "
                    "extension, give --extensions CSV (student_id,assignment_id,duedate)")
    if args.jobs is not None and args.jobs < 1:
        return fail(f"--jobs must be at least 1, got {args.jobs}")
    unknown = sorted(set(args.assignment) - set(course.assignments()))
    if unknown:
        return fail(f"there is no assignment {unknown[0]!r} in this course "
                    f"({', '.join(course.assignments())})")
    roster = None
    try:
        duedates = parse_duedates(args.duedate)
        timestamps = read_timestamps(args.timestamps) if args.timestamps else None
        extensions = read_extensions(args.extensions) if args.extensions else None
        if args.roster:
            from .lms import BadRoster, read_roster

            try:
                roster = set(read_roster(args.roster))
            except BadRoster as error:
                return fail(str(error))
        rows = grade_class(args.course, assignments=args.assignment or None, students=args.student or None,
                           duedates=duedates, timestamps=timestamps, extensions=extensions, jobs=args.jobs,
                           scheduler=args.scheduler, roster=roster, db_url=args.db_url, submitted=args.submitted)
    except (EngineUnavailable, CourseDirError, RuntimeError, FileNotFoundError) as error:
        return fail(str(error))
    course_dir = CourseDir.open(args.course, create=False)
    print(format_table(rows))
    print(f"\ngrade table: {shown(course_dir.grades_csv)} (the whole gradebook)")
    print(f"feedback:    {shown(course_dir.folder('feedback'))}/<student_id>/<assignment_id>/<notebook>.html")
    return 0


def _release(course_root: Path | None, force: bool) -> int:
    """``course-grader release``: the release-order check of every notebook against the course
    directory's gradebook, before anything is written; then the assembled cells and the
    student notebooks."""
    from .assembled import update_sources
    from .coursedir import CourseDir, CourseDirError
    from .release import ReleaseRefused, release, release_order

    from sqlalchemy.exc import SQLAlchemyError

    try:
        course_dir = CourseDir.open(course_root, create=False)
        notes = [release_order(a, course_dir.db_url, force) for a in course.assignments()]
    except (ReleaseRefused, CourseDirError) as error:
        print(f"course-grader release: {shown(error)}", file=sys.stderr)
        return 2
    except SQLAlchemyError as error:
        print(f"course-grader release: cannot read the gradebook {course_dir.shown_db_url}, which says which "
              f"assignments are open: {shown(str(getattr(error, 'orig', None) or error).splitlines()[0])}",
              file=sys.stderr)
        return 2
    for note in filter(None, notes):
        print(note)
    for path in update_sources():
        print(f"assembled cells rewritten in {path.relative_to(course.ROOT)}")
    for path in release(update_sources=False):
        print(f"released {path.relative_to(course.ROOT)}")
    return 0


def _check(notebook: Path) -> int:
    from .selfcheck import CannotCheck, check_notebook

    try:
        if notebook.suffix == ".ipynb" and notebook.is_file():
            print(f"checking {shown(notebook.name)} with the hidden checks (about 10 s)...", file=sys.stderr,
                  flush=True)
        checked = check_notebook(notebook)
    except CannotCheck as error:
        print(f"course-grader check: {shown(error)}", file=sys.stderr)
        return 2
    except OSError as error:  # the user's data folder, where the check's secret lives
        print(f"course-grader check: cannot keep the check's secret ({shown(error)}): set JUPYTER_DATA_DIR "
              "to a folder of your own", file=sys.stderr)
        return 2
    print("\n".join(shown(line) for line in checked.text(notebook).splitlines()))  # diagnoses quote the learner's text
    return 0 if checked.graded else 1


def _report(course_dir: Path | None, roster: Path | None) -> int:
    from .coursedir import CourseDirError
    from .lms import BadRoster
    from .report import NoGrades, write_report

    try:
        written = write_report(course_dir, roster=roster)
    except (NoGrades, BadRoster, CourseDirError) as error:
        print(f"course-grader report: {shown(error)}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {shown(path)}")
    return 0


def _where(exercise_id: str) -> int:
    from .where import where

    try:
        places = where(exercise_id)
    except LookupError as error:
        print(f"course-grader where: {shown(str(error.args[0]))}", file=sys.stderr)
        return 2
    for place in places:
        print(place)
    return 0


if __name__ == "__main__":
    sys.exit(main())
