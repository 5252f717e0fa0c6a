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

The student is whoever the hub says owns the token (``HubAuth.user_for_token``), never
anything in the request, and the token must hold ``access:services!service=course-check``.
Each check is ``selfcheck.check_notebook`` in a process of its own (so a check that
overruns can be stopped without touching the others), in the normal sandbox and its
limits, with the questions drawn from the service account's own secret for that hub
user. One check at a time per user, at most ``slots`` at once. The threat model is in
grader/README.md ("Check my work on a hub").
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
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


class Checks:
    """Who is being checked now, and the checks' processes."""

    def __init__(self, slots: int, seconds: float):
        self.slots = slots
        self.seconds = seconds
        self.running: set[str] = set()

    def claim(self, user: str) -> None:
        """Take a slot for ``user`` (release it with ``release``).

        Raises:
            CheckError: (429) ``user`` has a check running; (503) every slot is taken.
        """
        # No await between the test and the add: the event loop runs one handler at a time.
        if user in self.running:
            raise CheckError(429, "your previous check is still running: wait for it to finish, then run "
                                  "this cell again")
        if len(self.running) >= self.slots:
            raise CheckError(503, f"all {self.slots} checkers are busy: try again in a minute")
        self.running.add(user)

    def release(self, user: str) -> None:
        self.running.discard(user)

    async def check(self, user: str, name: str, notebook: bytes) -> dict:
        """Grade one notebook for hub user ``user``: the answer's JSON.

        Raises:
            CheckError: (503) the checker failed (the service's log says why).
        """
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="course-check-") as tmp:
            path = Path(tmp) / name
            path.write_bytes(notebook)
            result = Path(tmp) / "result.json"
            # the service's own hub token stays here: the check needs none
            env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTERHUB_")}
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "grader.checkservice", "--grade", str(path), "--student", user,
                "--result", str(result), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE, start_new_session=True, env=env,
                cwd=tmp)  # nbgrader returns to its starting folder: one this account may enter
            try:
                _, err = await asyncio.wait_for(proc.communicate(), self.seconds)
            except asyncio.TimeoutError:
                await _stop(proc)
                log.info("check of %s by %s stopped at the time limit (%g s)", shown(name), shown(user),
                         self.seconds)
                return {"assignment": _assignment(path), "score": 0, "max_score": None,
                        "text": f"{name}: not checked: the check took longer than {self.seconds:g} s (does a "
                                "cell run forever, or wait for input?): fix that cell, save, and check again"}
            try:
                answer = json.loads(result.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                lines = [line for line in err.decode("utf-8", "replace").splitlines() if line.strip()]
                # the error's last lines: a traceback's end, not nbgrader's last log line
                errors = [line for line in lines if not line.startswith("[")] or lines
                log.error("check of %s by %s failed (exit %s): %s", shown(name), shown(user), proc.returncode,
                          " | ".join(shown(line) for line in errors[-6:]) if errors else "no output")
                raise CheckError(503, "the checker failed: tell your instructor (the check service's log "
                                      "says why)")
        log.info("checked %s for %s in %.1f s: %s", shown(name), shown(user), time.monotonic() - started,
                 answer.get("score", answer.get("error")))
        if "error" in answer:
            raise CheckError(400, answer["error"])
        return answer


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

    Args:
        checks: the slots and the time limit.
        prefix: the service's URL prefix, ``JUPYTERHUB_SERVICE_PREFIX`` ("/services/course-check/").
        auth: a ``jupyterhub.services.auth.HubAuth`` (default: one configured from the
            environment the hub gives a managed service).
    """
    import tornado.web
    from jupyterhub.services.auth import HubAuth

    auth = auth or HubAuth()

    @tornado.web.stream_request_body
    class CheckHandler(tornado.web.RequestHandler):
        def initialize(self):
            self.chunks: list[bytes] = []
            self.size = 0
            self.user: str | None = None
            self.refused: CheckError | None = None

        def write_error(self, status_code, **kwargs):
            error = kwargs.get("exc_info", (None, None))[1]
            line = str(error) if isinstance(error, CheckError) else "the check service failed: tell your instructor"
            self.finish({"error": line})

        def fail(self, error: CheckError) -> None:
            self.set_status(error.status)
            self.finish({"error": str(error)})

        async def prepare(self):
            # Who asks is settled before the body arrives, and the name comes from the hub
            # alone. A refused request's body is read and dropped, never kept: answering
            # before the proxy has sent it all would make the proxy answer 503 instead.
            self.request.connection.set_max_body_size(_DRAINED_BYTES)
            self.refused = await self.refusal()

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
            self.size += len(chunk)
            if self.refused is None and self.size <= MAX_BODY_BYTES:
                self.chunks.append(chunk)

        async def post(self):
            try:
                if self.refused is not None:
                    raise self.refused
                if self.size > MAX_BODY_BYTES:  # sent without a Content-Length
                    raise CheckError(413, TOO_LARGE)
                name, notebook = parse_request(b"".join(self.chunks))
                self.chunks = []
                checks.claim(self.user)
            except CheckError as error:
                return self.fail(error)
            try:
                answer = await checks.check(self.user, name, notebook)
            except CheckError as error:
                return self.fail(error)
            finally:
                checks.release(self.user)
            self.finish(answer)

    return tornado.web.Application([(prefix.rstrip("/") + "/check", CheckHandler)])


def serve(slots: int | None = None, seconds: float = DEFAULT_SECONDS) -> int:
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
    checks = Checks(slots or os.cpu_count() or 1, seconds)
    app = make_app(checks, os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/course-check/"))
    server = tornado.httpserver.HTTPServer(app, max_body_size=_DRAINED_BYTES)
    server.listen(where.port or 80, where.hostname or "127.0.0.1")
    log.info("checking notebooks at %s (%d at once, %g s each)", url, checks.slots, checks.seconds)
    tornado.ioloop.IOLoop.current().start()
    return 0


def _grade_one(path: Path, student: str, result: Path) -> None:
    """One check, in the process the service starts for it; the answer goes to ``result``."""
    from .selfcheck import CannotCheck, check_notebook

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
    parser.add_argument("--grade", type=Path, required=True)
    parser.add_argument("--student", required=True)
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args()
    _grade_one(args.grade, args.student, args.result)
