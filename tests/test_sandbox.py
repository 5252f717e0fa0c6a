"""The grading sandbox seen from inside: one sandboxed kernel, probed cell by cell.

Every test runs code in the same kind of kernel a submission is graded in and checks
what it can see and do. These tests need Debian's bubblewrap (`.ci/run` installs it).
"""
from __future__ import annotations

import asyncio
import json
import os
import socket

import pytest

from grader import course
from grader.sandbox import SandboxedKernelManager, bwrap

pytestmark = pytest.mark.kernel


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    assert bwrap(), "bubblewrap is not installed: apt-get install bubblewrap (.ci/run does it)"
    submission = tmp_path_factory.mktemp("submission")
    (submission / "data.csv").write_text("a,b\n1,2\n")
    (submission / "01_similarity.ipynb").write_text("{}")
    (submission / "gradebook.db").write_text("not for the kernel")  # stands in for the workspace
    os.environ["GRADER_ONLY_SECRET"] = "s3cret"  # the grader's environment must not leak in
    loop = asyncio.new_event_loop()
    km = SandboxedKernelManager(kernel_name="python3", memory_mb=2048, processes=64, scratch_mb=64)
    loop.run_until_complete(km.start_kernel(cwd=str(submission),
                                            extra_arguments=["--HistoryManager.hist_file=:memory:"]))
    kc = km.client()
    kc.start_channels()
    loop.run_until_complete(kc.wait_for_ready(timeout=120))
    km.seal()

    def run(code: str) -> object:
        """Run ``code`` in the kernel; return the JSON value it prints last."""
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append(json.dumps({"error": msg["content"]["ename"]}) + "\n")

        loop.run_until_complete(kc.execute_interactive(code, output_hook=hook, timeout=60))
        return json.loads("".join(out).strip().splitlines()[-1])

    yield run, km
    kc.stop_channels()
    loop.run_until_complete(km.shutdown_kernel(now=True))
    loop.close()
    del os.environ["GRADER_ONLY_SECRET"]


def test_course_folder_hides_everything_but_coursekit_and_its_assets(kernel):
    run, _ = kernel
    seen = run(f"import os, json; print(json.dumps(sorted(os.listdir({str(course.ROOT)!r}))))")
    assert set(seen) <= {"coursekit", ".venv", "assets"}, seen
    # assets/ (coursekit/assets links to it) holds data only: the font and what it is
    files = run(f"import os, json; print(json.dumps(sorted(os.path.relpath(os.path.join(d, f), {str(course.ROOT / 'assets')!r}) "
                f"for d, _, fs in os.walk({str(course.ROOT / 'assets')!r}) for f in fs)))")
    assert files == sorted(p.relative_to(course.ROOT / "assets").as_posix()
                           for p in (course.ROOT / "assets").rglob("*") if p.is_file()), files
    assert not [f for f in files if f.endswith((".py", ".ipynb", ".json", ".db"))], files
    assert run("import json, coursekit.plots as p; print(json.dumps(p.KOREAN_FONT.is_file()))") is True
    assert run("import json\ntry:\n import grader.checks; print(json.dumps('imported'))\n"
               "except ImportError as e: print(json.dumps('hidden'))") == "hidden"
    assert run("import coursekit.probe, json; print(json.dumps('ok'))") == "ok"


def test_working_directory_holds_a_copy_of_the_submission_files_only(kernel):
    run, _ = kernel
    assert run("import os, json; print(json.dumps(sorted(os.listdir('.'))))") == ["data.csv", "gradebook.db"]
    assert run("open('out.txt', 'w').write('x'); import json; print(json.dumps('written'))") == "written"


def test_no_network(kernel):
    run, _ = kernel
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    result = run("import socket, json\ntry:\n socket.create_connection(('127.0.0.1', %d), timeout=2)\n"
                 " print(json.dumps('connected'))\nexcept OSError as e: print(json.dumps('refused'))" % port)
    assert result == "refused"
    with pytest.raises(socket.timeout):
        listener.accept()
    listener.close()


def test_grader_processes_and_environment_are_invisible(kernel):
    run, _ = kernel
    cmdlines = run("import os, json\nout = []\nfor p in os.listdir('/proc'):\n if p.isdigit():\n"
                   "  try: out.append(open(f'/proc/{p}/cmdline','rb').read().decode(errors='replace'))\n"
                   "  except OSError: pass\nprint(json.dumps(out))")
    assert not any("pytest" in c for c in cmdlines), cmdlines
    assert run("import os, json; print(json.dumps(os.environ.get('GRADER_ONLY_SECRET')))") is None
    # nbgrader's own flag does reach it: notebooks 09 and 10 train briefly while graded
    assert run("import os, json; print(json.dumps(os.environ.get('NBGRADER_EXECUTION')))") == "autograde"
    if os.geteuid() == 0:
        assert run("import os, json; print(json.dumps(os.getuid()))") != 0


def test_resource_limits(kernel):
    run, _ = kernel
    # the scratch tmpfs (64 MiB here) fills up instead of the machine's disk
    assert run("import json\ntry:\n with open('/tmp/big', 'wb') as f:\n  [f.write(b'0' * 2**20) for _ in range(200)]\n"
               " print(json.dumps('wrote 200 MiB'))\nexcept OSError as e: print(json.dumps(e.errno))") != "wrote 200 MiB"
    assert run("import numpy as np, json\ntry:\n a = np.ones(2**31); print(json.dumps('allocated 16 GiB'))\n"
               "except MemoryError: print(json.dumps('MemoryError'))") == "MemoryError"
    forked = run("import os, time, json\nn = 0\ntry:\n for _ in range(200):\n  if os.fork() == 0:\n"
                 "   time.sleep(5); os._exit(0)\n  n += 1\nexcept OSError: pass\nprint(json.dumps(n))")
    assert forked < 64


def test_socket_folder_is_sealed(kernel):
    run, km = kernel
    if os.geteuid() != 0:
        pytest.fail("run the tests as root (as CI does): sealing needs a separate kernel uid")
    folder = os.path.dirname(km.connection_file)
    assert run(f"import json\ntry:\n open({folder!r} + '/fill', 'wb').write(b'x'); print(json.dumps('wrote'))\n"
               "except OSError: print(json.dumps('denied'))") == "denied"


def test_cpu_time_of_the_kernel_is_measured(kernel):
    run, km = kernel
    before = km.cpu_time()
    run("import time, json\nt = time.process_time()\nwhile time.process_time() - t < 1: pass\nprint(json.dumps(1))")
    assert km.cpu_time() - before >= 0.9


def test_without_bwrap_the_kernel_runs_with_rlimits_after_a_loud_warning(tmp_path, monkeypatch, capsys):
    import grader.sandbox as sandbox
    from grader.sandbox import SandboxUnavailable

    monkeypatch.setattr(sandbox, "bwrap", lambda: None)
    monkeypatch.setattr(sandbox, "_warned", False)
    loop = asyncio.new_event_loop()
    strict = SandboxedKernelManager(kernel_name="python3", require_sandbox=True)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        loop.run_until_complete(strict.start_kernel(cwd=str(tmp_path)))
    km = SandboxedKernelManager(kernel_name="python3", memory_mb=2048)
    loop.run_until_complete(km.start_kernel(cwd=str(tmp_path)))
    assert "WARNING: bubblewrap (bwrap) is not installed" in capsys.readouterr().err
    kc = km.client()
    kc.start_channels()
    loop.run_until_complete(kc.wait_for_ready(timeout=120))
    out = []
    loop.run_until_complete(kc.execute_interactive(
        "import numpy as np\ntry:\n np.ones(2**31); print('allocated')\nexcept MemoryError: print('MemoryError')",
        output_hook=lambda m: out.append(m["content"].get("text", "")), timeout=60))
    kc.stop_channels()
    loop.run_until_complete(km.shutdown_kernel(now=True))
    loop.close()
    assert "MemoryError" in "".join(out)
