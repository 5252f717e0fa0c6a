"""A throwaway PostgreSQL server for tests: Debian's initdb/pg_ctl on 127.0.0.1, a free port.

PostgreSQL refuses to run as root, so as root the server runs as the ``postgres``
user (Debian's package creates it); otherwise as the current user. `.ci/run`
installs the package (apt-get install postgresql).
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin folder.

    Raises:
        RuntimeError: PostgreSQL is not installed.
    """
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (.ci/run does)")
    return Path(found[-1]).parent


@contextmanager
def postgres_server(database: str = "course"):
    """Start a server; yield a SQLAlchemy URL of an empty database; stop it and delete its data.

    The data lives in its own folder under /tmp: pytest's tmp_path is private to root,
    so the postgres user could not enter it.
    """
    bin_dir = postgres_bin()
    folder = Path(tempfile.mkdtemp(prefix="grader-postgres-"))
    as_user = []
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()

    def pg(tool: str, *args: str) -> None:
        done = subprocess.run([*as_user, str(bin_dir / tool), *args], cwd=folder, text=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        if done.returncode:
            raise RuntimeError(f"PostgreSQL's {tool} failed: {done.stderr.strip()}")

    try:
        pg("initdb", "-D", str(data), "-U", "grader", "--auth=trust", "--encoding=UTF8", "--no-sync")
        pg("pg_ctl", "-D", str(data), "-l", str(folder / "server.log"), "-w", "-t", "60", "start",
           "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off")
        try:
            pg("createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "grader", database)
            yield f"postgresql://grader@127.0.0.1:{port}/{database}"
        finally:
            pg("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def peer_server():
    """A server reached only through its Unix socket, with peer authentication (the
    account's own name is its role, no password anywhere), as docs/deploying.md sets up a
    hub's gradebook. Yields ``(socket_folder, psql)``: ``psql(sql)`` runs SQL as the
    superuser ``postgres``. The database ``attention_mapped`` takes the roles that
    ``pg_ident.conf``'s map ``course`` gives an account; every other database the role
    named after the account.
    """
    if os.geteuid() != 0:
        raise RuntimeError("the peer-authentication server runs as the postgres user: run as root")
    bin_dir = postgres_bin()
    folder = Path(tempfile.mkdtemp(prefix="grader-postgres-peer-"))
    os.chmod(folder, 0o755)  # the accounts reach the socket in it
    shutil.chown(folder, "postgres", "postgres")
    data = folder / "data"

    def run(*argv: str) -> str:
        done = subprocess.run(["runuser", "-u", "postgres", "--", *argv], cwd=folder, text=True,
                              capture_output=True)
        if done.returncode:
            raise RuntimeError(f"PostgreSQL's {Path(argv[0]).name} failed: {done.stderr.strip()}")
        return done.stdout

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=peer", "--encoding=UTF8",
            "--no-sync")
        hba = data / "pg_hba.conf"
        hba.write_text("local attention_mapped all peer map=course\nlocal all all peer\n")
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w", "-t", "60",
            "start", "-o", f"-c listen_addresses='' -k {folder} -c fsync=off")
        try:
            yield folder, lambda sql: run(str(bin_dir / "psql"), "-h", str(folder), "-X", "-q", "-t",
                                          "-v", "ON_ERROR_STOP=1", "-c", sql, "postgres")
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
