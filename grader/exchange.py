"""nbgrader's exchange "collect", trusting nothing that the student's process wrote; and its
"release_feedback", under the names the students submitted.

Plugged in through nbgrader's own extension point, so that ``nbgrader collect`` and
formgrader's Collect button both use it::

    c.ExchangeFactory.collect = "grader.exchange.TrustedCollect"

A submission in the exchange is a folder ``inbound/<user>+<assignment>+<time>+<random>``
made and owned by the student's account, which can write anything in it at any time:
the name, its ``timestamp.txt``, the files' mtimes (``utime``), links and special files.
Stock collect believes the name's user and time and copies with ``shutil.copytree``,
which follows symbolic links (a link to a root-only file, or a classmate's notebook,
is copied as the instructor). ``TrustedCollect`` instead:

1. **Owner.** Collects a folder only when its owner (the uid of the folder it opened,
   never following a link, as a ``pwd`` name) is the user its name claims; otherwise it
   logs one line and leaves it. The folder name's user must also be a valid student id
   (``grader.names.student_id_problem``), so that it cannot name a path. See
   ``TrustedCollect.check_owner`` for accounts that every student shares.
2. **Time.** A submission's time is the latest change time (``st_ctime``, read with
   ``lstat``/``fstat``, never following a link) of its folder and of every entry in it,
   at any depth: a student can set mtimes and write any name or ``timestamp.txt``, but
   the kernel sets ctime to the current time on every write, chmod, link, rename or
   ``utime``, and no call sets it back. Linux's ext4, xfs, btrfs and tmpfs also set the
   ctime of a file or folder that is renamed, so a folder prepared earlier and moved in
   late is late. Per student the submission collected is the one with the latest such
   time (folder-name times play no part); with ``--before-duedate``, the latest whose
   time is not after the student's due date (``SubmittedAssignment.duedate``, with an
   extension, when the gradebook has the submission; the assignment's otherwise), or the
   latest when none is. The walk is bounded: at most ``stage.MAX_ENTRIES`` entries and
   ``MAX_DEPTH`` levels; a submission whose time cannot be read within them is not
   collected (logged), and the student's other submissions compete without it.
3. **Copy.** The chosen folder is read with ``grader.stage.read_files`` and written with
   ``grader.stage.write_files``: the rules of staging (no link followed, no FIFO or device
   opened, hard links to others' files left out, the size and count limits, names valid
   UTF-8 without control characters); every file left out gets a logged note. A
   submission that staging would refuse (its notebook missing, a link, empty or too big)
   is not collected, with its status in the log. The folder is walked again after it is
   read; if anything changed meanwhile, it is read again (up to ``ATTEMPTS`` times).
   ``timestamp.txt`` in ``submitted/<student>/<assignment>/`` is then the trusted time in
   nbgrader's format (``TIMESTAMP_FORMAT``, UTC; ``nbgrader.utils.parse_utc`` reads it);
   the student's ``submission_secret.txt`` is kept as it is (nbgrader 0.9.6's
   release_feedback and fetch_feedback name the feedback file after it) when it is a
   hex token of at most ``MAX_SECRET_BYTES`` bytes, else dropped with a note. The new
   folder replaces an older collected one by rename.
4. **Record.** ``<course root>/submission_times.csv`` (``student_id,assignment_id,
   timestamp``, one row per collected student and assignment, the latest collect wins)
   is rewritten, under a lock, through a temporary file and ``os.replace``, its cells
   made safe by ``grader.names.csv_row``. The grader reads it (``read_submission_times``)
   as its trusted submission times, in the format of ``course-grader grade --timestamps``.
5. ``--update`` as stock: a collected submission is replaced when the trusted time is
   newer than the one recorded in submission_times.csv (a folder collected without a
   recorded time, e.g. by stock collect, is replaced). Collecting again changes nothing.

Feedback: ``ReleaseFeedbackAsSubmitted`` (``c.ExchangeFactory.release_feedback``) releases
each notebook's feedback under the name the student submitted it as, which grading
recorded beside it, so that nbgrader's fetch_feedback finds a renamed notebook's feedback.
"""
from __future__ import annotations

import csv
import fcntl
import fnmatch
import glob
import json
import os
import pwd
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.exchange.default.collect import ExchangeCollect
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback
from nbgrader.utils import check_mode, notebook_hash, parse_utc
from traitlets import Bool

from . import release  # noqa: F401 - a new gradebook's alembic revision, answered in process (see there)
from .names import csv_row, quoted, shown, student_id_problem
from .stage import MAX_ENTRIES, MAX_LISTED, SUBMITTED_NAMES, BadSubmission, read_files, write_files

TIMES_FILE = "submission_times.csv"
COLUMNS = ("student_id", "assignment_id", "timestamp")
TIMESTAMP_FORMAT = "%Y-%m-%d %H:%M:%S.%f %Z"  # nbgrader's Exchange.timestamp_format, always in UTC
SECRET_FILE = "submission_secret.txt"
MAX_SECRET_BYTES = 256
MAX_DEPTH = 64  # folder levels below a submission folder that the time walk enters
ATTEMPTS = 3  # reads of a submission that changes while it is read
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_EPOCH = datetime(1970, 1, 1)


class _NoTime(Exception):
    """A submission folder whose time cannot be read; the message says why."""


@dataclass(frozen=True)
class Seen:
    """An inbound submission folder as one walk found it."""
    identity: tuple[int, int]  # st_dev, st_ino of the folder opened
    owner: int  # its st_uid
    ctime_ns: int  # the latest st_ctime of the folder and of everything in it
    top: tuple[tuple[str, bool], ...]  # its entries: name, is a folder

    @property
    def time(self) -> datetime:
        """The trusted time, naive UTC as nbgrader's gradebook keeps times, to the microsecond."""
        return _EPOCH + timedelta(microseconds=self.ctime_ns // 1000)


def format_time(time: datetime) -> str:
    """A naive UTC time in nbgrader's timestamp format ("2026-12-01 23:59:00.000000 UTC")."""
    return time.replace(tzinfo=timezone.utc).strftime(TIMESTAMP_FORMAT)


def walk(parent: str, name: str) -> Seen:
    """Open ``parent/name`` without following a link and find its latest change time.

    Every entry at any depth is looked at with ``lstat`` through its folder's descriptor;
    folders are opened with ``O_NOFOLLOW`` relative to the folder above, one descriptor a
    level, so a link is never followed, whatever it points to.

    Raises:
        _NoTime: not a folder, more than ``MAX_ENTRIES`` entries, deeper than ``MAX_DEPTH``,
            or a folder in it that cannot be opened.
    """
    top_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=top_fd)
        except OSError as error:
            try:
                mode = os.stat(name, dir_fd=top_fd, follow_symlinks=False).st_mode
            except OSError:
                mode = stat.S_IFDIR
            if stat.S_ISLNK(mode):
                raise _NoTime("it is a symbolic link, which collect does not follow") from None
            if not stat.S_ISDIR(mode):
                raise _NoTime("it is not a folder") from None
            raise _NoTime(f"it cannot be opened ({error.strerror})") from None
    finally:
        os.close(top_fd)
    try:
        st = os.fstat(fd)
        count = [0]
        latest, top = _scan(fd, 0, count)
        return Seen((st.st_dev, st.st_ino), st.st_uid, max(st.st_ctime_ns, latest), tuple(top))
    finally:
        os.close(fd)


def _scan(fd: int, depth: int, count: list[int]) -> tuple[int, list[tuple[str, bool]]]:
    """The latest ctime below the open folder ``fd`` (not its own), and its entries."""
    latest, here = 0, []
    with os.scandir(fd) as listing:
        for entry in listing:
            count[0] += 1
            if count[0] > MAX_ENTRIES:
                raise _NoTime(f"it holds more than {MAX_ENTRIES} entries, so its time cannot be read")
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:  # removed since it was listed: its folder's ctime says when
                continue
            latest = max(latest, st.st_ctime_ns)
            here.append((entry.name, stat.S_ISDIR(st.st_mode)))
    for name, is_dir in here:
        if not is_dir:
            continue
        if depth >= MAX_DEPTH:
            raise _NoTime(f"its folders are nested more than {MAX_DEPTH} deep, so its time cannot be read")
        try:
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            continue
        except OSError as error:
            raise _NoTime(f"its folder {quoted(name)} cannot be opened ({error.strerror}), so its time "
                          "cannot be read") from None
        try:
            latest = max(latest, os.fstat(child).st_ctime_ns, _scan(child, depth + 1, count)[0])
        finally:
            os.close(child)
    return latest, here


def read_submission_times(course_root) -> dict[tuple[str, str], str]:
    """The trusted submission times collect recorded: (student_id, assignment_id) -> timestamp.

    Read from ``<course_root>/submission_times.csv``; empty when there is none.
    """
    try:
        with open(Path(course_root) / TIMES_FILE, newline="", encoding="utf-8") as f:
            return {(r["student_id"], r["assignment_id"]): r["timestamp"] for r in csv.DictReader(f)}
    except FileNotFoundError:
        return {}


def record_submission_time(course_root, student_id: str, assignment_id: str, timestamp: str) -> None:
    """Set one row of ``<course_root>/submission_times.csv``, atomically and under a lock.

    The lock (``flock`` on the course root folder) keeps two collects (the command line
    and formgrader) from losing each other's rows; the file is replaced whole.
    """
    root = Path(course_root)
    lock = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        times = read_submission_times(root)
        times[(student_id, assignment_id)] = timestamp
        path = root / TIMES_FILE
        mode = stat.S_IMODE(os.stat(path).st_mode) if path.exists() else 0o644
        fd, temp = tempfile.mkstemp(dir=root, prefix=f".{TIMES_FILE}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", newline="", encoding="utf-8") as f:
                writer = csv.writer(f)
                writer.writerow(COLUMNS)
                for (student, assignment), time in sorted(times.items()):
                    writer.writerow(csv_row([student, assignment, time]))
                f.flush()
                os.fchmod(f.fileno(), mode)
                os.fsync(f.fileno())
            os.replace(temp, path)
        except BaseException:
            if os.path.exists(temp):
                os.unlink(temp)
            raise
    finally:
        os.close(lock)


def _parsed(timestamp: str | None) -> datetime | None:
    """A recorded timestamp as a naive UTC time; None when there is none or it is unreadable."""
    try:
        return parse_utc(timestamp) if timestamp else None
    except (ValueError, OverflowError):
        return None


def _owner_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _listed(names: list[str]) -> str:
    text = ", ".join(quoted(n) for n in names[:MAX_LISTED])
    return text + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


@dataclass
class _Candidate:
    name: str  # of the folder in inbound
    seen: Seen


class TrustedCollect(ExchangeCollect):
    """``nbgrader collect`` that trusts only what the kernel says: owners and ctimes (see the module)."""

    check_owner = Bool(
        None, allow_none=True,
        help="""Collect a submission folder only when its owner is the user its name claims.
        True: always check. False: never (every submission is taken as the user it names,
        which must still be a valid student id). None (the default): check, except when
        every submission of the assignment in the inbound folder belongs to the account
        that collects (by uid): then the students share that account (a single-user laptop,
        tests with separate HOMEs as one uid), no owner could be right, and the check is off
        (logged). No student can make a folder owned by another account, so with separate
        student accounts the check is on. Students who share one account other than the
        instructor's (e.g. containers that all run as one uid) cannot be told apart by the
        file system at all: set False there, knowingly."""
    ).tag(config=True)

    def init_src(self):
        if self.coursedir.course_id == "":
            self.fail("No course id specified. Re-run with --course flag.")
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, "inbound")
        if not os.path.isdir(self.inbound_path):
            self.fail("Course not found: {}".format(self.inbound_path))
        if not check_mode(self.inbound_path, read=True, execute=True):
            self.fail("You don't have read permissions for the directory: {}".format(self.inbound_path))
        assignment_id = self.coursedir.assignment_id
        pattern = self.coursedir.student_id or "*"
        listed = []  # (claimed student, folder name, owner uid of the entry)
        with os.scandir(self.inbound_path) as entries:
            for entry in entries:
                parts = entry.name.split("+")
                if len(parts) < 3 or parts[1] != assignment_id or not fnmatch.fnmatchcase(parts[0], pattern):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                listed.append((parts[0], entry.name, st.st_uid))
        self._check = self.check_owner
        if self._check is None:
            self._check = any(uid != os.geteuid() for _, _, uid in listed)
            if listed and not self._check:
                self.log.info("Every submission of %s belongs to this account (%s): the students share it, so "
                              "owners are not checked (set TrustedCollect.check_owner = True to check them)",
                              shown(assignment_id), shown(_owner_name(os.geteuid())))
        self.candidates: dict[str, list[str]] = {}
        for student, name, _ in sorted(listed):
            why = student_id_problem(student)
            if why:
                self.log.warning("Not collected: %s: the user it names %s", quoted(name), why)
            else:
                self.candidates.setdefault(student, []).append(name)
        self._gradebook_facts(assignment_id)
        self.src_records = []

    def _gradebook_facts(self, assignment_id: str) -> None:
        """The assignment's notebooks and due date, and each student's due date (extensions)."""
        self.duedate, self.duedates, notebooks = None, {}, []
        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                assignment = gb.find_assignment(assignment_id)
                self.duedate = assignment.duedate
                notebooks = [nb.name for nb in assignment.notebooks]
            except MissingEntry:
                pass
            for student in self.candidates:
                self.duedates[student] = self.duedate
                if self.before_duedate and self.duedate is not None:
                    try:
                        self.duedates[student] = gb.find_submission(assignment_id, student).duedate
                    except MissingEntry:
                        pass
        for step in (self.coursedir.source_directory, self.coursedir.release_directory):
            if not notebooks:
                folder = Path(self.coursedir.format_path(step, ".", assignment_id))
                notebooks = [p.stem for p in folder.glob("*.ipynb")]
        if not notebooks and self.candidates:
            self.fail(f"No notebooks are known for {assignment_id}: it is not in the gradebook, "
                      "the source folder or the release folder")
        self.notebooks = sorted(notebooks)

    def _times(self, student: str) -> list[_Candidate]:
        """The student's submissions whose owner passes and whose time can be read, latest last."""
        found = []
        for name in self.candidates[student]:
            try:
                seen = walk(self.inbound_path, name)
            except _NoTime as why:
                self.log.warning("Not collected: %s: %s", quoted(name), why)
                continue
            owner = _owner_name(seen.owner)
            if self._check and owner != student:
                self.log.warning("Not collected: %s claims to be a submission of %s but belongs to %s",
                                 quoted(name), shown(student), shown(owner))
                continue
            found.append(_Candidate(name, seen))
        return sorted(found, key=lambda c: (c.seen.ctime_ns, c.name))

    def _choose(self, student: str, found: list[_Candidate]) -> _Candidate:
        duedate = self.duedates.get(student)
        if self.before_duedate and duedate is not None:
            on_time = [c for c in found if c.seen.time <= duedate]
            if on_time:
                return on_time[-1]
        return found[-1]

    def copy_files(self):
        assignment_id = self.coursedir.assignment_id
        if not self.candidates:
            self.log.warning("No submissions of '{}' for course '{}' to collect".format(
                assignment_id, self.coursedir.course_id))
            return
        self.log.info("Processing {} submissions of '{}' for course '{}'".format(
            len(self.candidates), assignment_id, self.coursedir.course_id))
        recorded = read_submission_times(self.coursedir.root)
        for student in sorted(self.candidates):
            self._collect(student, recorded.get((student, assignment_id)))

    def _collect(self, student: str, recorded: str | None) -> None:
        """Collect the student's chosen submission, if it is newer than what is collected."""
        assignment_id = self.coursedir.assignment_id
        dest = Path(self.coursedir.format_path(self.coursedir.submitted_directory, student, assignment_id))
        for _ in range(ATTEMPTS):
            found = self._times(student)
            if not found:
                return
            chosen = self._choose(student, found)
            stamp = format_time(chosen.seen.time)
            updating = dest.is_dir()
            if updating and not self._wanted(_parsed(recorded), chosen.seen.time):
                if self.update:
                    self.log.info("No newer submission to collect: {} {}".format(student, assignment_id))
                else:
                    self.log.info("Submission already exists, use --update to update: {} {}{}".format(
                        student, assignment_id, "" if recorded else f" (its time is not in {TIMES_FILE})"))
                return
            files = read_files(Path(self.inbound_path) / chosen.name, self.notebooks)
            try:
                if walk(self.inbound_path, chosen.name) == chosen.seen:
                    break
            except _NoTime:
                pass
        else:
            self.log.warning("Not collected: %s %s: the submission kept changing while it was read",
                             shown(student), shown(assignment_id))
            return
        self.src_records.append({"username": student, "filename": chosen.name, "timestamp": chosen.seen.time})
        dest.parent.mkdir(parents=True, exist_ok=True)
        temp = Path(tempfile.mkdtemp(prefix=f".{assignment_id}.collecting-", dir=dest.parent))
        try:
            try:
                notes = write_files(files, temp, self.notebooks)
            except BadSubmission as error:
                self.log.warning("Not collected: %s %s (submitted %s): %s%s", shown(student), shown(assignment_id),
                                 stamp, error, "; the submission collected before stays" if updating else "")
                return
            notes += self._finish(temp, chosen.seen, stamp)
            self.log.info("{} submission: {} {} (submitted {})".format(
                "Updating" if updating else "Collecting", student, assignment_id, stamp))
            if notes:
                self.log.warning("%s %s: %s", shown(student), shown(assignment_id), "; ".join(notes))
            if updating:
                old = Path(tempfile.mkdtemp(prefix=f".{assignment_id}.replaced-", dir=dest.parent))
                os.rename(dest, old / "old")
                os.rename(temp, dest)
                shutil.rmtree(old)
            else:
                os.rename(temp, dest)
        finally:
            if temp.exists():
                shutil.rmtree(temp)
        record_submission_time(self.coursedir.root, student, assignment_id, stamp)

    def _wanted(self, recorded: datetime | None, new: datetime) -> bool:
        """Whether a collected submission is replaced (stock's rules, on the recorded trusted time)."""
        if self.update and (recorded is None or new > recorded):
            return True
        return bool(self.before_duedate and recorded != new)

    def _finish(self, folder: Path, seen: Seen, stamp: str) -> list[str]:
        """Write the trusted timestamp.txt, check the secret, set modes; return notes."""
        notes = []
        skipped = [name for name, is_dir in seen.top if name != "timestamp.txt" and not (folder / name).exists()
                   and (is_dir or name.startswith(".") or name.endswith(".ipynb"))]
        if skipped:
            notes.append(f"left out folders, hidden files and other notebooks: {_listed(sorted(skipped))}")
        secret = folder / SECRET_FILE
        if secret.exists():
            data = secret.read_bytes()
            if len(data) > MAX_SECRET_BYTES or not re.fullmatch(rb"[0-9a-fA-F]+", data):
                secret.unlink()
                notes.append(f"dropped {SECRET_FILE}: not a hex token of at most {MAX_SECRET_BYTES} bytes "
                             "(nbgrader cannot release this submission's feedback)")
        else:
            notes.append(f"no usable {SECRET_FILE} (nbgrader cannot release this submission's feedback)")
        (folder / "timestamp.txt").write_text(stamp, encoding="utf-8")
        os.chmod(folder, (0o2770 | 0o755) if self.coursedir.groupshared else 0o755)
        if self.coursedir.groupshared:
            for path in folder.iterdir():
                os.chmod(path, stat.S_IMODE(path.stat().st_mode) | 0o660)
        return notes


def submitted_stem(feedback_dir: Path, notebook: str) -> str:
    """The name (without ``.ipynb``) under which the student submitted the notebook whose
    feedback is ``feedback_dir/<notebook>.html``: what grading recorded beside it
    (``grader.stage.SUBMITTED_NAMES``), else ``notebook`` itself (feedback graded before
    names were recorded, or a record that cannot be read)."""
    try:
        names = json.loads((feedback_dir / SUBMITTED_NAMES).read_text(encoding="utf-8"))
        name = names[notebook]
    except (OSError, ValueError, KeyError, TypeError):
        return notebook
    if not isinstance(name, str) or not name.endswith(".ipynb") or "/" in name or name == ".ipynb":
        return notebook
    return name[: -len(".ipynb")]


class ReleaseFeedbackAsSubmitted(ExchangeReleaseFeedback):
    """``nbgrader release_feedback`` (and formgrader's Release Feedback button) that releases
    each notebook's feedback under the name the student submitted it as::

        c.ExchangeFactory.release_feedback = "grader.exchange.ReleaseFeedbackAsSubmitted"

    nbgrader's fetch_feedback, on the student's side, looks for the hash of the submission's
    secret and the name of each notebook in the student's own copy of the submission; a
    notebook the student renamed ("my masking (final).ipynb") is graded as the released one
    (``grader.stage``), so stock release_feedback, which hashes the graded name, releases a
    file the student's fetch never finds. Everything else is stock: the same files, the
    same secret and timestamp, the same log lines."""

    def copy_files(self):
        exclude = set(self.coursedir.student_id_exclude.split(",")) if self.coursedir.student_id_exclude else set()
        pattern = re.compile(re.escape(os.path.sep).join([
            self.coursedir.format_path(self.coursedir.feedback_directory, "(?P<student_id>.*)",
                                       self.coursedir.assignment_id, escape=True),
            r"(?P<notebook_id>.*)\.html"]))
        for html_file in sorted(glob.glob(os.path.join(self.src_path, "*.html"))):
            match = pattern.fullmatch(html_file)
            if match is None:
                self.log.error("Could not match '%s' with regexp '%s'", html_file, pattern.pattern)
                continue
            student_id, notebook_id = match["student_id"], match["notebook_id"]
            if student_id in exclude:
                self.log.debug("Skipping student '%s'", student_id)
                continue
            feedback_dir = Path(html_file).parent
            timestamp = (feedback_dir / "timestamp.txt").read_text()
            secret = (feedback_dir / SECRET_FILE).read_text()
            submitted = submitted_stem(feedback_dir, notebook_id)
            checksum = notebook_hash(secret=secret, notebook_id=submitted)
            self.log.info("Releasing feedback for student '%s' on assignment '%s/%s/%s' (%s)%s", student_id,
                          self.coursedir.course_id, self.coursedir.assignment_id, notebook_id, timestamp,
                          "" if submitted == notebook_id else f", submitted as {quoted(submitted + '.ipynb')}")
            temp = os.path.join(self.dest_path, f"{checksum}-tmp.html")
            shutil.copy(html_file, temp)
            shutil.move(temp, os.path.join(self.dest_path, f"{checksum}.html"))  # replaced whole: fetch sees one
            self.log.info("Feedback released to: %s", os.path.join(self.dest_path, f"{checksum}.html"))
