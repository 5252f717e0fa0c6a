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

import json
import os
import secrets
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil
import pytest
import requests

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

    def check(self, token: str | None, body: bytes) -> requests.Response:
        headers = {"Content-Type": "application/json"} | ({"Authorization": f"token {token}"} if token else {})
        return requests.post(self.check_url, data=body, headers=headers, timeout=300)


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    if not CHP.exists():
        pytest.fail(f"configurable-http-proxy is missing ({CHP}): run `make hub-deps`")
    if not JUPYTERHUB.exists():
        pytest.fail("jupyterhub is missing from the venv: run `make` (pyproject.toml pins it)")
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
        hub.log = log
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


def test_checks_at_once_one_per_student_a_hostile_one_stopped(hub):
    """ann sends her right notebook twice at once; bob an endless loop; cat chloe's notebook
    with mistakes. ann's second gets 429; bob's ends at the limit in one line while ann and
    cat are graded, each with their own result."""
    tokens = {user: hub.token(user, SERVER_SCOPES) for user in ("ann", "bob", "cat")}
    solution = _body(course.SOLUTIONS / A / f"{A}.ipynb")
    chloe = _body(course.SAMPLE_CLASS / "chloe" / A / f"{A}.ipynb", name="my copy.ipynb")
    with ThreadPoolExecutor(4) as pool:
        ann = [pool.submit(hub.check, tokens["ann"], solution) for _ in range(2)]
        bob = pool.submit(hub.check, tokens["bob"], _body(_hostile()))
        ann_results = sorted((f.result() for f in ann), key=lambda r: r.status_code)
        bob_result = bob.result()
        cat_result = hub.check(tokens["cat"], chloe)  # a slot is free again once ann's and bob's are done
    assert [r.status_code for r in ann_results] == [200, 429], [r.text for r in ann_results]
    graded, second = (r.json() for r in ann_results)
    assert "wait for it to finish" in second["error"]
    top = sum(expected_grades()[("ada", A)]["exercises"].values())
    assert (graded["assignment"], graded["score"], graded["max_score"]) == (A, top, top), graded
    assert f"Score: {top:g}/{top:g}" in graded["text"] and "What to revisit: nothing" in graded["text"]

    assert bob_result.status_code == 200, bob_result.text
    line = bob_result.json()["text"]
    assert "\n" not in line and f"longer than {SECONDS} s" in line, line

    assert cat_result.status_code == 200, cat_result.text
    cat = cat_result.json()
    expected = expected_grades()[("chloe", A)]
    assert cat["score"] == expected["score"] and cat["text"].startswith("Checked my copy.ipynb"), cat
    assert "softmax over the key axis" in cat["text"] and "softmax over the key axis" not in graded["text"]
    assert "my copy" not in graded["text"] + line
    log = hub.log.read_text()
    assert "checked 01_similarity.ipynb for ann" in log and "checked my copy.ipynb for cat" in log, log
