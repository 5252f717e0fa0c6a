"""The gradebook on PostgreSQL for a grading account of any name (docs/deploying.md,
"Gradebook on PostgreSQL, for any account name"): peer authentication over the local
socket, a role named after the account, a URL that names no user, so that no password is
stored anywhere; and a role of another name through pg_ident.conf's map. nbgrader's own
Gradebook opens it as the real Linux account; another account is refused.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from postgres import peer_server

pytestmark = pytest.mark.cluster

VENV_BIN = Path(sys.prefix) / "bin"
# what the grading account's tools do with the gradebook URL: nbgrader's Gradebook, which
# runs alembic (from PATH) to set the schema up
OPEN = """
import sys
import sqlalchemy
from nbgrader.api import Gradebook
url = sys.argv[1]
with Gradebook(url) as gradebook:
    gradebook.update_or_create_student("kim")
    print(sorted(s.id for s in gradebook.students))
with sqlalchemy.create_engine(url).connect() as connection:
    print(connection.execute(sqlalchemy.text("select current_user")).scalar())
"""


def _open(accounts, user: str, url: str, check: bool = True):
    argv = ["env", f"PATH={VENV_BIN}:/usr/bin:/bin", sys.executable, "-c", OPEN, url]
    if check:
        return accounts.run(user, *argv, python=True).stdout.split("\n")
    try:
        accounts.run(user, *argv, python=True)
    except AssertionError as refused:
        return str(refused)
    raise AssertionError(f"{user} opened {url}")


def test_a_grading_account_of_any_name_opens_its_gradebook_by_peer_authentication(accounts):
    grader, student = "afs_pg_lee", "afs_pg_kai"  # no account named "grader"
    accounts.add(grader, student)
    try:
        with peer_server() as (socket, psql):
            psql(f'create role "{grader}" login')
            psql(f'create database attention_course owner "{grader}"')
            url = f"postgresql:///attention_course?host={socket}"
            students, role = _open(accounts, grader, url)[:2]
            assert students == "['kim']" and role == grader
            # a student's account has no role: the same URL is refused
            assert f'role "{student}" does not exist' in _open(accounts, student, url, check=False)
    finally:
        accounts.remove(grader, student)


def test_a_role_of_another_name_through_pg_ident_map(accounts):
    grader = "afs_pg_ada"
    accounts.add(grader)
    try:
        with peer_server() as (socket, psql):
            psql("create role attention_grader login")
            psql("create database attention_mapped owner attention_grader")
            data = socket / "data"
            (data / "pg_ident.conf").write_text(f"course {grader} attention_grader\n")
            psql("select pg_reload_conf()")
            url = f"postgresql://attention_grader@/attention_mapped?host={socket}"
            students, role = _open(accounts, grader, url)[:2]
            assert students == "['kim']" and role == "attention_grader"
    finally:
        accounts.remove(grader)
