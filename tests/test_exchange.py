"""nbgrader's real exchange, collected by ``grader.exchange.TrustedCollect``.

The instructor (root, as the tests run) uses nbgrader's own commands in a course folder
of the test's (``generate_assignment``, ``release_assignment``, ``collect``), whose
``nbgrader_config.py`` loads the course's and plugs TrustedCollect in. Each student is a
real Linux account (``useradd``; removed with ``userdel -r`` at the end) with its own
HOME, running ``nbgrader fetch_assignment`` and ``nbgrader submit`` as itself through
``runuser``, then attacking its own submission folder in the exchange as itself: forged
times in the folder name and timestamp.txt, mtimes set back, links to a root-only file
and to a classmate's notebook, FIFOs, a folder claiming a classmate's name, a link named
as a submission. Every nbgrader command is the venv's, by absolute path, with a PATH
that does not hold the venv. No notebook is executed.

The accounts, and the mount namespace that lets them run the venv's interpreter, are
``tests/accounts.py``'s.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from grader.exchange import TIMES_FILE, read_submission_times
from tests.accounts import course_dir, instructor

A = "01_similarity"
NB = f"{A}.ipynb"
COURSE = "afs-exchange-test"
STUDENTS = ("afs_stu1", "afs_stu2", "afs_stu3", "afs_stu4")
HONEST, FORGER, TWICE, ATTACKER = STUDENTS
FORGED = "2000-01-01 00:00:00.000000 UTC"  # a constant "format": nbgrader then names the folder and
#                                            writes timestamp.txt with this time
LATER = "2099-01-01 00:00:00.000000 UTC"  # folder-name times that would win in stock collect
SLACK = timedelta(seconds=1)  # ctime is the kernel's coarse clock


# --- the course ---------------------------------------------------------------------------------


def _api(folder: Path, **config):
    """nbgrader's API (what formgrader calls) on the course folder's configuration."""
    from nbgrader.apps import NbGraderAPI
    from traitlets.config.loader import PyFileConfigLoader

    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(folder)).load_config()
    for section, values in config.items():
        for key, value in values.items():
            setattr(cfg[section], key, value)
    return NbGraderAPI(config=cfg)


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


def _mark(notebook: Path, text: str) -> None:
    """Give the student's notebook a recognisable answer (written in place: its owner stays)."""
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    nb["cells"] = [c for c in nb["cells"] if c.get("id") != "afs-mark"]
    nb["cells"].append({"cell_type": "markdown", "id": "afs-mark", "metadata": {}, "source": f"MARK: {text}"})
    notebook.write_text(json.dumps(nb), encoding="utf-8")


def _tree(folder: Path) -> dict:
    """Every entry under ``folder``, never followed: its kind and, for a file, its bytes."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            found[str(path.relative_to(folder))] = path.read_bytes() if stat.S_ISREG(st.st_mode) \
                else ("dir" if stat.S_ISDIR(st.st_mode) else f"special {stat.S_IFMT(st.st_mode):o}")
    return found


@pytest.fixture(scope="module")
def world(accounts, tmp_path_factory):
    """The exchange after four students submitted (and attacked) assignment 01, before any collect."""
    from nbgrader.api import Gradebook

    import grader.release  # noqa: F401 - see below

    accounts.add(*STUDENTS)
    base = accounts.base
    exchange = base / "exchange"
    exchange.mkdir()
    os.chmod(exchange, 0o1777)  # nbgrader's docs: writable by everyone, sticky
    secret = base / "root-only" / "secret.txt"
    secret.parent.mkdir(mode=0o700)
    secret.write_text(f"ROOT-ONLY-{secrets.token_hex(8)}")
    secret.chmod(0o600)
    root = tmp_path_factory.mktemp("exchange-course")
    main = course_dir(root / "main", exchange, root / "gradebook.db", COURSE)
    # nbgrader 0.9.6 runs `alembic` from PATH to stamp a new gradebook; the venv is not on
    # PATH, so the gradebook is made here, where grader.release answers that in process.
    Gradebook(f"sqlite:///{root / 'gradebook.db'}", COURSE).close()
    instructor(main, "generate_assignment", A)
    instructor(main, "release_assignment", A)
    inbound = exchange / COURSE / "inbound"
    planted_nb = base / "planted.ipynb"
    shutil.copy(main / "release" / A / NB, planted_nb)
    _mark(planted_nb, "PLANTED")
    os.chmod(planted_nb, 0o644)
    times: dict[str, datetime] = {}

    def start(user: str, mark: str) -> Path:
        work = accounts.enroll(user, exchange, COURSE)
        accounts.nbgrader(user, "fetch_assignment", A)
        _mark(work / A / NB, mark)
        return work / A / NB

    def mine(user: str) -> list[Path]:
        return sorted(p for p in inbound.iterdir() if p.name.startswith(f"{user}+"))

    def honest():
        start(HONEST, "honest")
        times["honest from"] = _now()
        accounts.nbgrader(HONEST, "submit", A)
        times["honest to"] = _now()

    def forger():
        start(FORGER, "forger")
        times["forger from"] = _now()
        accounts.nbgrader(FORGER, "submit", A, f"--Exchange.timestamp_format={FORGED}")
        [folder] = mine(FORGER)
        accounts.run(FORGER, "sh", "-c", f'printf "%s" "{FORGED}" > "$1/timestamp.txt"; '
                     'printf "../../../etc/passwd" > "$1/submission_secret.txt"; '
                     'find "$1" -exec touch -h -d "2000-01-01 00:00:00" {} +', "sh", folder)
        times["forger to"] = _now()

    def twice():
        notebook = start(TWICE, "v1")
        accounts.nbgrader(TWICE, "submit", A)
        times["twice between"] = _now()
        time.sleep(0.05)
        _mark(notebook, "v2")
        # the second one's folder name says 2000: stock collect would take the first
        accounts.nbgrader(TWICE, "submit", A, f"--Exchange.timestamp_format={FORGED}")
        times["twice second"] = _now()

    def attacker():
        start(ATTACKER, "attacker")
        accounts.nbgrader(ATTACKER, "submit", A)
        [folder] = mine(ATTACKER)
        classmate = accounts.home(HONEST) / "work" / A
        accounts.run(ATTACKER, "sh", "-c", """set -e
            cd "$1"; ln -s "$2" stolen.txt; ln -s "$3/01_similarity.ipynb" classmate.ipynb; mkfifo pipe
            mkdir sub; ln -s "$2" sub/deep; mkfifo sub/pipe
            mkdir "$4"; cp "$5" "$4/01_similarity.ipynb"; printf "%s" "$7" > "$4/timestamp.txt"
            ln -s "$3" "$6"; mkdir "$8"
            """, "sh", folder, secret, classmate, inbound / f"{HONEST}+{A}+{LATER}+planted", planted_nb,
            inbound / f"{ATTACKER}+{A}+{LATER}+link", LATER, inbound / f"..+{A}+{LATER}+dots")

    with ThreadPoolExecutor(2) as pool:  # two cores; each student's steps in order
        for future in [pool.submit(f) for f in (twice, honest, forger, attacker)]:
            future.result()
    return {"exchange": exchange, "inbound": inbound, "root": root, "main": main, "secret": secret,
            "times": times, "db": root / "gradebook.db", "accounts": accounts}


def _state(folder: Path) -> dict:
    submitted = folder / "submitted"
    csv_text = (folder / TIMES_FILE).read_text(encoding="utf-8") if (folder / TIMES_FILE).exists() else None
    return {"tree": _tree(submitted) if submitted.exists() else {}, "csv": csv_text,
            "times": read_submission_times(folder)}


@pytest.fixture(scope="module")
def collected(world):
    """``nbgrader collect 01_similarity`` in the main course, and what it left."""
    log = instructor(world["main"], "collect", A)
    return {"log": log, **_state(world["main"])}


def _stamp(state: dict, student: str) -> datetime:
    from nbgrader.utils import parse_utc

    return parse_utc(state["tree"][f"{student}/{A}/timestamp.txt"].decode())


def _collected_mark(state: dict, student: str) -> str | None:
    data = state["tree"].get(f"{student}/{A}/{NB}")
    return None if data is None else _mark_of_bytes(data)


def _mark_of_bytes(data: bytes) -> str | None:
    for cell in json.loads(data)["cells"]:
        if cell.get("id") == "afs-mark":
            return cell["source"].removeprefix("MARK: ")
    return None


# --- the cases ----------------------------------------------------------------------------------


def test_an_honest_submission_is_collected_with_its_real_time(world, collected):
    times = world["times"]
    assert _collected_mark(collected, HONEST) == "honest"
    assert times["honest from"] - SLACK <= _stamp(collected, HONEST) <= times["honest to"] + SLACK
    assert f"Collecting submission: {HONEST} {A}" in collected["log"]


def test_forged_folder_name_timestamp_and_mtimes_do_not_move_the_time(world, collected):
    times = world["times"]
    [folder] = [p for p in world["inbound"].iterdir() if p.name.startswith(f"{FORGER}+")]
    assert FORGED in folder.name and (folder / "timestamp.txt").read_text() == FORGED  # the forgery is there
    assert _collected_mark(collected, FORGER) == "forger"
    assert times["forger from"] - SLACK <= _stamp(collected, FORGER) <= times["forger to"] + SLACK
    # the secret names nbgrader's feedback file: not a hex token, so it is not kept
    assert f"{FORGER}/{A}/submission_secret.txt" not in collected["tree"]
    assert f"{FORGER} {A}: dropped submission_secret.txt: not a hex token" in collected["log"]


def test_of_two_submissions_the_later_is_collected_whatever_their_names_say(world, collected):
    names = sorted(p.name for p in world["inbound"].iterdir() if p.name.startswith(f"{TWICE}+"))
    assert len(names) == 2 and any(FORGED in n for n in names)  # stock would take the other one
    assert _collected_mark(collected, TWICE) == "v2"
    assert _stamp(collected, TWICE) >= world["times"]["twice between"]


def test_links_fifos_and_folders_are_not_copied(world, collected):
    mine = {k: v for k, v in collected["tree"].items() if k.startswith(f"{ATTACKER}/")}
    assert set(mine) == {f"{ATTACKER}/{A}", f"{ATTACKER}/{A}/{NB}", f"{ATTACKER}/{A}/timestamp.txt",
                         f"{ATTACKER}/{A}/submission_secret.txt"}
    assert _collected_mark(collected, ATTACKER) == "attacker"
    secret = world["secret"].read_bytes()
    assert not any(isinstance(v, bytes) and secret in v for v in collected["tree"].values())
    log = collected["log"]
    assert "left out symbolic links (not followed): 'stolen.txt'" in log
    assert "left out special files (FIFO, socket or device): 'pipe'" in log
    assert "left out folders, hidden files and other notebooks: 'classmate.ipynb', 'sub'" in log


def test_a_folder_claiming_a_classmates_name_or_no_student_or_a_link_is_not_collected(world, collected):
    log = collected["log"]
    assert f"claims to be a submission of {HONEST} but belongs to {ATTACKER}" in log
    assert f"'{ATTACKER}+{A}+{LATER}+link': it is a symbolic link" in log
    assert f"'..+{A}+{LATER}+dots': the user it names is not a valid student id" in log
    assert _collected_mark(collected, HONEST) == "honest"  # not the planted one, though its name is later
    assert not any(isinstance(v, bytes) and b"PLANTED" in v for v in collected["tree"].values())
    assert set(collected["times"]) == {(s, A) for s in STUDENTS}


def test_timestamp_txt_equals_submission_times_csv(world, collected):
    assert collected["csv"].splitlines()[0] == "student_id,assignment_id,timestamp"
    assert len(collected["csv"].splitlines()) == 1 + len(STUDENTS)
    for student in STUDENTS:
        written = collected["tree"][f"{student}/{A}/timestamp.txt"].decode()
        assert written == collected["times"][(student, A)]
        assert written.endswith(" UTC") and len(written) == len("2026-01-01 00:00:00.000000 UTC")
        if student != FORGER:  # the student's key for fetch_feedback, kept as it is
            secret = collected["tree"][f"{student}/{A}/submission_secret.txt"]
            assert len(secret) == 128 and int(secret, 16) >= 0


def test_before_duedate_uses_the_students_due_date_with_its_extension(world, collected):
    from nbgrader.api import Gradebook

    db = world["root"] / "duedate.db"
    shutil.copy(world["db"], db)
    folder = course_dir(world["root"] / "duedate", world["exchange"], db, COURSE)
    due = world["times"]["twice between"]
    with Gradebook(f"sqlite:///{db}", COURSE) as gb:
        gb.update_or_create_assignment(A, duedate=due)
    api = _api(folder, ExchangeCollect={"before_duedate": True})
    result = api.collect(A, update=False)
    assert result["success"], result
    state = _state(folder)
    assert _collected_mark(state, TWICE) == "v1" and _stamp(state, TWICE) <= due
    with Gradebook(f"sqlite:///{db}", COURSE) as gb:
        gb.update_or_create_student(TWICE)
        gb.update_or_create_submission(A, TWICE, extension=timedelta(days=1))
    result = api.collect(A, update=False)
    assert result["success"], result
    state = _state(folder)
    assert _collected_mark(state, TWICE) in ("v2", "v3") and _stamp(state, TWICE) > due
    assert state["times"][(TWICE, A)] == state["tree"][f"{TWICE}/{A}/timestamp.txt"].decode()


@pytest.fixture(scope="module")
def updated(world, collected):
    """A third submission of afs_stu3, then ``nbgrader collect --update``, then formgrader's collect again."""
    accounts = world["accounts"]
    _mark(accounts.home(TWICE) / "work" / A / NB, "v3")
    third_from = _now()
    accounts.nbgrader(TWICE, "submit", A)
    log = instructor(world["main"], "collect", "--update", A)
    after = _state(world["main"])
    dest = world["main"] / "submitted" / HONEST / A
    inode = dest.stat().st_ino
    again = _api(world["main"]).collect(A)
    return {"log": log, "third from": third_from, **after, "again": again, "after again": _state(world["main"]),
            "inode kept": dest.stat().st_ino == inode}


def test_update_recollects_a_newer_submission_and_is_idempotent(world, collected, updated):
    assert f"Updating submission: {TWICE} {A}" in updated["log"]
    assert f"No newer submission to collect: {HONEST} {A}" in updated["log"]
    assert _collected_mark(updated, TWICE) == "v3"
    assert _stamp(updated, TWICE) >= updated["third from"] - SLACK
    assert updated["times"][(TWICE, A)] == updated["tree"][f"{TWICE}/{A}/timestamp.txt"].decode()
    for student in (HONEST, FORGER, ATTACKER):  # the others stay as they were
        assert updated["times"][(student, A)] == collected["times"][(student, A)]
        assert {k: v for k, v in updated["tree"].items() if k.startswith(f"{student}/")} == \
            {k: v for k, v in collected["tree"].items() if k.startswith(f"{student}/")}
    assert updated["again"]["success"], updated["again"]
    assert updated["after again"] == {k: updated[k] for k in ("tree", "csv", "times")}
    assert updated["inode kept"]
    assert "Updating submission" not in updated["again"]["log"]


def test_formgrader_collect_gives_the_same_result(world, updated):
    from grader.exchange import TrustedCollect

    folder = course_dir(world["root"] / "formgrader", world["exchange"], world["db"], COURSE)
    api = _api(folder)
    assert api.exchange.collect is TrustedCollect
    result = api.collect(A)
    assert result["success"], result
    state = _state(folder)
    assert state["tree"] == updated["tree"] and state["csv"] == updated["csv"]
    assert "claims to be a submission of" in result["log"]


def test_one_account_for_everyone_turns_the_owner_check_off(world):
    """Submissions all made by the collecting account (students share it): collected by default;
    with check_owner = True, none is."""
    course_id = "afs-one-account"
    inbound = world["exchange"] / course_id / "inbound"
    inbound.mkdir(parents=True)
    for student in ("solo1", "solo2"):
        folder = inbound / f"{student}+{A}+2026-01-01 00:00:00.000000 UTC+x"
        folder.mkdir()
        shutil.copy(world["main"] / "release" / A / NB, folder / NB)
        (folder / "submission_secret.txt").write_text(secrets.token_hex(64))
    root = world["root"]
    folder = course_dir(root / "one-account", world["exchange"], root / "one-account.db", course_id)
    result = _api(folder).collect(A)
    assert result["success"], result
    assert "owners are not checked" in result["log"]
    assert set(read_submission_times(folder)) == {("solo1", A), ("solo2", A)}
    strict = course_dir(root / "strict", world["exchange"], root / "strict.db", course_id,
                         extra="c.TrustedCollect.check_owner = True\n")
    result = _api(strict).collect(A)
    assert result["success"], result
    assert "claims to be a submission of solo1 but belongs to root" in result["log"]
    assert read_submission_times(strict) == {} and not (strict / "submitted").exists()


def test_the_time_walk_follows_no_link_and_is_bounded(tmp_path, monkeypatch):
    """In process, on folders made here: a link's target never counts, and a folder too deep or
    with too many entries has no time (it is not collected)."""
    from grader import exchange

    folder = tmp_path / "inbound" / "x+a+t"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / NB).write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (folder / "sub" / "link").symlink_to(elsewhere)
    before = exchange.walk(str(folder.parent), folder.name)
    time.sleep(0.05)
    (elsewhere / "later.txt").write_text("changed after")  # would move the time if the link were followed
    assert exchange.walk(str(folder.parent), folder.name) == before
    assert before.top == (("sub", True),) and before.time <= _now()
    (folder / "sub" / NB).chmod(0o600)  # a change inside: ctime moves, whatever the mtime says
    os.utime(folder / "sub" / NB, (0, 0))
    assert exchange.walk(str(folder.parent), folder.name).ctime_ns > before.ctime_ns
    deep = folder / "sub"
    for _ in range(exchange.MAX_DEPTH):
        deep = deep / "d"
    deep.mkdir(parents=True)
    with pytest.raises(exchange._NoTime, match="nested more than"):
        exchange.walk(str(folder.parent), folder.name)
    shutil.rmtree(folder / "sub" / "d")
    monkeypatch.setattr(exchange, "MAX_ENTRIES", 3)
    with pytest.raises(exchange._NoTime, match="more than 3 entries"):
        for n in range(3):
            (folder / f"f{n}").write_text("")
        exchange.walk(str(folder.parent), folder.name)
    (tmp_path / "inbound" / "y+a+t").symlink_to(folder)
    with pytest.raises(exchange._NoTime, match="symbolic link"):
        exchange.walk(str(folder.parent), "y+a+t")
