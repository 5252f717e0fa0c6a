"""The check service (``grader.checkservice``) behind a real JupyterHub.

The venv's ``jupyterhub`` runs on loopback ports with a configuration of the test's:
the dummy authenticator, the course-check service managed by the hub (started by it,
as ``course-grader serve-checks``), and the roles and server token scopes that
grader/README.md tells an instructor to set. Users are made through the hub's REST
API with an admin service's token, and each user's token through
``POST /hub/api/users/{name}/tokens`` with the scopes a single-user server's token
gets. Requests go through the hub's proxy (configurable-http-proxy, ``make hub-deps``)
exactly as a student's kernel sends them. Three notebooks are really graded.
"""
from __future__ import annotations

import http.client
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import psutil
import pytest
import requests

from coursekit.check import _check_on_service
from grader import course
from grader.checkservice import MAX_BODY_BYTES
from hub.launch import free_port, stop_hub
from tests.conftest import expected_grades

pytestmark = pytest.mark.hub

A = "01_similarity"
CHP = course.ROOT / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
JUPYTERHUB = Path(sys.prefix) / "bin" / "jupyterhub"
SERVICE = "course-check"
SERVER_SCOPES = ["users:activity!user", "access:servers!server", f"access:services!service={SERVICE}"]
SECONDS = 45  # the service's limit per check: below nbgrader's 45 s a cell once the kernel has started


def _wait_for(what: str, ready, proc: subprocess.Popen, log: Path, seconds: float = 90) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"jupyterhub exited ({proc.returncode}) before {what}:\n{log.read_text()}"
        try:
            if ready():
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no {what} after {seconds} s:\n{log.read_text()}")


class Hub:
    def __init__(self, url: str, admin: str):
        self.url = url
        self.admin = admin
        self.check_url = f"{url}/services/{SERVICE}/check"

    def api(self, method: str, path: str, **kwargs) -> requests.Response:
        response = requests.request(method, f"{self.url}/hub/api/{path}",
                                    headers={"Authorization": f"token {self.admin}"}, timeout=30, **kwargs)
        assert response.ok, (method, path, response.status_code, response.text)
        return response

    def token(self, user: str, scopes: list[str]) -> str:
        """A token of ``user``'s with ``scopes`` ("!user"/"!server" filters resolved as the hub
        resolves them for a server's token)."""
        resolved = [s.replace("!user", f"!user={user}").replace("!server", f"!server={user}/") for s in scopes]
        return self.api("POST", f"users/{user}/tokens", json={"scopes": resolved, "note": "test"}).json()["token"]

    def check(self, token: str | None, body: bytes, lines: bool = False) -> requests.Response:
        """POST a check; ``lines``: as the student's cell does, asking for its place in line."""
        headers = {"Content-Type": "application/json"} | ({"Authorization": f"token {token}"} if token else {}) \
            | ({"Accept": "application/x-ndjson"} if lines else {})
        return requests.post(self.check_url, data=body, headers=headers, timeout=300)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    if not CHP.exists():
        pytest.fail(f"configurable-http-proxy is missing ({CHP}): run `make hub-deps`")
    if not JUPYTERHUB.exists():
        pytest.fail("jupyterhub is missing from the venv: run `make test` (the instructor extra of pyproject.toml; constraints.txt pins it)")
    folder = tmp_path_factory.mktemp("hub")
    admin = secrets.token_hex(16)
    port, hub_port, proxy_port, service_port = (free_port() for _ in range(4))
    service = {"name": SERVICE, "url": f"http://127.0.0.1:{service_port}",
               "command": [sys.executable, "-m", "grader.cli", "serve-checks", "--slots", "2",
                           "--seconds", str(SECONDS)],
               "environment": {"PYTHONPATH": str(course.ROOT), "JUPYTER_DATA_DIR": str(folder / "service-data")}}
    (folder / "jupyterhub_config.py").write_text(f"""\
c = get_config()
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_port}"
c.ConfigurableHTTPProxy.command = [{str(CHP)!r}]
c.JupyterHub.db_url = "sqlite:///{folder / 'hub.sqlite'}"
c.JupyterHub.cookie_secret_file = {str(folder / 'cookie_secret')!r}
c.JupyterHub.pid_file = {str(folder / 'hub.pid')!r}
c.ConfigurableHTTPProxy.pid_file = {str(folder / 'proxy.pid')!r}
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allow_all = True
c.JupyterHub.services = [{service!r}, {{"name": "test-admin", "api_token": {admin!r}}}]
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "access:services!service={SERVICE}"]}},
    {{"name": "test-admin", "services": ["test-admin"], "scopes": ["admin:users", "tokens"]}},
]
c.Spawner.server_token_scopes = {SERVER_SCOPES!r}
""")
    log = folder / "hub.log"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(folder),
           "PYTHONPATH": str(course.ROOT)}
    with open(log, "w") as out:
        proc = subprocess.Popen([str(JUPYTERHUB), "-f", str(folder / "jupyterhub_config.py")], cwd=folder,
                                stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_for("hub API", lambda: requests.get(f"{url}/hub/api/", timeout=5).ok, proc, log)
        hub = Hub(url, admin)
        _wait_for("check service", lambda: hub.check(None, b"{}").status_code == 401, proc, log)
        hub.api("POST", "users", json={"usernames": ["ann", "bob", "cat"]})
        hub.log, hub.proc = log, proc
        yield hub
    finally:
        # every process the hub started, the proxy (a session of its own) and the service
        # (root's here) included, is stopped by pid, also when the hub died at its start
        started = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        stop_hub(proc, folder / "proxy.pid")
        assert not [p.cmdline() for p in started if p.is_running()], "the hub left processes running"


def _body(notebook: Path | dict, name: str | None = None) -> bytes:
    nb = json.loads(notebook.read_text(encoding="utf-8")) if isinstance(notebook, Path) else notebook
    return json.dumps({"name": name or (notebook.name if isinstance(notebook, Path) else f"{A}.ipynb"),
                       "notebook": nb}).encode()


def _hostile() -> dict:
    """The solution with its first answer cell turned into an endless loop."""
    nb = nbformat.read(course.SOLUTIONS / A / f"{A}.ipynb", as_version=4)
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution"))
    cell.source = "while True:\n    pass"
    return json.loads(nbformat.writes(nb))


def test_who_may_check(hub):
    solution = _body(course.SOLUTIONS / A / f"{A}.ipynb")
    refused = {"no token": hub.check(None, solution),
               "a token the hub never made": hub.check(secrets.token_hex(16), solution),
               "a token without the service's scope": hub.check(hub.token("ann", ["users:activity!user"]), solution)}
    assert {why: r.status_code for why, r in refused.items()} == {
        "no token": 401, "a token the hub never made": 401, "a token without the service's scope": 403}
    for why, response in refused.items():
        line = response.json()["error"]
        assert line and "\n" not in line, (why, line)


def test_an_oversized_notebook_is_refused_unread(hub):
    token = hub.token("ann", SERVER_SCOPES)
    big = {"cells": [], "metadata": {"padding": "x" * MAX_BODY_BYTES}, "nbformat": 4, "nbformat_minor": 5}
    response = hub.check(token, _body(big))
    assert response.status_code == 413 and "larger than 20 MB" in response.json()["error"], response.text


def test_checks_at_once_one_per_student_a_hostile_one_stopped(hub, tmp_path, capsys, monkeypatch):
    """ann sends her right notebook twice at once; bob an endless loop; cat, from the
    check cell's own client, chloe's notebook with mistakes while ann's and bob's hold both
    slots. ann's second gets 429; cat's cell prints that she is 1st in line (the lines come
    through the hub's proxy) and her result when ann's check has ended; bob's ends at the
    limit in one line; each gets their own result."""
    tokens = {user: hub.token(user, SERVER_SCOPES) for user in ("ann", "bob", "cat")}
    solution = _body(course.SOLUTIONS / A / f"{A}.ipynb")
    mine = tmp_path / "my copy.ipynb"
    mine.write_bytes((course.SAMPLE_CLASS / "chloe" / A / f"{A}.ipynb").read_bytes())
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", tokens["cat"])
    started = hub.log.read_text().count("started a check for")
    with ThreadPoolExecutor(4) as pool:
        ann = [pool.submit(hub.check, tokens["ann"], solution) for _ in range(2)]
        bob = pool.submit(hub.check, tokens["bob"], _body(_hostile()))
        _wait_for("ann's and bob's checks started",
                  lambda: hub.log.read_text().count("started a check for") == started + 2, hub.proc, hub.log)
        _check_on_service(f"{hub.url}/services/{SERVICE}/", mine)
        ann_results = sorted((f.result() for f in ann), key=lambda r: r.status_code)
        bob_result = bob.result()
    printed = capsys.readouterr().out.splitlines()
    waits = [line for line in printed if line.startswith("check my work: the checkers are busy: ")]
    assert waits and all(" you are 1st in line, about " in line for line in waits), printed
    assert printed[:len(waits)] == waits, printed
    cat_text = "\n".join(printed[len(waits):])
    assert [r.status_code for r in ann_results] == [200, 429], [r.text for r in ann_results]
    graded, second = (r.json() for r in ann_results)
    assert "wait for it to finish" in second["error"]
    top = sum(expected_grades()[("ada", A)]["exercises"].values())
    assert (graded["assignment"], graded["score"], graded["max_score"]) == (A, top, top), graded
    assert f"Score: {top:g}/{top:g}" in graded["text"] and "What to revisit: nothing" in graded["text"]

    assert bob_result.status_code == 200, bob_result.text
    line = bob_result.json()["text"]
    assert "\n" not in line and f"longer than {SECONDS} s" in line, line

    expected = expected_grades()[("chloe", A)]
    assert cat_text.startswith("Checked my copy.ipynb") and f"Score: {expected['score']:g}/{top:g}" in cat_text, \
        cat_text
    assert "softmax over the key axis" in cat_text and "softmax over the key axis" not in graded["text"]
    assert "my copy" not in graded["text"] + line
    log = hub.log.read_text()
    assert "checked 01_similarity.ipynb for ann" in log and "checked my copy.ipynb for cat" in log, log


# ------------------------------------------------ the queue, memory and quota, with a stub check
# The real service code (grader.checkservice's Checks and make_app) in a process of its own, with
# the hub's answer about a token and the grading stubbed (tests/stub_checkservice.py): a token is
# its user's name, and each check waits until the test says it may end. Order and counts are
# asserted, never durations.

class Stub:
    def __init__(self, folder: Path, port: int, proc: subprocess.Popen):
        self.folder, self.port, self.proc = folder, port, proc
        self.url = f"http://127.0.0.1:{port}/services/{SERVICE}/check"

    def started(self) -> list[str]:
        path = self.folder / "started"
        return path.read_text().split() if path.exists() else []

    def wait_started(self, count: int) -> list[str]:
        _until(lambda: len(self.started()) >= count, f"{count} checks started", self.proc)
        return self.started()

    def go(self, number: int) -> None:
        """Let the ``number``-th check that started end."""
        (self.folder / "go" / str(number)).touch()

    def post(self, user: str, body: bytes = b'{"name": "a.ipynb", "notebook": {}}', lines: bool = False):
        headers = {"Authorization": f"token {user}"} | ({"Accept": "application/x-ndjson"} if lines else {})
        return requests.post(self.url, data=body, headers=headers, timeout=120, stream=lines)

    def checks_on_disk(self) -> list[Path]:
        return list((self.folder / "tmp").glob("course-check-*"))


def _until(done, what: str, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds  # a backstop only: each wait ends on what it waits for
    while not done():
        assert proc.poll() is None, f"the service exited ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"no {what} after {seconds} s"
        time.sleep(0.02)


@pytest.fixture
def stub(tmp_path):
    procs = []

    def start(slots: int = 1, daily: int = 0) -> Stub:
        folder = tmp_path / f"service{len(procs)}"
        (folder / "go").mkdir(parents=True)
        (folder / "tmp").mkdir()
        port = free_port()
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(course.ROOT), "TMPDIR": str(folder / "tmp")}
        proc = subprocess.Popen([sys.executable, "-m", "tests.stub_checkservice", "serve", str(port), str(folder),
                                 str(slots), str(daily)], cwd=course.ROOT, env=env)
        procs.append(proc)
        service = Stub(folder, port, proc)

        def listening():
            try:
                return requests.post(service.url, timeout=5).status_code == 401
            except requests.ConnectionError:
                return False
        _until(listening, "service listening", proc)
        return service

    yield start
    for proc in procs:  # its stub checks end with it (they watch their parent)
        proc.terminate()
        proc.wait(timeout=30)


def _lines(response: requests.Response):
    for line in response.iter_lines():
        if line.strip():
            yield json.loads(line)


def test_a_flood_waits_its_turn_and_others_keep_their_place(stub):
    """One checker. xia's check runs; flo sends six at once: one waits in line, five are
    refused (429) at once; amy comes next and is told she is 2nd, then 1st; the checks start
    xia, flo, amy: flo's flood cost amy one check, and nobody is told the checkers are busy."""
    service = stub(slots=1)
    with ThreadPoolExecutor(8) as pool:
        xia = pool.submit(service.post, "xia")
        assert service.wait_started(1) == ["xia"]
        flood = [pool.submit(service.post, "flo") for _ in range(6)]
        _until(lambda: sum(f.done() for f in flood) == 5, "the refusals", service.proc)
        (flo,) = [f for f in flood if not f.done()]
        refused = [f.result() for f in flood if f is not flo]
        assert [r.status_code for r in refused] == [429] * 5, [r.text for r in refused]
        assert all("still running or waiting" in r.json()["error"] for r in refused)
        amy = service.post("amy", lines=True)
        amy_lines = _lines(amy)
        first = next(amy_lines)
        assert first["queue"]["position"] == 2 and first["queue"]["seconds"] > 0, first
        service.go(1)
        assert xia.result().json()["text"] == "checked for xia"
        assert service.wait_started(2) == ["xia", "flo"]
        # amy moved up: 1st (the service may repeat a place every few seconds: ignore repeats)
        second = next(line for line in amy_lines if line["queue"]["position"] != 2)
        assert second["queue"]["position"] == 1, second
        service.go(2)
        assert flo.result().status_code == 200 and flo.result().json()["text"] == "checked for flo"
        assert service.wait_started(3) == ["xia", "flo", "amy"]
        service.go(3)
        rest = [line for line in amy_lines if line.get("queue", {}).get("position") != 1]
        assert rest == [{"assignment": "stub", "score": 1, "max_score": 1, "text": "checked for amy"}], rest
    assert service.checks_on_disk() == []


def test_leaving_the_line_frees_the_place(stub):
    """amy waits behind xia and gives up (her connection closes): her place goes to bob,
    and she may check again at once (no 429). bob gives up while his check runs: it is
    stopped and frees the checker for cyd."""
    service = stub(slots=1)
    with ThreadPoolExecutor(2) as pool:
        xia = pool.submit(service.post, "xia")
        service.wait_started(1)
        amy = service.post("amy", lines=True)
        amy_lines = _lines(amy)  # kept: a generator dropped unread would close the connection
        assert next(amy_lines)["queue"]["position"] == 1
        bob = service.post("bob", lines=True)
        bob_lines = _lines(bob)
        assert next(bob_lines)["queue"]["position"] == 2
        amy.close()
        assert next(line for line in bob_lines if line["queue"]["position"] != 2)["queue"]["position"] == 1
        again = service.post("amy", lines=True)
        again_lines = _lines(again)
        assert next(again_lines)["queue"]["position"] == 2, "amy's first request still holds her place"
        again.close()
        service.go(1)
        assert xia.result().status_code == 200
        assert service.wait_started(2) == ["xia", "bob"]
        bob.close()  # gives up while his check runs: it is stopped, and cyd's starts without waiting for it
        cyd = pool.submit(service.post, "cyd")
        assert service.wait_started(3) == ["xia", "bob", "cyd"]
        service.go(3)
        assert cyd.result().json()["text"] == "checked for cyd"
    _until(lambda: service.checks_on_disk() == [], "the requests' folders removed", service.proc)
    assert not (service.folder / "go" / "2").exists()


def test_uploads_go_to_disk_and_memory_returns_after_a_flood(stub):
    """Eight students each hold a 12 MB upload open (all but its last byte sent) while the
    one checker is busy: the bodies are on disk, the service's memory grows by less than one
    upload, and when they hang up their files go and its memory stays where it was. A body
    sent without a Content-Length is refused (413) once it passes the limit."""
    service = stub(slots=1)
    server = psutil.Process(service.proc.pid)
    size, chunk = 12 * 2**20, b"x" * 2**20
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(service.post, "xia")
        service.wait_started(1)
        before = server.memory_info().rss
        uploads = []
        for n in range(8):
            upload = http.client.HTTPConnection("127.0.0.1", service.port, timeout=60)
            upload.putrequest("POST", f"/services/{SERVICE}/check")
            upload.putheader("Authorization", f"token flood{n}")
            upload.putheader("Content-Length", str(size))
            upload.endheaders()
            for _ in range(size // len(chunk) - 1):
                upload.send(chunk)
            upload.send(chunk[:-1])
            uploads.append(upload)
        stored = lambda: [p.stat().st_size for p in (service.folder / "tmp").glob("course-check-*/request.json")]
        _until(lambda: stored().count(size - 1) == 8, "the uploads on disk", service.proc)
        during = server.memory_info().rss
        for upload in uploads:
            upload.close()
        _until(lambda: len(service.checks_on_disk()) == 1, "the uploads' folders removed", service.proc)
        after = server.memory_info().rss
        assert during - before < size and after - before < size // 2, (before, during, after)
        # every one of them may check again: nothing of theirs is still open
        retry = service.post("flood0", lines=True)
        retry_lines = _lines(retry)
        first = next(retry_lines)
        assert first.get("queue", {}).get("position") == 1, first
        retry.close()
        # a body without a Content-Length is refused once it passes the limit, and its file goes
        over = requests.post(service.url, data=(chunk for _ in range(MAX_BODY_BYTES // len(chunk) + 2)),
                             headers={"Authorization": "token flood1"}, timeout=60)
        assert over.status_code == 413 and "larger than 20 MB" in over.json()["error"], over.text
        _until(lambda: len(service.checks_on_disk()) == 1, "the oversized upload's folder removed", service.proc)
        service.go(1)
        assert busy.result().status_code == 200


def test_a_daily_quota(stub):
    """--daily 2: ann's third check of the day is refused in one line; bob still checks."""
    service = stub(slots=1, daily=2)
    for number in (1, 2):
        service.go(number)
        assert service.post("ann").json()["text"] == "checked for ann"
    third = service.post("ann")
    assert third.status_code == 429 and "2 times today" in third.json()["error"], third.text
    service.go(3)
    assert service.post("bob").json()["text"] == "checked for bob"
    assert service.started() == ["ann", "ann", "bob"]


class _LineService(ThreadingHTTPServer):
    """Answers a check as the service does for a student who waits: the given JSON lines,
    one by one; remembers the request's Accept header."""

    def __init__(self, lines: list[dict]):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.accept = self.headers.get("Accept")
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.end_headers()
                for line in lines:
                    self.wfile.write(json.dumps(line).encode() + b"\n")
                    self.wfile.flush()

            def log_message(self, *args):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_port}/services/{SERVICE}/"


@pytest.mark.parametrize("last, printed", [
    ({"assignment": A, "score": 1, "max_score": 1, "text": "Checked 01_similarity.ipynb\nScore: 1/1"},
     ["Checked 01_similarity.ipynb", "Score: 1/1"]),
    ({"error": "the checker failed: tell your instructor"}, ["check my work: the checker failed: tell your instructor"]),
])
def test_the_cell_prints_its_place_in_line(tmp_path, capsys, monkeypatch, last, printed):
    notebook = tmp_path / f"{A}.ipynb"
    notebook.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    service = _LineService([{"queue": {"position": 3, "seconds": 45}}, {"queue": {"position": 2, "seconds": 150}},
                            {"queue": {"position": 1, "seconds": 15}}, last])
    threading.Thread(target=service.serve_forever, daemon=True).start()
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "a-token")
    try:
        _check_on_service(service.url, notebook)
    finally:
        service.shutdown()
    assert service.accept == "application/x-ndjson"
    wait = "check my work: the checkers are busy: you are {} in line, about {} before yours starts"
    assert capsys.readouterr().out.splitlines() == [
        wait.format("3rd", "45 s"), wait.format("2nd", "2 min"), wait.format("1st", "15 s"), *printed]
