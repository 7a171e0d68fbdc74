"""A test hook, inert unless SWIFTSLURM_TEST_HOLD_PHASE is set (never set it for a real run): the leader of a
job's first attempt holds at the start of that phase until a stop signal is recorded, so that an integration
test (tests/integration/test_signals.py) sends its signal at exactly that moment, whatever the machine's
speed. Once holding, it creates the file SWIFTSLURM_TEST_HOLD_MARKER names: the test waits for that file."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from swiftslurm.slurm_env import SlurmEnv

HOLD_PHASE = "SWIFTSLURM_TEST_HOLD_PHASE"  # a Phase value of attempt.py: prepare | agree_on_resume
HOLD_MARKER = "SWIFTSLURM_TEST_HOLD_MARKER"  # a path outside the run dir, created once the leader holds
HOLD_MAX_S = 300.0  # a test that never sends its signal fails rather than holding the job for ever
POLL_S = 0.1
_held: set[str] = set()  # once per process, too: an attempt retried in this process (no SLURM) goes on


def hold(phase: str, where: SlurmEnv, stopped: Callable[[], bool], environ: Mapping[str, str] = os.environ) -> None:
    """Hold here while the hook asks for ``phase`` (leader, first attempt) and ``stopped()`` is false."""
    if environ.get(HOLD_PHASE) != phase or where.node_id != 0 or where.restart_count != 0 or phase in _held:
        return
    _held.add(phase)
    Path(environ[HOLD_MARKER]).write_text(f"{phase} {os.getpid()}\n")
    deadline = time.monotonic() + HOLD_MAX_S
    while not stopped() and time.monotonic() < deadline:
        time.sleep(POLL_S)
