"""The check service: check my work on a hub, without showing students the references.

``course-grader serve-checks`` runs as a JupyterHub managed service (``course-check``)
under the instructor's (grader's) Unix account, which alone can read solutions/ and
grader/checks. A student's notebook cell (``coursekit.check``) POSTs the saved notebook
to ``{JUPYTERHUB_SERVICE_PREFIX}check`` with its server's JupyterHub token::

    POST /services/course-check/check
    Authorization: token $JUPYTERHUB_API_TOKEN
    {"name": "01_similarity.ipynb", "notebook": {...the notebook's JSON...}}

    200 {"assignment": "01_similarity", "score": 7.5, "max_score": 10, "text": "..."}
    400/401/403/413/429/503 {"error": "one line"}

With ``Accept: application/x-ndjson`` (the cell sends it), a request that has to wait for
a free checker gets 200 at once and JSON lines: its place in line, then the answer::

    {"queue": {"position": 2, "seconds": 40}}
    {"queue": {"position": 1, "seconds": 20}}
    {"assignment": "01_similarity", "score": 7.5, "max_score": 10, "text": "..."}

The student is whoever the hub says owns the token (``HubAuth.user_for_token``), never
anything in the request, and the token must hold ``access:services!service=course-check``.
The body is streamed into a private temporary folder (never held by the service) and
parsed by the check's own process. Each check is ``selfcheck.check_notebook`` in a process
of its own (so a check that overruns can be stopped without touching the others), in the
normal sandbox and its limits, with the questions drawn from the service account's own
secret for that hub user. A user has one request open at a time; at most ``slots`` checks
run at once, the others wait in line in arrival order; ``daily`` caps a user's checks per
day. The threat model is in grader/README.md ("Check my work on a hub").
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import os
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter, deque
from datetime import date
from pathlib import Path
from urllib.parse import urlparse

from .names import name_problem, shown
from .stage import MAX_NOTEBOOK_BYTES

log = logging.getLogger("course-check")
# The notebook travels inside a JSON object with its name; what is more than that is refused unread.
MAX_BODY_BYTES = MAX_NOTEBOOK_BYTES + 64 * 1024
# A refused body is read and dropped up to this size; a larger one closes the connection.
_DRAINED_BYTES = 2 * MAX_BODY_BYTES
TOO_LARGE = (f"the notebook is larger than {MAX_NOTEBOOK_BYTES // 2**20} MB: clear large outputs (Edit > Clear "
             "Outputs of All Cells), save, and check again")
DEFAULT_SECONDS = 180  # kernel start-up, the notebook's 60 s budget and the feedback, with room
_GRACE = 5  # seconds a stopped check gets to shut its kernel down before it is killed
NO_ROOM = "the check service has no room for your notebook just now: try again in a minute, or tell your instructor"
TYPICAL_SECONDS = 20  # a check's time until the service has timed its own
_REMIND = 15  # seconds between two "you are Nth in line" lines to a waiting student
PROGRESS = "application/x-ndjson"  # a client that accepts it is told its place in line (see make_app)


class CheckError(Exception):
    """A request that is not checked: the HTTP status and the one line the student reads."""

    def __init__(self, status: int, line: str):
        super().__init__(line)
        self.status = status


def _name(value) -> str:
    """The notebook's file name as the student's request gave it.

    Raises:
        CheckError: (400) it is no plain ``.ipynb`` file name.
    """
    if not isinstance(value, str) or not value.endswith(".ipynb") or "/" in value or "\\" in value \
            or value.startswith(".") or len(value.encode("utf-8", "replace")) > 255 or name_problem(value):
        raise CheckError(400, 'the notebook\'s "name" must be a file name ending in .ipynb')
    return value


def parse_request(body: bytes) -> tuple[str, bytes]:
    """The notebook's name and its bytes, from a request body.

    Raises:
        CheckError: (413) the body or the notebook is larger than grading accepts;
            (400) the body is not JSON ``{"name": "<file>.ipynb", "notebook": {...}}``.
    """
    if len(body) > MAX_BODY_BYTES:
        raise CheckError(413, TOO_LARGE)
    try:
        request = json.loads(body)
    except (UnicodeDecodeError, ValueError):
        raise CheckError(400, "the request is not JSON: run the notebook's check cell to check your work")
    if not isinstance(request, dict) or not isinstance(request.get("notebook"), dict):
        raise CheckError(400, 'the request must be {"name": "<file>.ipynb", "notebook": {...}}')
    name = _name(request.get("name"))
    notebook = json.dumps(request["notebook"], ensure_ascii=False).encode("utf-8")
    if len(notebook) > MAX_NOTEBOOK_BYTES:
        raise CheckError(413, TOO_LARGE)
    return name, notebook


class Ticket:
    """One accepted request: whose it is, the private folder its body is streamed into, and
    where it stands (``new`` while its body arrives, ``waiting``, ``running``, ``done``).

    Raises:
        OSError: no folder can be made in the temporary folder (``TMPDIR``).
    """

    def __init__(self, user: str):
        self.user = user
        self.folder = Path(tempfile.mkdtemp(prefix="course-check-"))  # 0700: the service account's alone
        self.request = self.folder / "request.json"
        self.body = open(self.request, "wb", buffering=0)  # each chunk straight to the file
        self.state = "new"
        self.gone = False  # the student's connection closed: nobody reads the answer
        self.moved = asyncio.Event()  # set when the queue ahead of it changes
        self.proc: asyncio.subprocess.Process | None = None

    def remove(self) -> None:
        self.body.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class Gone(Exception):
    """The student's connection closed before their check ended."""


class Checks:
    """Who has a request open, the queue, the running checks and each user's checks today.

    Fair by construction: a user has at most one request open (uploading, waiting or
    running; another is refused with 429 before its body is kept), and the waiting ones
    start in the order they arrived, so one user's flood delays anyone else by at most
    that user's one check.
    """

    def __init__(self, slots: int, seconds: float, daily: int = 0, command: list[str] | None = None):
        self.slots = slots
        self.seconds = seconds
        self.daily = daily  # checks a user may start per day (the service's local date); 0: no limit
        # what runs one check; tests put a stub in its place
        self.command = command or [sys.executable, "-m", "grader.checkservice"]
        self.open: dict[str, Ticket] = {}
        self.waiting: deque[Ticket] = deque()
        self.running: set[Ticket] = set()
        self.typical = TYPICAL_SECONDS  # how long a check takes, learnt from the finished ones
        self.day = date.today()
        self.today: Counter[str] = Counter()

    def admit(self, user: str) -> Ticket:
        """Open a request for ``user`` (end it with ``leave``).

        Raises:
            CheckError: (429) ``user`` has a request open, or has used today's checks;
                (503) the service's temporary folder takes no more files.
        """
        # No await between the test and the add: the event loop runs one handler at a time.
        if user in self.open:
            raise CheckError(429, "your previous check is still running or waiting: wait for it to finish, "
                                  "then run this cell again")
        if self.daily and self._checks_today(user) >= self.daily:
            raise CheckError(429, f"you have checked your work {self.daily} times today, the most this course "
                                  "allows a day: check again tomorrow")
        try:
            ticket = self.open[user] = Ticket(user)
        except OSError as error:
            log.error("no room for a request in %s: %s", tempfile.gettempdir(), error)
            raise CheckError(503, NO_ROOM)
        return ticket

    def _checks_today(self, user: str) -> int:
        if date.today() != self.day:
            self.day, self.today = date.today(), Counter()
        return self.today[user]

    def leave(self, ticket: Ticket | None) -> None:
        """End ``ticket``'s request: out of the queue, its check stopped if it runs, its
        folder removed once nothing uses it. Safe to call more than once."""
        if ticket is None:
            return
        ticket.gone = True
        if self.open.get(ticket.user) is ticket:
            del self.open[ticket.user]
        if ticket.state == "waiting":
            self.waiting.remove(ticket)
            ticket.state = "done"
            ticket.moved.set()
            self._advance()
        if ticket.state == "running":
            if ticket.proc is not None and ticket.proc.returncode is None:
                asyncio.ensure_future(_stop(ticket.proc))
            return  # ``check`` removes the folder when the check has ended
        ticket.remove()

    def wait_for(self, position: int) -> float:
        """About how many seconds the ``position``-th in line (1: next) waits for a slot."""
        return math.ceil(position / self.slots) * self.typical

    def _advance(self) -> None:
        """Start waiting checks while there are free slots, and tell those still waiting."""
        while self.waiting and len(self.running) < self.slots:
            ticket = self.waiting.popleft()
            ticket.state = "running"
            self.running.add(ticket)
            ticket.moved.set()
        for ticket in self.waiting:
            ticket.moved.set()

    async def _turn(self, ticket: Ticket, progress) -> None:
        """Wait in line until ``ticket`` holds a slot; ``progress(position, seconds)`` is
        awaited whenever its place changes (and every ``_REMIND`` s, which also keeps the
        connection busy).

        Raises:
            Gone: the request ended while it waited.
        """
        ticket.state = "waiting"
        self.waiting.append(ticket)
        self._advance()
        while True:
            ticket.moved.clear()  # before looking: a move while ``progress`` writes is not lost
            if ticket.state != "waiting":
                break
            if progress is not None:
                position = self.waiting.index(ticket) + 1
                await progress(position, self.wait_for(position))
            try:
                await asyncio.wait_for(ticket.moved.wait(), _REMIND)
            except asyncio.TimeoutError:
                pass
        if ticket.gone:
            raise Gone

    async def check(self, ticket: Ticket, progress=None) -> dict:
        """Queue, then grade, the notebook streamed into ``ticket``'s folder: the answer's JSON.

        Args:
            progress: an ``async (position, seconds)`` told the place in line while it waits.

        Raises:
            CheckError: (400) the request or notebook is not one that can be checked;
                (503) the checker failed (the service's log says why).
            Gone: the request ended first.
        """
        ticket.body.close()
        try:
            if ticket.gone:
                raise Gone
            await self._turn(ticket, progress)
            self._checks_today(ticket.user)
            self.today[ticket.user] += 1
            return await self._run(ticket)
        finally:  # however it ended (a connection may close at any await), its place and slot go
            if ticket in self.waiting:
                self.waiting.remove(ticket)
            self.running.discard(ticket)
            ticket.state = "done"
            self._advance()
            if ticket.gone:
                ticket.remove()

    async def _run(self, ticket: Ticket) -> dict:
        started = time.monotonic()
        folder, user = ticket.folder, ticket.user
        log.info("started a check for %s (%d running, %d waiting)", shown(user), len(self.running),
                 len(self.waiting))
        result = folder / "result.json"
        # the service's own hub token stays here: the check needs none
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
        proc = ticket.proc = await asyncio.create_subprocess_exec(
            *self.command, "--request", str(ticket.request), "--student", user, "--result", str(result),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, env=env,
            cwd=folder)  # nbgrader returns to its starting folder: one this account may enter
        try:
            if ticket.gone:  # the connection closed while the process started: ``leave`` saw none
                raise Gone
            _, err = await asyncio.wait_for(proc.communicate(), self.seconds)
        except asyncio.TimeoutError:
            await _stop(proc)
            name, assignment = _started(folder)
            log.info("check of %s by %s stopped at the time limit (%g s)", shown(name), shown(user), self.seconds)
            return {"assignment": assignment, "score": 0, "max_score": None,
                    "text": f"{name}: not checked: the check took longer than {self.seconds:g} s (does a "
                            "cell run forever, or wait for input?): fix that cell, save, and check again"}
        except Gone:
            await _stop(proc)
            raise
        if ticket.gone:  # stopped by ``leave``
            raise Gone
        try:
            answer = json.loads(result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            lines = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
            # the error's last lines: a traceback's end, not nbgrader's last log line
            errors = [line for line in lines if not line.startswith("[")] or lines
            log.error("check of %s by %s failed (exit %s): %s", shown(_started(folder)[0]), shown(user),
                      proc.returncode, " | ".join(shown(line) for line in errors[-6:]) if errors else "no output")
            raise CheckError(503, "the checker failed: tell your instructor (the check service's log says why)")
        took = time.monotonic() - started
        if "error" in answer:
            log.info("refused a check by %s: %s", shown(user), answer["error"])
            raise CheckError(answer.get("status", 400), answer["error"])
        self.typical += (took - self.typical) / 4  # a running mean that follows the day's load
        log.info("checked %s for %s in %.1f s: %s", shown(_started(folder)[0]), shown(user), took,
                 answer.get("score"))
        return answer


def _started(folder: Path) -> tuple[str, str | None]:
    """The notebook's name and assignment, as the check's process noted them before grading."""
    try:
        with open(folder / "started.json", encoding="utf-8") as file:
            noted = json.loads(file.read(64 * 1024))
        return str(noted["name"]), noted.get("assignment")
    except (OSError, ValueError, KeyError, TypeError):
        return "the notebook", None


async def _stop(proc) -> None:
    """Stop a check: an interrupt first, so that it shuts its kernel and cgroup down, then
    its whole process group. The sandbox's bubblewrap dies with its parent (--die-with-parent)."""
    try:
        proc.send_signal(signal.SIGINT)
        await asyncio.wait_for(proc.wait(), _GRACE)
    except (asyncio.TimeoutError, ProcessLookupError):
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    await proc.wait()


def _assignment(path: Path) -> str | None:
    from .selfcheck import CannotCheck, assignment_of

    try:
        return assignment_of(path)
    except CannotCheck:
        return None


def make_app(checks: Checks, prefix: str, auth=None):
    """The tornado application: ``POST {prefix}check``.

    A request that waits for a slot and sends ``Accept: application/x-ndjson`` gets 200 at
    once and JSON lines: ``{"queue": {"position": 3, "seconds": 40}}`` whenever its place
    changes (and every 15 s), then the answer (or ``{"error": ...}``) as the last line. Any
    other request waits silently and gets the answer with its status code.

    Args:
        checks: the slots, the queue and the limits.
        prefix: the service's URL prefix, ``JUPYTERHUB_SERVICE_PREFIX`` ("/services/course-check/").
        auth: a ``jupyterhub.services.auth.HubAuth`` (default: one configured from the
            environment the hub gives a managed service).
    """
    import tornado.iostream
    import tornado.web
    from jupyterhub.services.auth import HubAuth

    auth = auth or HubAuth()

    @tornado.web.stream_request_body
    class CheckHandler(tornado.web.RequestHandler):
        def initialize(self):
            self.size = 0
            self.ticket: Ticket | None = None
            self.refused: CheckError | None = None
            self.streaming = False  # the 200 and the first line are sent: what follows is lines

        def write_error(self, status_code, **kwargs):
            error = kwargs.get("exc_info", (None, None))[1]
            line = str(error) if isinstance(error, CheckError) else "the check service failed: tell your instructor"
            self.finish({"error": line})

        def answer(self, answer: dict, status: int = 200) -> None:
            if self.streaming:
                self.finish(json.dumps(answer) + "\n")
            else:
                self.set_status(status)
                self.finish(answer)

        async def progress(self, position: int, seconds: float) -> None:
            """One line to a client that accepts PROGRESS: its place in line and the expected wait."""
            if PROGRESS not in self.request.headers.get("Accept", ""):
                return
            if not self.streaming:
                self.set_header("Content-Type", PROGRESS)
                self.streaming = True
            self.write(json.dumps({"queue": {"position": position, "seconds": round(seconds)}}) + "\n")
            try:
                await self.flush()
            except tornado.iostream.StreamClosedError:
                checks.leave(self.ticket)

        async def prepare(self):
            # Who asks is settled before the body arrives, and the name comes from the hub
            # alone. A refused request's body is read and dropped, never kept: answering
            # before the proxy has sent it all would make the proxy answer 503 instead.
            self.request.connection.set_max_body_size(_DRAINED_BYTES)
            self.refused = await self.refusal()
            if self.refused is None:
                try:
                    self.ticket = checks.admit(self.user)
                except CheckError as error:
                    self.refused = error

        async def refusal(self) -> CheckError | None:
            token = auth.get_token(self, in_cookie=False)
            if not token:
                return CheckError(401, "no JupyterHub token was sent: run this cell in your hub server's "
                                       "notebook (JUPYTERHUB_API_TOKEN is not set)")
            try:
                user = await auth.user_for_token(token, sync=False)
            except tornado.web.HTTPError as error:
                log.error("the hub did not answer who owns a token: %s", error)
                return CheckError(503, "the hub cannot be asked who you are just now: try again in a minute")
            if not user or not user.get("name"):
                return CheckError(401, "the hub does not know this token: restart your server (File > Hub "
                                       "Control Panel > Stop My Server, then Start)")
            if user.get("kind", "user") != "user" or not auth.check_scopes(auth.access_scopes, user):
                log.info("refused %s: the token lacks %s", shown(user.get("name")), sorted(auth.access_scopes))
                return CheckError(403, "your server's token may not use the check service: ask your "
                                       "instructor (the hub must grant access:services!service=course-check)")
            length = self.request.headers.get("Content-Length")
            if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
                return CheckError(413, TOO_LARGE)
            self.user = user["name"]
            return None

        def data_received(self, chunk: bytes) -> None:
            # The body goes to the request's own file as it comes: the service holds one chunk
            # of it at a time, whatever the number of uploads.
            self.size += len(chunk)
            if self.refused is not None:
                return
            if self.size > MAX_BODY_BYTES:  # sent without a Content-Length: refused as soon as it is over
                self.refused = CheckError(413, TOO_LARGE)
                checks.leave(self.ticket)
                return
            try:
                self.ticket.body.write(chunk)
            except OSError as error:  # the disk is full: this request is refused, the others go on
                log.error("no room for %s's request in %s: %s", shown(self.user), tempfile.gettempdir(), error)
                self.refused = CheckError(503, NO_ROOM)
                checks.leave(self.ticket)

        def on_connection_close(self):
            super().on_connection_close()
            checks.leave(self.ticket)  # out of the queue, or its check stopped: nobody would read it

        async def post(self):
            try:
                if self.refused is not None:
                    raise self.refused
                answer = await checks.check(self.ticket, self.progress)
            except CheckError as error:
                return self.answer({"error": str(error)}, error.status)
            except Gone:
                return None
            finally:
                checks.leave(self.ticket)
            self.answer(answer)

    return tornado.web.Application([(prefix.rstrip("/") + "/check", CheckHandler)])


def serve(slots: int | None = None, seconds: float = DEFAULT_SECONDS, daily: int = 0) -> int:
    """Run the service until it is stopped, where the hub's environment says
    (``JUPYTERHUB_SERVICE_URL``, ``JUPYTERHUB_SERVICE_PREFIX``); returns the exit code.

    Raises:
        SystemExit: with a one-line message: not started by a hub (no
            ``JUPYTERHUB_SERVICE_URL`` or ``JUPYTERHUB_API_TOKEN``), or no bubblewrap here.
    """
    import tornado.httpserver
    import tornado.ioloop

    from . import sandbox

    logging.basicConfig(level=logging.INFO, format="[course-check %(asctime)s] %(message)s")
    url = os.environ.get("JUPYTERHUB_SERVICE_URL")
    if not url or not os.environ.get("JUPYTERHUB_API_TOKEN"):
        sys.exit("course-grader serve-checks: run it as a JupyterHub managed service (the hub sets "
                 "JUPYTERHUB_SERVICE_URL and JUPYTERHUB_API_TOKEN): see grader/README.md")
    if sandbox.bwrap() is None:
        sys.exit("course-grader serve-checks: students' code must run in the sandbox: install bubblewrap "
                 "(apt-get install bubblewrap)")
    where = urlparse(url)
    checks = Checks(slots or os.cpu_count() or 1, seconds, daily)
    app = make_app(checks, os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/course-check/"))
    server = tornado.httpserver.HTTPServer(app, max_body_size=_DRAINED_BYTES)
    server.listen(where.port or 80, where.hostname or "127.0.0.1")
    log.info("checking notebooks at %s (%d at once, %g s each, %s a day per student)", url, checks.slots,
             checks.seconds, daily or "no limit")
    tornado.ioloop.IOLoop.current().start()
    return 0


def _grade_one(request: Path, student: str, result: Path) -> None:
    """One check, in the process the service starts for it: the request's JSON is parsed
    here, not in the service, so that its memory goes when the check ends. The answer (or
    ``{"error", "status"}``) goes to ``result``."""
    from .selfcheck import CannotCheck, check_notebook

    try:
        name, notebook = parse_request(request.read_bytes())
    except CheckError as error:
        result.write_text(json.dumps({"error": str(error), "status": error.status}), encoding="utf-8")
        return
    request.unlink()
    path = request.parent / name
    path.write_bytes(notebook)
    del notebook
    (request.parent / "started.json").write_text(json.dumps({"name": name, "assignment": _assignment(path)}),
                                                 encoding="utf-8")
    try:
        checked = check_notebook(path, student)
    except CannotCheck as error:
        answer = {"error": shown(str(error).replace(str(path), path.name))}  # not the service's temp folder
    else:
        answer = {"assignment": checked.assignment_id, "score": checked.score, "max_score": checked.max_score,
                  "text": "\n".join(shown(line) for line in checked.text(path).splitlines())}
    result.write_text(json.dumps(answer), encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="one check, for the check service")
    parser.add_argument("--request", type=Path, required=True)
    parser.add_argument("--student", required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args()
    _grade_one(args.request, args.student, args.result)
