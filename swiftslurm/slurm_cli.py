"""The one seam for SLURM's command-line tools (sinfo, squeue, sacct, scontrol, scancel)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from datetime import datetime

from swiftslurm.errors import SubmitError

TIMEOUT_S = 30


def run(argv: list[str]) -> str:
    """Run a SLURM command and return its stdout; raise SubmitError saying what to fix if it fails."""
    if shutil.which(argv[0]) is None:
        raise SubmitError(
            f"`{argv[0]}` is not on PATH: this machine is not a SLURM login node. HINT: run swiftslurm where "
            "`sinfo` works, or drop +cluster=... to train on this machine."
        )
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as err:
        raise SubmitError(f"`{' '.join(argv)}` did not answer within {TIMEOUT_S} s: is slurmctld up?") from err
    if done.returncode != 0:
        raise SubmitError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def partitions() -> set[str]:
    """Names of the partitions this cluster has (the default one is marked '*' by sinfo; stripped)."""
    return {line.strip().rstrip("*") for line in run(["sinfo", "-h", "-o", "%P"]).splitlines() if line.strip()}


def job_end_time(job_id: str) -> float | None:
    """When the job's time limit ends (seconds since the epoch), or None if it has no limit."""
    if os.environ.get("SLURM_JOB_ID") == job_id and os.environ.get("SLURM_JOB_END_TIME", "").isdigit():
        return float(os.environ["SLURM_JOB_END_TIME"])
    match = re.search(r"\bEndTime=(\S+)", run(["scontrol", "show", "job", "-o", job_id]))
    if not match or match.group(1) in ("Unknown", "None"):
        return None
    return datetime.fromisoformat(match.group(1)).timestamp()  # scontrol prints local time
