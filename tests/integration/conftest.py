"""Integration fixtures: the real local SLURM cluster, and running the real command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
}


def swiftslurm(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run `python -m swiftslurm ARGS` as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "swiftslurm", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The cluster from `scripts/slurm-local.sh up`. CI requires it; elsewhere its absence skips."""
    ok = (
        shutil.which("sinfo") is not None
        and subprocess.run(["bash", str(REPO / "scripts" / "slurm-local.sh"), "status"], capture_output=True).returncode
        == 0
    )
    if not ok:
        if os.environ.get("SWIFTSLURM_REQUIRE_SLURM") == "1":
            pytest.fail("the local SLURM cluster is not up: bash scripts/slurm-local.sh up")
        pytest.skip("no local SLURM cluster (bash scripts/slurm-local.sh up)")


def job_state(job_id: str) -> str:
    out = subprocess.run(
        ["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"], capture_output=True, text=True
    ).stdout.split()
    return out[0].split()[0] if out else "UNKNOWN"


def wait_for_job(job_id: str, timeout_s: float = 600) -> str:
    """Poll sacct until the job reaches a terminal state; return it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        state = job_state(job_id)
        if state in TERMINAL:
            return state
        time.sleep(2)
    subprocess.run(["scancel", job_id])
    raise AssertionError(f"job {job_id} still {job_state(job_id)} after {timeout_s} s")
