"""Feedback on long steps (swiftslurm/ops/follow.py): `logs` on a run without logs says why, ms-swift's argument dump
is folded, `logs -f` announces each attempt and the run's end, a closed pipe ends `logs` quietly, a `wait=true`
sweep prints a line per state change, node 0's preflight verdict lands in the log `logs` shows.

Run dirs are fixtures written through swiftslurm/rundir/records.py; where a run changes while it is followed, the
follower's pause hands control to the test (Lockstep), so each change lands between two passes in a fixed order.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.unit.test_follow import log, make_run

ROOT = Path(__file__).resolve().parents[2]


def test_logs_into_a_closed_pipe_exits_quietly(tmp_path: Path) -> None:
    run_dir = make_run(tmp_path / "run")
    log(run_dir, "7", *(f"line {i}" for i in range(50_000)))  # far more than a pipe holds: the writer blocks
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "swiftslurm", "logs", str(run_dir)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == "[7/node0] line 0\n"
    proc.stdout.close()  # what `| head -1` does once it has its line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == ""


def test_a_sweep_does_not_print_hydras_launching_jobs_locally(tmp_path: Path) -> None:
    """swiftslurm's sweeper plans and submits the points itself: Hydra's BasicLauncher (which logged
    "Launching N jobs locally" for SLURM jobs) is never called."""
    argv = [sys.executable, "-m", "swiftslurm", "-m", "+cluster=local-slurm", "seed=1,2", "dry_run=true"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SWIFTSLURM_RUNS": str(tmp_path / "runs")}
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("Nothing submitted (dry_run=true)") == 2 and "Launching" not in done.stdout + done.stderr
