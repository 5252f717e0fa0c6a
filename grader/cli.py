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
    sub.add_parser("release", help="regenerate notebooks/ from solutions/")
    grade = sub.add_parser("grade", help="autograde DIR/<student_id>/<assignment_id>/<notebook>.ipynb")
    grade.add_argument("submissions", type=Path, nargs="?", default=course.SAMPLE_CLASS)
    grade.add_argument("--out", type=Path, default=Path("out/grading"),
                       help="where grades.csv, feedback/ and the gradebook go (default: out/grading)")
    grade.add_argument("--duedate", action="append", default=[], metavar="ASSIGNMENT=DATE",
                       help='a due date, e.g. 01_similarity="2026-12-01 23:59 UTC" (repeatable)')
    grade.add_argument("--timestamps", type=Path, metavar="CSV",
                       help="submission times you trust (student_id,assignment_id,timestamp), "
                            "e.g. exported from your LMS; needed for late penalties")
    grade.add_argument("--jobs", type=int, metavar="N",
                       help="submissions graded at once on this machine (default: the number of cores)")
    grade.add_argument("--scheduler", metavar="ADDRESS",
                       help="grade on the workers of this Dask scheduler (tcp://host:8786 or tls://...) "
                            "instead of on this machine")
    grade.add_argument("--db-url", metavar="URL",
                       help="the gradebook, e.g. postgresql://grader@dbhost/course (default: "
                            "nbgrader_config.py's c.CourseDirectory.db_url, else OUT/course/gradebook.db)")
    grade.add_argument("--roster", type=Path, metavar="CSV",
                       help="the class's student ids (a student_id column): other folders are not graded; "
                            "without it, folder names must be ids of letters, digits and . _ - @")
    check = sub.add_parser("check", help="check my work: grade one saved notebook with the hidden checks")
    check.add_argument("notebook", type=Path, help="the .ipynb file, e.g. notebooks/01_similarity/01_similarity.ipynb")
    report = sub.add_parser("report", help="the class report and LMS grade tables, after grading")
    report.add_argument("--out", type=Path, default=Path("out/grading"),
                        help="the grading output folder (default: out/grading); writes OUT/report/")
    report.add_argument("--db-url", metavar="URL",
                        help="the gradebook (default: as `grade` chooses it for --out)")
    report.add_argument("--roster", type=Path, metavar="CSV",
                        help="student_id,name,email,sis_user_id,sis_login_id,section: fills the LMS columns")
    args = parser.parse_args(argv)

    if args.command == "check":
        return _check(args.notebook)
    if args.command == "report":
        return _report(args.out, args.db_url, args.roster)
    if args.command == "release":
        from .release import release

        for path in release():
            print(f"released {path.relative_to(course.ROOT)}")
        return 0

    from .grade import format_table, grade_class, read_timestamps
    from .parallel import EngineUnavailable

    # nbgrader 0.9.6 warns on every autograde (SQLAlchemy session, re-inserted cells
    # without ids); the grade table is what the instructor needs to see.
    warnings.filterwarnings("ignore", module="nbgrader")
    warnings.filterwarnings("ignore", module="nbformat")

    if not args.submissions.is_dir():
        print(f"course-grader: no submissions folder at {shown(args.submissions)}: "
              "pass DIR laid out as DIR/<student_id>/<assignment_id>/<notebook>.ipynb", file=sys.stderr)
        return 2
    bad = [d for d in args.duedate if "=" not in d]
    if bad:
        print(f"course-grader: --duedate wants ASSIGNMENT=DATE, got {shown(repr(bad[0]))}", file=sys.stderr)
        return 2
    duedates = dict(d.split("=", 1) for d in args.duedate)
    timestamps = read_timestamps(args.timestamps) if args.timestamps else None
    roster = None
    if args.roster:
        from .lms import BadRoster, read_roster

        try:
            roster = set(read_roster(args.roster))
        except BadRoster as error:
            print(f"course-grader: {shown(error)}", file=sys.stderr)
            return 2
    if args.jobs is not None and args.jobs < 1:
        print(f"course-grader: --jobs must be at least 1, got {args.jobs}", file=sys.stderr)
        return 2
    try:
        rows = grade_class(args.submissions, args.out, duedates=duedates, timestamps=timestamps,
                           jobs=args.jobs, scheduler=args.scheduler, db_url=args.db_url, roster=roster)
    except (EngineUnavailable, RuntimeError) as error:
        print(f"course-grader: {shown(error)}", file=sys.stderr)
        return 2
    print(format_table(rows))
    print(f"\ngrade table: {shown(args.out / 'grades.csv')}")
    print(f"feedback:    {shown(args.out / 'course' / 'feedback')}/<student_id>/<assignment_id>/<notebook>.html")
    return 0


def _check(notebook: Path) -> int:
    from .selfcheck import CannotCheck, check_notebook

    try:
        if notebook.suffix == ".ipynb" and notebook.is_file():
            print(f"checking {shown(notebook.name)} with the hidden checks (about 15 s)...", file=sys.stderr,
                  flush=True)
        checked = check_notebook(notebook)
    except CannotCheck as error:
        print(f"course-grader check: {shown(error)}", file=sys.stderr)
        return 2
    print("\n".join(shown(line) for line in checked.text(notebook).splitlines()))  # diagnoses quote the learner's text
    return 0 if checked.graded else 1


def _report(out: Path, db_url: str | None, roster: Path | None) -> int:
    from .lms import BadRoster
    from .report import NoGrades, write_report

    try:
        written = write_report(out, db_url=db_url, roster=roster)
    except (NoGrades, BadRoster) as error:
        print(f"course-grader report: {shown(error)}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
