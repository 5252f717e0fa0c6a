"""The guard of tests/conftest.py: an unmarked test that starts a process fails and says how
to fix it (so `make test-fast` stays in process); finalizing a fixture may stop or clean up
with a command (a session fixture of a marked test is finalized after whichever test ran last)."""
from __future__ import annotations

import subprocess

import pytest


def test_an_unmarked_test_may_start_no_process():
    with pytest.raises(RuntimeError, match="carries none of the markers kernel, browser, cluster, hub"):
        subprocess.run(["true"], check=True)


@pytest.mark.kernel
def test_a_marked_test_may():
    subprocess.run(["true"], check=True)


@pytest.fixture
def cleans_up_with_a_command():
    yield
    subprocess.run(["true"], check=True)


def test_a_fixture_may_clean_up_with_a_command(cleans_up_with_a_command):
    pass
