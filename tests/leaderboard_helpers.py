"""What the local leaderboard's tests share: whether submissions run in the sandbox here, a way to
run them without it, and how a test finds the processes a submission started by a marker in their
command line (in a PID namespace of their own, the pids they see are not this process's)."""

import contextlib
import os
import random
import signal
from pathlib import Path

import pytest

from nvfp4lib.leaderboard import process

SANDBOXED = process.sandbox(False).command is not None


def marker() -> str:
    """A number no other test's processes carry: `sleep 600.<marker>` names its process."""
    return str(random.randrange(10**8, 10**9))


def running(mark: str) -> list[int]:
    """The pids of the processes (zombies aside) whose command line holds `mark`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and mark.encode() in (entry / "cmdline").read_bytes() and (
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def kill_marked(mark: str) -> None:
    """End what a test's submission left running (without a sandbox, what left its session outlives it)."""
    for pid in running(mark):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


needs_bwrap = pytest.mark.skipif(not SANDBOXED, reason="needs bubblewrap (bwrap), which CI installs")


@pytest.fixture
def no_sandbox(monkeypatch):
    """Submissions run without bubblewrap, as where it cannot run."""
    monkeypatch.setenv(process.BWRAP_ENV_VAR, "off")
    process.sandbox.cache_clear()
    yield
    process.sandbox.cache_clear()
