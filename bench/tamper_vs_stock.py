"""The tamper corpus against STOCK nbgrader 0.9.6, the way an instructor runs it.

    .venv/bin/python bench/tamper_vs_stock.py [--work DIR] [--keep] [--no-ours] [--reruns N]

Builds tests/corpora/tamper.py's corpus (plus two untouched copies of a correct
submission, ``c00_control`` graded first and ``z99_control`` graded last, to show what
the attacks do to their classmates) into a throwaway copy of the course: ``solutions/``
and a stock ``nbgrader_config.py`` that sets only the source and release folders, the
course root and the python3 kernel (plus nbgrader's own late policy "zero", so that a
forged timestamp has something to win), with nbgrader's default preprocessors. Then,
exactly as an instructor would: ``nbgrader generate_assignment 01_similarity``, the due
date, and ``nbgrader autograde 01_similarity`` over every student in ONE batch. If that
batch dies, the instructor runs the same command again (``--reruns``, default 1):
nbgrader skips what it already did.

Every attack runs inside an outer safety wrapper, never on this machine directly:
bubblewrap (read-only root, the throwaway folder the only writable place, its own
/tmp, its own PID namespace, dies with this script; the network is shared so that the
helper server of the network attack is reachable), as uid 65534 when run as root
(``setpriv``; the throwaway copy is chowned to it), under ``prlimit --nproc=512
--as=12G --fsize=3G --cpu=900``. Without bwrap it falls back to setpriv + prlimit
with a warning.

The "ours" column grades the same class with ``grader.grade.grade_class`` inside the
same kind of wrapper (as root when this script is root: our grader reads the course
secret and builds its own sandbox for the kernels, which needs root or user
namespaces).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.corpora import around, harms, tamper  # noqa: E402

ASSIGNMENT = tamper.ASSIGNMENT
NOBODY = 65534
GiB = 2**30
LIMITS = {"nproc": 512, "as": 12 * GiB, "fsize": 3 * GiB, "cpu": 900}
BATCH_TIMEOUT = 3600  # seconds for one `nbgrader autograde` run, a last resort
BIN = Path(sys.executable).parent  # this environment's bin/ (nbgrader, jupyter, python)
CONTROLS = ("c00_control", "z99_control")

STOCK_CONFIG = """\
# Stock nbgrader: nothing but the folders, the kernel, and nbgrader's own late policy.
c = get_config()
c.CourseDirectory.root = {root!r}
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "release"
c.Execute.kernel_name = "python3"
# The course's late policy (nbgrader's built-in plugin): a late submission scores 0.
c.LateSubmissionPlugin.penalty_method = "zero"
"""


# --- the safety wrapper ------------------------------------------------------------

def _prlimit() -> list[str]:
    # (prlimit takes plain numbers: util-linux 2.38's prlimit crashes on "12G")
    return ["prlimit", f"--nproc={LIMITS['nproc']}", f"--as={LIMITS['as']}",
            f"--fsize={LIMITS['fsize']}", f"--cpu={LIMITS['cpu']}"]


def wrapper(work: Path, cwd: Path, as_nobody: bool = True) -> list[str]:
    """The command prefix that runs anything from the corpus: prlimit + bwrap + setpriv.

    bwrap starts as the caller (root here, so that it can bind a Python that lives in
    /root); the command inside it runs as uid 65534, whose processes the nproc limit
    counts.
    """
    nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] \
        if as_nobody and os.geteuid() == 0 else []
    # our grader (as root, not as nobody) makes a cgroup per kernel: it needs the cgroup tree
    cgroups = ["--bind", "/sys/fs/cgroup", "/sys/fs/cgroup"] \
        if not nobody and os.geteuid() == 0 and os.path.isdir("/sys/fs/cgroup") else []
    if shutil.which("bwrap"):
        return _prlimit() + [
            "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *cgroups,
            *_python_binds(), "--bind", str(work / "tmp"), "/tmp", "--bind", str(work), str(work),
            "--unshare-pid", "--unshare-ipc", "--die-with-parent", "--chdir", str(cwd)] + nobody
    print("WARNING: bwrap not found (apt-get install -y bubblewrap): the corpus runs with "
          "setpriv + prlimit only; it can read and write whatever its user can.", file=sys.stderr)
    if nobody and _python_binds():
        print("WARNING: this Python is not reachable for uid 65534 without bwrap: running as "
              f"uid {os.geteuid()}.", file=sys.stderr)
        nobody = []
    return nobody + _prlimit()


def _python_binds() -> list[str]:
    """Make the Python installation reachable for uid 65534 when it lives in a private
    folder (pyenv under /root): an empty tmpfs over that folder, the installation
    bound read-only into it. The rest of that folder stays hidden."""
    binds = []
    for prefix in dict.fromkeys([Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()]):
        closed = [p for p in reversed(prefix.parents) if p != Path("/") and not os.stat(p).st_mode & 0o001]
        if closed:
            binds += ["--tmpfs", str(closed[0])]
            for folder in [p for p in reversed(prefix.parents) if closed[0] in p.parents]:
                binds += ["--perms", "0755", "--dir", str(folder)]
            binds += ["--ro-bind", str(prefix), str(prefix)]
    return binds


def _env(work: Path) -> dict[str, str]:
    return {"PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin", "HOME": str(work / "home"),
            "LANG": "C.UTF-8", "TMPDIR": "/tmp", "MPLBACKEND": "Agg", "JUPYTER_PLATFORM_DIRS": "1",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONWARNINGS": "ignore"}


def run_wrapped(argv: list[str], work: Path, cwd: Path, log: Path, as_nobody: bool = True,
                timeout: float = BATCH_TIMEOUT) -> tuple[int, float, list[tuple[float, str]]]:
    """Run ``argv`` in the wrapper; return (exit code, seconds, [(time, log line)])."""
    start = time.monotonic()
    lines: list[tuple[float, str]] = []
    with open(log, "w", encoding="utf-8") as out:
        proc = subprocess.Popen(wrapper(work, cwd, as_nobody) + argv, cwd=cwd, env=_env(work),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True)

        def pump():
            for raw in proc.stdout:
                text = raw.decode("utf-8", "replace").rstrip("\n")
                lines.append((time.monotonic() - start, text))
                out.write(f"{time.monotonic() - start:8.1f}  {text}\n")
                out.flush()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # our own session: the wrapper and everything in it
            code = proc.wait()
        reader.join(timeout=10)
    return code, time.monotonic() - start, lines


def _chown_tree(path: Path) -> None:
    if os.geteuid() != 0:
        return
    for dirpath, dirnames, filenames in os.walk(path):
        os.chown(dirpath, NOBODY, NOBODY)
        for name in filenames:
            os.chown(os.path.join(dirpath, name), NOBODY, NOBODY, follow_symlinks=False)


def _fresh_work(work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    for sub in ("tmp", "home"):
        (work / sub).mkdir(exist_ok=True)
    os.chmod(work, 0o755)


# --- stock nbgrader ------------------------------------------------------------------

def _students(class_dir: Path) -> list[str]:
    return sorted(p.name for p in class_dir.iterdir() if p.is_dir() and not p.name.startswith("."))


def _parse_runs(runs: list[dict], students: list[str]) -> dict[str, dict]:
    """Per student: the run that graded it, its error (if any), its time, whether the
    grading process died while on it. nbgrader logs every step with the student's
    submitted or autograded path; a student's segment runs to the next student's."""
    mention = re.compile(r"/(?:submitted|autograded)/([^/\s]+)/|student with ID '([^']+)'")
    seen: dict[str, dict] = {}
    for number, run in enumerate(runs, 1):
        current = None
        for t, line in run["lines"]:
            if "There was an error processing assignment '" in line:  # the closing summary
                current = None
                continue
            m = mention.search(line)
            student = m and (m.group(1) or m.group(2))
            if student in students and student != current:
                if current:
                    seen[current]["seconds"] = t - seen[current]["start"]
                current = None
                if "Skipping existing assignment" in line:
                    continue
                current = student
                seen[student] = {"run": number, "start": t, "log": []}
            if current:
                seen[current]["log"].append(line)
        if current:
            seen[current]["seconds"] = run["seconds"] - seen[current]["start"]
            seen[current]["killed"] = run["killed"]
    for info in seen.values():
        text = "\n".join(info.pop("log"))
        at = text.find("There was an error processing assignment: ")
        info["error"] = text[at:] if at >= 0 else None
        info.pop("start")
    return seen


def _why(error: str) -> str:
    if "DeadKernelError" in error or "Kernel died" in error:
        return "kernel died"
    if "UnresponsiveKernelError" in error or "CellTimeoutError" in error or "TimeoutError" in error:
        return "kernel stopped answering"
    if "RuntimeError" in error and "Kernel didn't respond" in error:
        return "kernel did not start"
    names = re.findall(r"^(\w+(?:\.\w+)*(?:Error|Exception)):", error, re.M)
    return names[-1] if names else "error"


def grade_stock(class_dir: Path, work: Path, reruns: int = 1) -> dict[str, dict]:
    """Grade ``class_dir`` with stock nbgrader in the safety wrapper, in one batch.

    Returns {student_id: {"points": {exercise: pts or None}, "status": str, ...}};
    ``status`` is "graded", "no score: kernel died", "batch stopped before this
    student", etc., with what else the batch did to the row ("; ..."). The runs'
    exit codes and times, the cheat server's request count and the disk used are
    written to ``work/batch.json``.
    """
    class_dir, work = Path(class_dir).resolve(), Path(work).resolve()
    _fresh_work(work)
    course = work / "course"
    if course.exists():  # (rm: a previous run's attacks may have left 1,100-deep folders)
        subprocess.run(["rm", "-rf", "--one-file-system", str(course)], check=True)
    shutil.copytree(ROOT / "solutions", course / "solutions")
    (course / "nbgrader_config.py").write_text(STOCK_CONFIG.format(root=str(course)))
    students = _students(class_dir)
    uncollected = {}
    for student in students:
        source = class_dir / student / ASSIGNMENT
        if source.is_dir():
            why = _collect(source, course / "submitted" / student / ASSIGNMENT)
            if why:
                uncollected[student] = why
    _chown_tree(work)

    nbgrader = str(BIN / "nbgrader")
    setup_log = work / "setup.log"
    code, _, _ = run_wrapped(["sh", "-c", f"{nbgrader} generate_assignment {ASSIGNMENT} && "
                              f"{nbgrader} db assignment add {ASSIGNMENT} --duedate='{tamper.DUE_DATE}'"],
                             work, course, setup_log, timeout=600)
    if code != 0:
        raise RuntimeError(f"stock generate_assignment failed, see {setup_log}")

    runs = []
    with tamper.serve_cheats() as cheats:
        for number in range(1, reruns + 2):
            code, seconds, lines = run_wrapped([nbgrader, "autograde", ASSIGNMENT], work, course,
                                               work / f"autograde-run{number}.log")
            killed = code < 0 or code >= 128  # a signal, directly or through bwrap
            runs.append({"code": code, "seconds": seconds, "lines": lines, "killed": killed})
            if not killed:
                break
        cheat_requests = cheats.requests

    # then, as an instructor would: feedback for everyone, and the grade table
    feedback_log, export_log = work / "feedback.log", work / "export.log"
    run_wrapped([nbgrader, "generate_feedback", ASSIGNMENT, "--force"], work, course, feedback_log)
    run_wrapped([nbgrader, "export", "--to", str(course / "export.csv")], work, course, export_log)

    seen = _parse_runs(runs, students)
    results = _read_gradebook(course, students)
    for student in students:
        results[student]["outputs"] = _outputs(course, student)
    csv_rows = _csv_rows(course / "export.csv")
    terminal = "\n".join(text for run in runs for _, text in run["lines"])
    for student in students:
        r = results[student]
        info = seen.get(student)
        notes = []
        if info is None:
            r["status"] = "batch stopped before this student" if runs[-1]["killed"] else "not graded"
        else:
            if info["run"] > 1:
                notes.append("batch stopped before it, graded by the rerun" if info["run"] == 2
                             else f"graded by rerun {info['run'] - 1}")
            if info.get("killed"):
                r["status"] = "no score: the grading process was killed while grading it"
            elif info.get("error"):
                r["status"] = f"no score: {_why(info['error'])}"
            elif r["scored"]:
                r["status"] = "graded"
            else:
                r["status"] = "no score"
            r["seconds"] = round(info.get("seconds", 0.0), 1)
        if r.get("manual"):
            notes.append(f"manual_score set mid-batch ({r['manual']})")
        if r.get("late_penalty"):
            notes.append(f"late: penalty {r['late_penalty']:g}")
        elif r.get("timestamp"):
            notes.append(f"on time by its timestamp.txt ({r['timestamp']:.10})")
        if _changed(class_dir / student / ASSIGNMENT, course / "submitted" / student / ASSIGNMENT):
            notes.append("submission overwritten mid-batch")
        graded = _answers(course / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
        if graded and graded != _answers(class_dir / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"):
            notes.append("answers in its autograded notebook overwritten")
        if student in uncollected:
            notes.append(f"not collected: {uncollected[student]}")
        if notes:
            r["status"] += "; " + "; ".join(notes)
        r["csv_rows"] = csv_rows
        r["table"] = terminal
    batch = {"runs": [{"exit": x["code"], "seconds": round(x["seconds"], 1)} for x in runs],
             "seconds": round(sum(x["seconds"] for x in runs), 1),
             "cheat_requests": cheat_requests, "disk_bytes": _du(work)}
    (work / "batch.json").write_text(json.dumps(batch, indent=1))
    return results


def _collect(source: Path, dest: Path) -> str | None:
    """Copy a submitted folder as nbgrader's exchange collects it (shutil.copytree, which
    follows links), except that a device or a FIFO is never read (this script must not
    hang or fill the disk). Returns why a file was not copied, or None."""
    skipped = []

    def copy(src, dst):
        mode = os.stat(src).st_mode
        if not stat.S_ISREG(mode):
            skipped.append(os.path.basename(src))
            return dst
        return shutil.copy2(src, dst)

    try:
        shutil.copytree(source, dest, copy_function=copy)
    except (OSError, shutil.Error) as error:
        return f"{type(error).__name__}"
    return f"special files {skipped}" if skipped else None


def _outputs(course: Path, student: str) -> dict:
    """The feedback page and the autograded notebook stock nbgrader left for a student."""
    found = {}
    for key, path in (("feedback", course / "feedback" / student / ASSIGNMENT / f"{ASSIGNMENT}.html"),
                      ("autograded", course / "autograded" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")):
        try:
            if path.is_file() and path.stat().st_size < 50 * 2**20:
                text = path.read_text(encoding="utf-8", errors="replace")
                found[key] = json.loads(text) if key == "autograded" else text
        except (OSError, ValueError):
            pass
    return found


def _csv_rows(path: Path) -> list[list[str]]:
    import csv

    try:
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            return list(csv.reader(f))
    except OSError:
        return []


def _read_gradebook(course: Path, students: list[str]) -> dict[str, dict]:
    from nbgrader.api import Gradebook, MissingEntry

    out = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for student in students:
            r = {"points": {e: None for e in tamper.POINTS}, "scored": False}
            try:
                submission = gb.find_submission(ASSIGNMENT, student)
            except MissingEntry:
                out[student] = r
                continue
            manual = []
            for nb in submission.notebooks:
                for grade in nb.grades:
                    exercise = grade.name[:-len("-test")] if grade.name.endswith("-test") else grade.name
                    if grade.auto_score is not None or grade.manual_score is not None:
                        r["points"][exercise] = float(grade.score)
                        r["scored"] = True
                    if grade.manual_score is not None:
                        manual.append(f"{grade.manual_score:g}")
                if nb.late_submission_penalty:
                    r["late_penalty"] = float(nb.late_submission_penalty)
            r["manual"] = "/".join(manual)
            if submission.timestamp is not None:
                r["timestamp"] = str(submission.timestamp)
            out[student] = r
    return out


def _answers(path: Path) -> dict[str, str] | None:
    """grade id -> source of the answer cells of a notebook (None if unreadable or huge)."""
    try:
        if path.stat().st_size > 50 * 2**20:
            return None
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return {c["metadata"]["nbgrader"]["grade_id"]: "".join(c["source"]) for c in cells
                if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _changed(original: Path, copy: Path) -> bool:
    if not original.is_dir():
        return False
    for path in original.rglob("*"):
        if path.is_file():
            other = copy / path.relative_to(original)
            if not other.is_file() or other.read_bytes() != path.read_bytes():
                return True
    return False


def _du(path: Path) -> int:
    """Apparent size of everything under ``path``, in bytes (``du``: an attack may leave
    folders deeper than Python's recursion limit)."""
    done = subprocess.run(["du", "-s", "-b", str(path)], capture_output=True, text=True)
    try:
        return int(done.stdout.split()[0])
    except (IndexError, ValueError):
        return -1


# --- our grader ------------------------------------------------------------------------

def ours(class_dir: Path, out: Path) -> dict[str, dict]:
    """Our grader on the same class: {student_id: {"points", "status", "score"}}."""
    from grader.grade import grade_class

    # the instructor's due date and trusted submission time (only t12's is recorded: late)
    from grader.grade import format_table

    rows = grade_class(Path(out), submitted=Path(class_dir), progress=False, duedates={ASSIGNMENT: tamper.DUE_DATE},
                       timestamps={("t12_forged_timestamp", ASSIGNMENT): tamper.TRUE_TIMESTAMP})
    csv_rows, table_text = _csv_rows(Path(out) / "grades.csv"), format_table(rows)
    return {r.student_id: {"points": dict(r.points), "status": r.status, "score": r.score,
                           "late_penalty": sum(r.points.values()) - r.score,
                           "outputs": _outputs(Path(out), r.student_id),
                           "csv_rows": csv_rows, "table": table_text}
            for r in rows if r.assignment_id in (ASSIGNMENT, "")}  # "": a folder that is no student id


def ours_wrapped(class_dir: Path, work: Path) -> dict[str, dict]:
    """``ours`` in the safety wrapper (as root when we are root; see the module doc)."""
    _fresh_work(work)
    out = work / "ours"
    result = work / "ours.json"
    code, _, _ = run_wrapped(
        [sys.executable, str(Path(__file__).resolve()), "--ours-only", str(class_dir), str(out), str(result)],
        work, work, work / "ours.log", as_nobody=False)
    if code != 0 or not result.is_file():
        raise RuntimeError(f"our grader failed (exit {code}), see {work / 'ours.log'}")
    return json.loads(result.read_text())


# --- the table ------------------------------------------------------------------------

def _class(dest: Path) -> dict[str, dict]:
    """The tamper corpus plus the two controls."""
    expected = tamper.build(dest, private=dest.parent / "private")
    for control in CONTROLS + (around.CLASSMATE,):  # the classmate is the one the link attacks point at
        shutil.copytree(tamper.SOURCE.parent, dest / control / ASSIGNMENT)
        expected[control] = {ASSIGNMENT: {"score": 10, "exercises": dict(tamper.POINTS)},
                             "what": "untouched correct submission (ada's)", "targets": [], "harm": "points"}
    return expected


def _on(points: dict, targets: list[str], late_penalty: float = 0.0) -> str:
    """Points on the targets; with every exercise targeted, the total after any late penalty."""
    if not targets:
        targets = list(tamper.POINTS)
    if any(points.get(t) is None for t in targets):
        got = "-"
    else:
        penalty = late_penalty if len(targets) == len(tamper.POINTS) else 0.0
        got = f"{max(0.0, sum(points[t] for t in targets) - penalty):g}"
    return f"{got}/{sum(tamper.POINTS[t] for t in targets)}"


def _achieved(e: dict, r: dict | None, reference: dict | None) -> str:
    """What the attack got from one grader, in a few words ('WON: ...' when it won)."""
    if r is None:
        return "n/a"
    outputs = r.get("outputs", {})
    outcome = harms.Outcome(points=r.get("points", {}), status=r.get("status", ""),
                            feedback=outputs.get("feedback"), autograded=outputs.get("autograded"),
                            csv_rows=r.get("csv_rows", []), table=r.get("table", ""),
                            reference_feedback=(reference or {}).get("outputs", {}).get("feedback"))
    said, won = harms.judge(e.get("harm", "points"), outcome, e["targets"])
    return ("WON: " if won else "") + said


def table(expected: dict, stock: dict, our: dict | None) -> str:
    """Per attack: points on its targets and what else it achieved, stock beside ours.
    Names are shown with repr() where they hold anything a terminal would act on."""
    attack = {a.student_id: a.name for a in tamper.ATTACKS}
    head = ["student", "attack", "targets", "stock", "ours", "stock: achieved", "ours: achieved", "stock status"]
    rows = []
    for student, e in sorted(expected.items()):
        targets = e["targets"]
        s = stock.get(student, {})
        o = (our or {}).get(student)
        shown = student if student.isprintable() and student.isascii() else repr(student)
        rows.append([shown[:40], attack.get(student, "control"),
                     "all" if not targets or len(targets) == len(tamper.POINTS)
                     else ",".join(t.split("-")[-1] for t in targets),
                     _on(s.get("points", {}), targets, s.get("late_penalty", 0.0)),
                     _on(o["points"], targets, o.get("late_penalty", 0.0)) if o else "n/a",
                     _achieved(e, s, stock.get(CONTROLS[0])) if e.get("harm", "points") != "points" else "",
                     _achieved(e, o, (our or {}).get(CONTROLS[0])) if e.get("harm", "points") != "points" else "",
                     repr(s.get("status", "?"))[1:-1][:90]])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head) - 1)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    return "\n".join(fmt.format(*r) for r in [head] + rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, help="working folder (default: a new one under /var/tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the working folder")
    parser.add_argument("--no-ours", action="store_true", help="skip our grader")
    parser.add_argument("--reruns", type=int, default=1, help="reruns after the batch dies (default 1)")
    parser.add_argument("--ours-only", nargs=3, metavar=("CLASS", "OUT", "RESULT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.ours_only:  # inside the wrapper: grade, write JSON
        import warnings

        warnings.filterwarnings("ignore")
        class_dir, out, result = map(Path, args.ours_only)
        Path(result).write_text(json.dumps(ours(class_dir, out), indent=1))
        return 0

    work = (args.work or Path(tempfile.mkdtemp(prefix="tamper-stock-", dir="/var/tmp"))).resolve()
    _fresh_work(work)
    print(f"working folder: {work}")
    try:
        class_dir = work / "class"
        if class_dir.exists():
            shutil.rmtree(class_dir)
        expected = _class(class_dir)
        print(f"stock nbgrader: autograding {len(expected)} students in one batch ...", flush=True)
        stock = grade_stock(class_dir, work / "stock", reruns=args.reruns)
        batch = json.loads((work / "stock" / "batch.json").read_text())
        our = None
        if not args.no_ours:
            print("our grader ...", flush=True)
            try:
                with tamper.serve_cheats() as cheats:
                    our = ours_wrapped(class_dir, work / "ours-run")
                print(f"our grader: the cheat server got {cheats.requests} requests")
            except Exception as error:  # report, keep the stock table
                print(f"our grader could not run: {error}")
        print()
        print(table(expected, stock, our))
        print("(stock and ours: points on the attack's targets / their maximum, after any late penalty; "
              "'-' = no score at all. Both have the due date; ours also has the trusted submission times.)")
        print()
        runs = ", ".join(f"run {i}: exit {r['exit']}, {r['seconds']:.0f} s" for i, r in enumerate(batch["runs"], 1))
        print(f"stock batch: {batch['seconds']:.0f} s ({runs}); the cheat server answered "
              f"{batch['cheat_requests']} requests; the throwaway course holds {batch['disk_bytes'] / GiB:.1f} GiB")
        slow = sorted(((s, v["seconds"]) for s, v in stock.items() if v.get("seconds", 0) > 20), key=lambda x: -x[1])
        if slow:
            print("slowest students: " + ", ".join(f"{s} {t:.0f} s" for s, t in slow))
        (work / "stock.json").write_text(json.dumps({"stock": stock, "batch": batch, "ours": our}, indent=1))
        if args.keep:
            print(f"details: {work / 'stock.json'} and the logs in {work / 'stock'}")
        else:
            print("(--keep keeps the working folder: stock.json, the nbgrader logs, the graded notebooks)")
    finally:
        if not args.keep:  # rm, not shutil.rmtree: an attack may leave 1,100-deep folders behind
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
