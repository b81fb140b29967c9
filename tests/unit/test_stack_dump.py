"""``kill -USR1`` makes a ``blackbox`` command print every thread's stack and go on."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from agent_blackbox.cli.main import main

_PROGRAM = """
import os, signal, sys, threading
from click.testing import CliRunner
from agent_blackbox.cli.main import main

# The root group registers the dump whichever command runs (here only --help's).
assert CliRunner().invoke(main, ["stack", "--help"]).exit_code == 0
waiting = threading.Event()
threading.Thread(target=waiting.wait, name="a-waiting-thread", daemon=True).start()
os.kill(os.getpid(), signal.SIGUSR1)
print("still running")
waiting.set()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="no SIGUSR1")
def test_sigusr1_prints_every_threads_stack_and_the_command_goes_on() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "still running"
    assert done.stderr.count("most recent call first") >= 2, done.stderr
    assert "in wait" in done.stderr  # the waiting thread's frame


def test_a_command_runs_where_stderr_is_no_file() -> None:
    """A test runner's stderr has no file descriptor: the command still runs."""
    assert CliRunner().invoke(main, ["stack", "--help"]).exit_code == 0
