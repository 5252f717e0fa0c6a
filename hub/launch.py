"""The course on a local JupyterHub: `make hub` (a demo) and tests/test_hub.py.

``start()`` brings up, on loopback only:

* two environments (``hub/environments.py``), built once and cached (see there)
  (keyed by a hash of their inputs, world-readable, from Debian's ``/usr/bin/python3.11``,
  which every account can run): the STUDENT one (the student wheel with its ``hub``
  extra; no grader package, no solutions; formgrader and create-assignment switched off
  in it) and the INSTRUCTOR one (the course installed editable from this repository, so
  ``course-grader`` and formgrader work);
* real local accounts made with ``useradd`` (``tests/accounts.py``) and given passwords
  with ``chpasswd``: an instructor (the hub's admin) and students;
* nbgrader's exchange, a root-owned folder of mode 0777, and the instructor's course
  directory ``~instructor/course`` (``grader.coursedir.CourseDir``, its nbgrader_config.py
  loading the repository's), made as the instructor;
* JupyterHub from this (the dev) venv, as root, with ``hub/jupyterhub_config.py``: PAM
  logins, each single-user server started as its user from its environment, the proxy
  from ``make hub-deps``.

Students must not read the answers: the checkout (solutions/, grader/checks/ with its
references, the hidden tests), the instructor environment (an editable install of the
checkout, inside it in out/envs/), the course directory and gradebook, the course secret,
the check service's secret, the hub's state and log (``Hub.private``); the service's
working folders are ``mkdtemp``'s (0700, the instructor's). The students' environment
needs none of them. Homes are 0700; the checkout, wherever the
clone happens to be, is closed for the hub's life (``closed_checkout``: group the
instructor's own, mode 0750, restored when the hub stops or by the next start after a
killed run); the log is 0600.

Leaving the context stops the hub and every process it started, by pid (``stop_hub``):
its descendants, the proxy (from its pid file, so also after the hub itself died) and
every process of a course account; then the accounts are removed (``userdel -r``) unless
``keep_accounts``.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import psutil

from hub import environments
from hub.environments import INTERPRETER, EnvironmentMissing

ROOT = Path(__file__).resolve().parents[1]
PROXY = ROOT / "hub" / "node_modules" / ".bin" / "configurable-http-proxy"
CONFIG = ROOT / "hub" / "jupyterhub_config.py"
JUPYTERHUB = Path(sys.prefix) / "bin" / "jupyterhub"  # the dev venv's; the hub runs as root
COURSE_ID = "attention-from-scratch"  # nbgrader_config.py's c.CourseDirectory.course_id
STARTUP_SECONDS = 120
STOP_SECONDS = 30
KILL_SECONDS = 5  # what a process the hub left gets between SIGTERM and SIGKILL
# While a hub runs, the checkout is closed to other accounts; what it was is kept here so
# that a killed run's next start can restore it. The lock keeps a second hub from the
# same checkout from changing it under the first.
HUB_LOCK = environments.OUT / "hub.lock"
CHECKOUT_RECORD = environments.OUT / "hub-checkout-mode.json"
# nbgrader's instructor tools, which students must not have (server and lab extensions).
INSTRUCTOR_SERVER_EXTENSIONS = ["nbgrader.server_extensions.formgrader",
                                "nbgrader.server_extensions.create_assignment",
                                "nbgrader.server_extensions.course_list"]
INSTRUCTOR_LAB_PLUGINS = ["@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                          "@jupyter/nbgrader:course-list"]
SYSTEM_PATH = "/usr/bin:/bin"
PROXY_PID_FILE = "jupyterhub-proxy.pid"  # in the hub's state folder (jupyterhub_config.py)


def require() -> None:
    """Check what the hub needs from the machine.

    Raises:
        EnvironmentMissing: root is needed, or the proxy, /usr/bin/python3.11, bubblewrap
            or a user-management tool is missing; the message gives the install command.
    """
    if os.geteuid() != 0:
        raise EnvironmentMissing("the course hub makes real accounts and runs JupyterHub as root: run it as root")
    missing = []
    if not os.access(PROXY, os.X_OK):
        missing.append(f"configurable-http-proxy ({PROXY}): run `make hub-deps` (npm ci --prefix hub)")
    if not os.access(INTERPRETER, os.X_OK):
        missing.append(f"{INTERPRETER}: run `apt-get install python3.11 python3.11-venv`")
    if shutil.which("bwrap") is None:
        missing.append("bubblewrap, the grading sandbox: run `apt-get install bubblewrap`")
    for tool in ("useradd", "userdel", "chpasswd", "runuser"):
        if shutil.which(tool) is None:
            missing.append(f"{tool}: run `apt-get install passwd util-linux`")
    if not os.access(JUPYTERHUB, os.X_OK):
        missing.append(f"{JUPYTERHUB}: run `make demo` (pip install -c constraints.txt -e '.[instructor,test]' into .venv; constraints.txt pins {environments.HUB_PIN})")
    closed = [folder for folder in ROOT.parents if not os.stat(folder).st_mode & stat.S_IXOTH]
    if closed:
        missing.append(f"the instructor's account must reach this checkout, but {closed[-1]} is closed to other "
                       "accounts: clone the course into a folder others may enter (the hub closes the clone itself)")
    if missing:
        raise EnvironmentMissing("the course hub cannot start:\n  " + "\n  ".join(missing))


# ------------------------------------------------------------------------------- the environments

def student_env() -> Path:
    """The student environment's python, with the instructor's nbgrader tools switched off.

    Raises:
        EnvironmentMissing, RuntimeError: as ``hub.environments.build_venv``.
    """
    python = environments.student_env("hub")
    prefix = python.parent.parent
    jupyter = str(prefix / "bin" / "jupyter")
    for extension in INSTRUCTOR_SERVER_EXTENSIONS:
        subprocess.run([jupyter, "server", "extension", "disable", "--sys-prefix", extension], check=True,
                       capture_output=True, env=environments.clean_env())
    for plugin in INSTRUCTOR_LAB_PLUGINS:
        subprocess.run([jupyter, "labextension", "disable", "--level=sys_prefix", plugin], check=True,
                       capture_output=True, env=environments.clean_env())
    _no_news(prefix)
    subprocess.run(["chmod", "-R", "a+rX", str(prefix / "etc"), str(prefix / "share" / "jupyter")], check=True)
    return python


def _no_news(prefix: Path) -> None:
    """JupyterLab's settings overrides for everyone on this environment: never ask to fetch
    Jupyter's news feed (the machine is offline; the popup sits over the notebook)."""
    settings = prefix / "share" / "jupyter" / "lab" / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "overrides.json").write_text(json.dumps(
        {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false"}}, indent=1))


# ------------------------------------------------------------------------------- the hub

def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Hub:
    """A running course hub."""
    url: str
    instructor: str
    students: list[str]
    passwords: dict[str, str]
    course: Path  # the instructor's course directory
    exchange: Path
    base: Path
    log: Path
    accounts: object  # tests.accounts.Accounts
    instructor_python: Path
    student_python: Path
    state: Path  # the hub's own folder (root's, 0700): database, cookie secret, the proxy's pid file
    process: subprocess.Popen | None = field(default=None, repr=False)
    stopped: list[int] = field(default_factory=list)  # what stop_hub had to stop after the hub itself

    def user_url(self, user: str) -> str:
        return f"{self.url}/user/{user}"

    def home(self, user: str) -> Path:
        return Path(pwd.getpwnam(user).pw_dir)

    @property
    def secret(self) -> Path:
        """The course secret (c.CourseSecret.secret_file): the instructor's, mode 0600."""
        return self.home(self.instructor) / ".attention-course-secret"

    @property
    def private(self) -> dict[str, Path]:
        """Where this hub put what no student may read (the module's docs say how each is closed)."""
        return {"the checkout: solutions/, grader/checks/ and its references, the hidden tests": ROOT,
                "the instructor environment: an editable install of the checkout":
                    self.instructor_python.parent.parent,
                "the course directory: gradebook.db, submitted/, autograded/, feedback/": self.course,
                "the course secret": self.secret,
                "the instructor's Jupyter data, where the check service keeps its secret":
                    self.home(self.instructor) / ".local" / "share" / "jupyter",
                "the hub's state: its database holds every token": self.state,
                "the hub's log, where the check service logs why a check failed": self.log}

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def run_as(self, user: str, *argv, cwd: Path | None = None, timeout: float = 600,
               check: bool = True) -> subprocess.CompletedProcess:
        """Run ``argv`` as ``user`` with a clean environment (their environment's bin first on PATH).

        Raises:
            RuntimeError: ``check`` and the command failed; its output is in the message.
        """
        python = self.instructor_python if user == self.instructor else self.student_python
        home = self.home(user)
        env = ["env", "-i", f"HOME={home}", f"PATH={python.parent}:{SYSTEM_PATH}", "LANG=C.UTF-8",
               f"USER={user}", f"LOGNAME={user}"]
        done = subprocess.run(["runuser", "-u", user, "--", *env, *map(str, argv)], cwd=cwd or home,
                              capture_output=True, text=True, timeout=timeout)
        if check and done.returncode:
            raise RuntimeError(f"{[str(a) for a in argv]} as {user} failed (exit {done.returncode}):\n"
                               f"{done.stdout}\n{done.stderr}")
        return done


def _set_password(user: str) -> str:
    password = secrets.token_urlsafe(12)
    subprocess.run(["chpasswd"], input=f"{user}:{password}\n", text=True, check=True, capture_output=True)
    return password


def _instructor_course(hub: Hub) -> None:
    """``~instructor/course``, made as the instructor by CourseDir (its nbgrader_config.py
    loads the repository's), given the exchange, the course id and a course secret of the
    instructor's own; ``~instructor/.jupyter/nbgrader_config.py`` loads it, so formgrader
    in the instructor's server opens this course."""
    home = hub.home(hub.instructor)
    hub.run_as(hub.instructor, hub.instructor_python, "-c",
               "import sys; from grader.coursedir import CourseDir; CourseDir.open(sys.argv[1])", hub.course)
    extra = (f"# the course hub's (hub/launch.py)\n"
             f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
             f"c.Exchange.root = {str(hub.exchange)!r}\n"
             f"c.CourseSecret.secret_file = {str(hub.secret)!r}\n")
    config = hub.course / "nbgrader_config.py"
    with open(config, "a", encoding="utf-8") as f:  # root appends; the file stays the instructor's
        f.write(extra)
    hub.run_as(hub.instructor, "mkdir", "-p", home / ".jupyter")
    user_config = home / ".jupyter" / "nbgrader_config.py"
    user_config.write_text(f"c = get_config()  # noqa: F821\nload_subconfig({str(config)!r})  # noqa: F821\n")
    shutil.chown(user_config, hub.instructor, hub.instructor)


def _students_config(hub: Hub) -> None:
    """The students' nbgrader configuration, in their environment's etc/jupyter: the
    exchange, the course and the course's submit (nothing else: their course folder is
    their server's root)."""
    etc = hub.student_python.parent.parent / "etc" / "jupyter"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "nbgrader_config.py").write_text(
        '"""Written by hub/launch.py: the course hub\'s exchange and course, for every student."""\n'
        "c = get_config()  # noqa: F821\n"
        f"c.Exchange.root = {str(hub.exchange)!r}\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        '# a notebook not named as released: one line at submit on how it is graded\n'
        'c.ExchangeFactory.submit = "coursekit.submit.NamedSubmit"\n')
    os.chmod(etc / "nbgrader_config.py", 0o644)


def _wait_until_up(hub: Hub) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while True:
        try:
            urllib.request.urlopen(f"{hub.url}/hub/api", timeout=2).close()
            return
        except OSError:
            if hub.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"JupyterHub did not answer at {hub.url}:\n{hub.log_tail()}") from None
            time.sleep(0.3)


def processes_of(uids: Iterable[int]) -> list[psutil.Process]:
    """Every process running as one of ``uids`` (real or effective)."""
    uids = set(uids)
    found = []
    for proc in psutil.process_iter(["uids"]):
        ids = proc.info["uids"]
        if ids and {ids.real, ids.effective} & uids:
            found.append(proc)
    return found


def _proxy(pid_file: Path | None) -> list[psutil.Process]:
    """The proxy JupyterHub started, from the pid file JupyterHub keeps for it: the proxy
    runs in a session of its own, so when the hub dies it is orphaned, not stopped."""
    try:
        proc = psutil.Process(int(pid_file.read_text()))
        return [proc] if any("configurable-http-proxy" in part for part in proc.cmdline()) else []
    except (AttributeError, OSError, ValueError, psutil.Error):  # no pid file, or that process is gone
        return []


def stop_hub(process: subprocess.Popen | None, proxy_pid_file: Path | None = None, uids: Iterable[int] = (),
             seconds: float = STOP_SECONDS) -> list[int]:
    """Stop a JupyterHub and every process it started, by pid, whatever the hub managed itself.

    The hub's descendants (proxy, managed services, single-user servers, kernels) and its
    proxy (``proxy_pid_file``) are recorded first; the hub gets SIGTERM (its own cleanup),
    then SIGKILL after ``seconds``. Whatever recorded process outlived it, and every
    process of ``uids`` (the course's accounts: servers, kernels, the service, and what
    they started or orphaned), gets SIGTERM, then SIGKILL after KILL_SECONDS, in rounds
    until none is left (a process that forks while it is killed is caught by the next).
    psutil compares start times, so a reused pid is never signalled.

    Returns the pids stopped after the hub itself, sorted.
    """
    started = _proxy(proxy_pid_file)
    if process is not None:
        with contextlib.suppress(psutil.Error):
            started += psutil.Process(process.pid).children(recursive=True)
    if process is not None and process.poll() is None:
        process.send_signal(signal.SIGTERM)  # JupyterHub stops its services, servers and proxy on SIGTERM
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    uids, stopped, left = set(uids), set(), started
    for round_ in range(10):
        left = list({p.pid: p for p in [*left, *processes_of(uids)] if p.is_running()}.values())
        if not left:
            break
        stopped.update(p.pid for p in left)
        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.terminate() if round_ == 0 else proc.kill()
        left = psutil.wait_procs(left, timeout=KILL_SECONDS if round_ == 0 else 1)[1]
    return sorted(stopped)


def _stop(hub: Hub) -> None:
    """Stop the hub and everything it and the course's accounts started (``stop_hub``)."""
    uids = set()
    for user in [hub.instructor, *hub.students]:
        with contextlib.suppress(KeyError):
            uids.add(pwd.getpwnam(user).pw_uid)
    hub.stopped = stop_hub(hub.process, hub.state / PROXY_PID_FILE, uids)


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP ignored while the context runs (Python runs signal handlers
    in the main thread only, so elsewhere there is nothing to ignore): a second Ctrl-C while the hub stops would leave its
    processes, the accounts and a closed checkout behind. Stopping is bounded (STOP_SECONDS,
    then KILL_SECONDS a round)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = [signal.signal(sig, signal.SIG_IGN) for sig in signals]
    try:
        yield
    finally:
        for sig, handler in zip(signals, before):
            signal.signal(sig, handler)


@contextlib.contextmanager
def one_hub_per_checkout() -> Iterator[None]:
    """Hold HUB_LOCK while the context runs: a second hub from this checkout would remake
    the first one's accounts and change the checkout's mode under it.

    Raises:
        RuntimeError: another course hub from this checkout is running.
    """
    HUB_LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(HUB_LOCK, "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes, or this process dies
        except BlockingIOError:
            raise RuntimeError(f"another course hub from this checkout ({ROOT}) is running: stop it first") from None
        yield


@contextlib.contextmanager
def closed_checkout(group: int) -> Iterator[None]:
    """The checkout closed to every account but root and ``group`` (the instructor's own)
    while the context runs: its top folder gets that group and mode 0750, so that nothing
    under it (solutions/, grader/checks/, the instructor environment in out/envs/, the dev
    venv) can be reached by a student, wherever the clone is. What it was is restored
    afterwards, or, after a killed run, by the next start (CHECKOUT_RECORD). Call it
    within ``one_hub_per_checkout``.
    """
    _restore_checkout()
    was = os.stat(ROOT)
    CHECKOUT_RECORD.write_text(json.dumps({"mode": stat.S_IMODE(was.st_mode), "gid": was.st_gid}))
    try:
        os.chown(ROOT, -1, group)
        os.chmod(ROOT, 0o750)
        yield
    finally:
        _restore_checkout()


def _restore_checkout() -> None:
    """The checkout's group and mode as CHECKOUT_RECORD says they were, if a hub closed it."""
    if CHECKOUT_RECORD.is_file():
        was = json.loads(CHECKOUT_RECORD.read_text())
        os.chown(ROOT, -1, was["gid"])
        os.chmod(ROOT, was["mode"])
        CHECKOUT_RECORD.unlink()


@contextlib.contextmanager
def start(instructor: str = "afs_hub_instructor", students: tuple[str, ...] = ("afs_hub_ada", "afs_hub_kai"),
          keep_accounts: bool = False, spawner_args: tuple[str, ...] = ()) -> Iterator[Hub]:
    """The course hub, running until the context ends (see the module's docs).

    Args:
        instructor, students: account names; an existing account of that name is REMOVED
            and made anew (``tests.accounts.Accounts.add``): use names only the course uses.
        keep_accounts: leave the accounts (and their homes) when the hub stops.
        spawner_args: extra arguments for every single-user server.

    Raises:
        EnvironmentMissing: see ``require``; or the student environment is inside the
            checkout, which students may not enter.
        RuntimeError: the hub did not answer within STARTUP_SECONDS (its log in the message),
            or another hub from this checkout is running.
    """
    from tests.accounts import Accounts

    require()
    instructor_python, student_python = environments.instructor_env(), student_env()
    if ROOT in student_python.parents:
        raise EnvironmentMissing(f"the student environment {student_python.parent.parent} is inside the checkout, "
                                 "which the hub closes to students: set ATTENTION_COURSE_ENVS to a folder outside it")
    with one_hub_per_checkout():  # first: a second hub would remake this one's accounts
        base = Path(tempfile.mkdtemp(prefix="afs-hub-"))
        os.chmod(base, 0o755)
        (base / "home").mkdir()
        exchange = base / "exchange"
        exchange.mkdir()
        os.chmod(exchange, 0o777)  # nbgrader's exchange: root's, everyone writes (nbgrader keeps order inside)
        state = base / "hub"
        state.mkdir(mode=0o700)
        accounts = Accounts(base)
        hub = Hub(url="", instructor=instructor, students=list(students), passwords={}, course=Path(),
                  exchange=exchange, base=base, log=base / "jupyterhub.log", accounts=accounts,
                  instructor_python=instructor_python, student_python=student_python, state=state)
        checkout = contextlib.ExitStack()  # left after the hub has stopped: the checkout reopens last
        try:
            accounts.add(instructor, *students)
            checkout.enter_context(closed_checkout(pwd.getpwnam(instructor).pw_gid))
            for user in [instructor, *students]:
                os.chmod(hub.home(user), 0o700)  # useradd gives 0755 under UMASK 022: no one reads another's work
            hub.passwords = {user: _set_password(user) for user in [instructor, *students]}
            hub.course = hub.home(instructor) / "course"
            _instructor_course(hub)
            _students_config(hub)
            port, check_port = free_port(), free_port()
            hub.url = f"http://127.0.0.1:{port}"
            settings = {"port": port, "hub_port": free_port(), "proxy_api_port": free_port(), "state": str(state),
                        "proxy": str(PROXY), "instructor": instructor, "students": list(students),
                        "instructor_python": str(instructor_python), "student_python": str(student_python),
                        "course": str(hub.course), "check_port": check_port, "spawner_args": list(spawner_args),
                        "path": SYSTEM_PATH, "proxy_pid_file": str(state / PROXY_PID_FILE)}
            (state / "settings.json").write_text(json.dumps(settings, indent=1))
            env = {"PATH": f"{JUPYTERHUB.parent}:{SYSTEM_PATH}", "LANG": "C.UTF-8", "HOME": str(state),
                   "COURSE_HUB_SETTINGS": str(state / "settings.json")}
            # the service's errors go to the log: root's alone, as the state
            with open(os.open(hub.log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as log:
                hub.process = subprocess.Popen([str(JUPYTERHUB), "-f", str(CONFIG)], cwd=state, env=env,
                                               stdout=log, stderr=subprocess.STDOUT)
            _wait_until_up(hub)
            yield hub
        finally:
            with _uninterrupted():
                try:
                    _stop(hub)
                finally:
                    if not keep_accounts:
                        accounts.remove()
                        shutil.rmtree(base, ignore_errors=True)
                    checkout.close()


def main(argv: list[str] | None = None) -> int:
    """`make hub`: the course hub for a demo, until Ctrl-C."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep-accounts", action="store_true",
                        help="leave the accounts and their homes when the hub stops")
    args = parser.parse_args(argv)
    # `kill`, a closed terminal or a service manager stops the demo as Ctrl-C does: through
    # start()'s cleanup (hub and processes stopped, checkout reopened, accounts removed)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.default_int_handler)
    try:
        with start(instructor="afs_instructor", students=("afs_student1", "afs_student2"),
                   keep_accounts=args.keep_accounts) as hub:
            print(f"\nThe course hub is up: {hub.url}\n")
            for user in [hub.instructor, *hub.students]:
                role = "instructor (admin, formgrader)" if user == hub.instructor else "student"
                print(f"  {user:<16} password {hub.passwords[user]:<20} {role}")
            print(f"\nThe instructor's course directory: {hub.course}; the exchange: {hub.exchange}")
            print(f"This checkout ({ROOT}) is closed to the students (mode 0750, the instructor's group) "
                  "until the hub stops.")
            print("check my work: the hub's service course-check, as the instructor")
            print("Ctrl-C stops the hub" + ("" if args.keep_accounts else " and removes the accounts") + ".",
                  flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                while hub.process.poll() is None:
                    time.sleep(1)
                print(f"JupyterHub stopped by itself:\n{hub.log_tail()}", file=sys.stderr)
    except (EnvironmentMissing, RuntimeError) as error:  # what is missing; another hub; the hub did not answer
        print(f"make hub: {error}", file=sys.stderr)
        return 2
    print("stopped" + ("; accounts kept" if args.keep_accounts else "; accounts removed"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
