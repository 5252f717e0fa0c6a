"""The check service with the hub and the grading stubbed, for tests/test_checkservice.py's
queue, memory and quota tests: everything of ``grader.checkservice`` runs but who asks
(the token is the user's name) and the check (which waits for the test's word).

    python -m tests.stub_checkservice serve PORT FOLDER SLOTS DAILY
        the service on 127.0.0.1:PORT at /services/course-check/check
    python -m tests.stub_checkservice check FOLDER --request R --student S --result X
        one check, as the service starts it: appends S to FOLDER/started, then waits for
        FOLDER/go/<its line number in started> before answering
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path

PREFIX = "/services/course-check/"


class StubAuth:
    """HubAuth's part the service uses: a token names its user, who holds the scope."""

    access_scopes = {"access:services!service=course-check"}

    def get_token(self, handler, in_cookie=False):
        kind, _, token = handler.request.headers.get("Authorization", "").partition(" ")
        return token if kind == "token" and token else None

    async def user_for_token(self, token, sync=False):
        return {"name": token, "kind": "user"}

    def check_scopes(self, scopes, user):
        return True


def serve(port: int, folder: Path, slots: int, daily: int) -> None:
    import tornado.httpserver
    import tornado.ioloop

    from grader.checkservice import _DRAINED_BYTES, Checks, make_app

    command = [sys.executable, "-m", "tests.stub_checkservice", "check", str(folder)]
    app = make_app(Checks(slots, 600, daily, command=command), PREFIX, auth=StubAuth())
    tornado.httpserver.HTTPServer(app, max_body_size=_DRAINED_BYTES).listen(port, "127.0.0.1")
    tornado.ioloop.IOLoop.current().start()


def check(folder: Path, student: str, result: Path) -> None:
    with open(folder / "started", "a+", encoding="utf-8") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(student + "\n")
        log.seek(0)
        number = len(log.read().splitlines())
    parent = os.getppid()
    while not (folder / "go" / str(number)).exists():  # the test's word, however long it takes
        if os.getppid() != parent:  # the service is gone (the test ended): so is this check
            sys.exit(1)
        time.sleep(0.02)
    result.write_text(json.dumps({"assignment": "stub", "score": 1, "max_score": 1,
                                  "text": f"checked for {student}"}), encoding="utf-8")


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
    else:
        args = dict(zip(sys.argv[3::2], sys.argv[4::2]))
        check(Path(sys.argv[2]), args["--student"], Path(args["--result"]))
