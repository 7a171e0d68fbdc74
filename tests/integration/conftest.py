"""Integration fixtures: the real local SLURM cluster, and running the real command line."""

from __future__ import annotations

import json
import os
import re
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


def squeue_state(job: str) -> str:
    """The job's state in the queue ("PENDING", "RUNNING", ...), or "" once it has left it."""
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout
    return out.strip()


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


LONG = ("swift.max_steps=120", "swift.save_steps=50")  # the run whose final adapter the resume tests compare
ADAPTER = "output/checkpoint-120/adapter_model.safetensors"


def attempts(run_dir: Path) -> list[dict]:
    path = run_dir / "attempts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


def current_step(run_dir: Path) -> int:
    """The newest training step any attempt's node 0 has logged."""
    steps = [
        int(m)
        for log in run_dir.glob("logs/*/node0.log")
        for m in re.findall(r"'global_step/max_steps': '(\d+)/", log.read_text(errors="replace"))
    ]
    return max(steps, default=0)


def wait_until(predicate, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def submit(run_dir: Path, *overrides: str) -> str:
    done = swiftslurm("+cluster=local-slurm", f"run_dir={run_dir}", *overrides, cwd=run_dir.parent, timeout=120)
    assert done.returncode == 0, done.stderr
    match = re.search(r"submitted job (\d+)", done.stdout)
    assert match, done.stdout
    return match.group(1)


def preempt_at_steps(run_dir: Path, job: str, steps: list[int]) -> None:
    """`scancel --signal=USR2` (what SLURM sends ahead of a preemption) once training passes each step."""
    for step in steps:
        wait_until(lambda s=step: current_step(run_dir) >= s, 300, f"step {step}")
        before = len(attempts(run_dir))
        subprocess.run(["scancel", "--signal=USR2", job], check=True)
        wait_until(lambda b=before: len(attempts(run_dir)) > b, 120, "the preempted attempt's record")


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: None) -> bytes:
    """The final adapter of a LONG run that is never stopped (same seed, same settings): resumed runs must
    end with these very bytes."""
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *LONG, cwd=run_dir.parent)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return (run_dir / ADAPTER).read_bytes()
