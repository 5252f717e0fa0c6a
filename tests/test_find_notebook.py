"""The check cell finds the notebook it runs in (``coursekit.check``), in real kernels.

A real ``jupyter server`` from the venv (loopback, a token) holds a session whose notebook
is then renamed through its REST API, as JupyterLab renames it; nbclient runs a renamed
copy beside its original, as nbconvert and papermill do. In both the check cell itself
runs in the kernel and sends the notebook it found to a stand-in for the check service
(``COURSE_CHECK_URL``), which records what it got, so nothing is graded here.
"""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import nbformat
import pytest
import requests
from jupyter_client import BlockingKernelClient
from nbclient import NotebookClient

from coursekit.check import ASK, check_my_work
from grader import course
from grader.release import check_cell_source
from hub.launch import free_port

pytestmark = pytest.mark.kernel

JUPYTER_SERVER = Path(sys.prefix) / "bin" / "jupyter-server"


class FakeService:
    """Answers every check with one line and remembers the requests."""

    def __init__(self):
        self.received: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.received.append({"path": self.path, "authorization": self.headers.get("Authorization"),
                                       **body})
                answer = json.dumps({"assignment": None, "score": 0, "max_score": 0,
                                     "text": f"FAKE CHECKED {body['name']}"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/services/course-check/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def service():
    fake = FakeService()
    yield fake
    fake.server.shutdown()


def _notebook(folder: Path, name: str, answer: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(answer), nbformat.v4.new_code_cell(check_cell_source())]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = folder / name
    nbformat.write(nb, path)
    return path


def _kernel_env(tmp_path: Path, service: FakeService) -> dict:
    """What a student's kernel inherits: this checkout's coursekit, the check service's URL
    and a hub token, and a runtime folder of the test's own."""
    (tmp_path / "runtime").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JPY_", "JUPYTER", "NBGRADER"))}
    return env | {"PYTHONPATH": str(course.ROOT), "COURSE_CHECK_URL": service.url,
                  "JUPYTERHUB_API_TOKEN": "the-hub-token", "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
                  "HOME": str(tmp_path)}


def test_a_notebook_renamed_in_the_server_checks_itself_under_its_new_name(tmp_path, service):
    root = tmp_path / "root"
    root.mkdir()
    _notebook(root, "01_similarity.ipynb", "x = 'mine'")
    token, port = secrets.token_hex(16), free_port()
    env = _kernel_env(tmp_path, service)
    log = tmp_path / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen([str(JUPYTER_SERVER), "--no-browser", "--ip=127.0.0.1", f"--port={port}",
                                   f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                                   *(["--allow-root"] if os.geteuid() == 0 else [])],
                                  env=env, stdout=out, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api"
    headers = {"Authorization": f"token {token}"}
    try:
        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, log.read_text()
            try:
                if requests.get(f"{api}/status", headers=headers, timeout=5).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        session = requests.post(f"{api}/sessions", headers=headers, timeout=60, json={
            "path": "01_similarity.ipynb", "type": "notebook", "name": "", "kernel": {"name": "python3"}}).json()
        # JupyterLab's rename: the file through the contents API, then the session's path
        renamed = requests.patch(f"{api}/contents/01_similarity.ipynb", headers=headers, timeout=30,
                                 json={"path": "01_similarity (my copy).ipynb"})
        assert renamed.ok, renamed.text
        moved = requests.patch(f"{api}/sessions/{session['id']}", headers=headers, timeout=30,
                               json={"path": "01_similarity (my copy).ipynb"})
        assert moved.ok, moved.text
        # a notebook with the same code under the old name: neither the kernel's start-up
        # name (JPY_SESSION_NAME) nor its history tells the two apart, only the server
        _notebook(root, "01_similarity.ipynb", "x = 'mine'")
        client = BlockingKernelClient(connection_file=str(tmp_path / "runtime" / f"kernel-{session['kernel']['id']}.json"))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
            outputs = []
            reply = client.execute_interactive(check_cell_source(), timeout=60,
                                               output_hook=lambda msg: outputs.append(msg))
        finally:
            client.stop_channels()
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert reply["content"]["status"] == "ok", reply
    printed = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    assert printed.splitlines() == ["Checking the saved 01_similarity (my copy).ipynb (about 10 s; unsaved "
                                    "changes are not seen)...", "FAKE CHECKED 01_similarity (my copy).ipynb"]
    assert not [m for m in outputs if m["msg_type"] in ("execute_result", "error")], outputs  # no stray `1`
    [sent] = service.received
    assert sent["path"] == "/services/course-check/check" and sent["authorization"] == "token the-hub-token"
    assert "".join(sent["notebook"]["cells"][0]["source"]) == "x = 'mine'"


def _run(path: Path, env: dict) -> str:
    """Execute ``path`` with nbclient in its own folder, as nbconvert --execute does; what
    the check cell printed."""
    nb = nbformat.read(path, as_version=4)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)  # the kernel's environment is this process's
    try:
        NotebookClient(nb, timeout=60, resources={"metadata": {"path": str(path.parent)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    outputs = nb.cells[-1].outputs
    assert [o.output_type for o in outputs] == ["stream"] * len(outputs), outputs  # nothing displayed after it
    return "".join(o.text for o in outputs)


def test_nbconvert_runs_a_renamed_copy_beside_the_original_and_it_checks_itself(tmp_path, service):
    folder = tmp_path / "work"
    folder.mkdir()
    _notebook(folder, "01_similarity.ipynb", "x = 'as released'")
    copy = _notebook(folder, "my copy.ipynb", "x = 'my answer'")
    printed = _run(copy, _kernel_env(tmp_path, service))
    assert printed.splitlines()[-1] == "FAKE CHECKED my copy.ipynb", printed
    assert [r["name"] for r in service.received] == ["my copy.ipynb"]


def test_two_notebooks_with_the_same_code_cannot_be_told_apart_one_line(tmp_path, service):
    folder = tmp_path / "work"
    folder.mkdir()
    _notebook(folder, "01_similarity.ipynb", "x = 1")
    copy = _notebook(folder, "01_similarity-Copy1.ipynb", "x = 1")
    assert _run(copy, _kernel_env(tmp_path, service)).splitlines() == [ASK]
    assert service.received == []


def test_nothing_tells_which_notebook_one_line(monkeypatch, capsys, tmp_path):
    """Not in a kernel, no server, no JPY_SESSION_NAME, no path given."""
    for name in ("JPY_SESSION_NAME", "NBGRADER_EXECUTION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    assert check_my_work() is None
    assert capsys.readouterr().out.splitlines() == [ASK]
    assert ASK.endswith('check_my_work("path/to/your.ipynb")')


def test_vs_code_s_notebook_variable_names_the_notebook(tmp_path, service):
    """VS Code's Jupyter extension sets ``__vsc_ipynb_file__`` in the kernel to the open
    notebook's path. Two notebooks with the same code cannot be told apart by the kernel's
    history (the test above), so only the variable can pick the copy."""
    folder = tmp_path / "work"
    folder.mkdir()
    mine = folder / "mine.ipynb"
    set_by_vs_code = f"__vsc_ipynb_file__ = {str(mine)!r}"
    _notebook(folder, "01_similarity.ipynb", set_by_vs_code)
    _notebook(folder, mine.name, set_by_vs_code)
    printed = _run(mine, _kernel_env(tmp_path, service))
    assert printed.splitlines()[-1] == "FAKE CHECKED mine.ipynb", printed
    assert [r["name"] for r in service.received] == ["mine.ipynb"]
