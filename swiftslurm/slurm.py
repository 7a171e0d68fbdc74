"""The one seam for SLURM's command-line tools (sinfo, squeue, sacct, scontrol, scancel)."""

from __future__ import annotations

import re
import shutil
import subprocess
from datetime import datetime
from typing import Any

from swiftslurm.errors import SubmitError

TIMEOUT_S = 30


def run(argv: list[str], timeout_s: float = TIMEOUT_S) -> str:
    """Run a SLURM command and return its stdout; raise SubmitError saying what to fix if it fails."""
    if shutil.which(argv[0]) is None:
        raise SubmitError(
            f"`{argv[0]}` is not on PATH: this machine is not a SLURM login node. HINT: run swiftslurm where "
            "`sinfo` works, or drop +cluster=... to train on this machine."
        )
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as err:
        raise SubmitError(f"`{' '.join(argv)}` did not answer within {timeout_s:g} s: is slurmctld up?") from err
    if done.returncode != 0:
        raise SubmitError(f"`{' '.join(argv)}` failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def partitions() -> set[str]:
    """Names of the partitions this cluster has (the default one is marked '*' by sinfo; stripped)."""
    return {line.strip().rstrip("*") for line in run(["sinfo", "-h", "-o", "%P"]).splitlines() if line.strip()}


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job -o`'s KEY=VALUE fields of one job (times in the controller's local time)."""
    return dict(re.findall(r"(\w+)=(\S+)", run(["scontrol", "show", "job", "-o", job_id])))


def _timestamp(value: str) -> float | None:
    """scontrol's or sacct's local ISO time (whole seconds) in seconds since the epoch; None for "Unknown",
    "None" and anything else that is not a time."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def job_kill_time(job_id: str) -> float | None:
    """When SLURM ends this job as things stand: scontrol's EndTime (a preemption moves it to the end of the
    grace time), in seconds since the epoch, or None when SLURM sets no end."""
    return _timestamp(job_fields(job_id).get("EndTime", "Unknown"))


def job_end_time(job_id: str) -> float | None:
    """When this attempt's time limit ends: StartTime + TimeLimit, in seconds since the epoch, or None
    without a limit. Not scontrol's EndTime: a preemption moves that to the end of the grace time, which
    would make every preemption look like a time-out."""
    fields = job_fields(job_id)
    start, limit = _timestamp(fields.get("StartTime", "Unknown")), limit_seconds(fields.get("TimeLimit", "UNLIMITED"))
    return None if start is None or limit is None else start + limit


def limit_seconds(text: str) -> int | None:
    """SLURM's TimeLimit as printed by scontrol ([D-]HH:MM:SS, MM:SS, UNLIMITED) in seconds."""
    if text in ("UNLIMITED", "Partition_Limit", "NONE"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    hours, minutes, seconds = parts
    return int(days or 0) * 86400 + hours * 3600 + minutes * 60 + seconds


def node_states(hosts: list[str]) -> dict[str, str]:
    """SLURM's state of each of these nodes ("ALLOCATED", "IDLE+NOT_RESPONDING", "DOWN+DRAIN", ...)."""
    out = run(["scontrol", "show", "node", "-o", ",".join(hosts)])
    states = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "NodeName" in fields:
            states[fields["NodeName"]] = fields.get("State", "UNKNOWN")
    return states


def partition_size(partition: str | None) -> int:
    """How many nodes the partition has (the cluster's default partition when None)."""
    rows = [line.split() for line in run(["sinfo", "-h", "-N", "-o", "%N %P"]).splitlines() if line.strip()]
    if partition is None:
        partition = next((p.rstrip("*") for _, p in rows if p.endswith("*")), None)
    return len({node for node, p in rows if p.rstrip("*") == partition})


def partition_node_states(partition: str | None) -> dict[str, str]:
    """SLURM's state of each node of the partition (the cluster's default partition when None), as `sinfo %T`
    prints it ("idle", "mixed", "down*", "drained", ...)."""
    rows = [row for line in run(["sinfo", "-h", "-N", "-o", "%N %P %T"]).splitlines() if len(row := line.split()) == 3]
    if partition is None:
        partition = next((p.rstrip("*") for _, p, _ in rows if p.endswith("*")), None)
    return {node: state for node, p, state in rows if p.rstrip("*") == partition}


def job_alive(job_id: str) -> bool:
    """Whether SLURM still holds this job: running, ending, or waiting to run (again, after a requeue).
    False once it has left the queue or SLURM never heard of it (job ids restart on a wiped cluster)."""
    try:
        out = run(["squeue", "-h", "-j", job_id, "-o", "%T"])
    except SubmitError as err:
        if "Invalid job id" in str(err):
            return False
        raise
    return bool(out.split())


def job_start(job_id: str) -> str:
    """When SLURM started this job (its StartTime, as scontrol prints it): with the id, it names one run of
    the job; a requeue starts it anew, and a wiped cluster that hands out the id again starts it later."""
    return job_fields(job_id).get("StartTime", "Unknown")


JOB_RUN_FIELDS = ("JobID", "State", "Submit", "Start", "End", "AllocNodes")


def job_runs(job_ids: list[str], timeout_s: float = TIMEOUT_S) -> list[dict[str, Any]]:
    """Every run of these jobs in SLURM's accounting, oldest first: `sacct --duplicates` gives a requeued job
    one row per run. Each: job_id, state, submit/start/end in seconds since the epoch (None: not yet), nodes."""
    argv = ["sacct", "-D", "-X", "-n", "-P", "-j", ",".join(job_ids), "-o", ",".join(JOB_RUN_FIELDS)]
    rows = [line.split("|") for line in run(argv, timeout_s).splitlines()]
    return [_job_run(row) for row in rows if len(row) == len(JOB_RUN_FIELDS)]


def _job_run(row: list[str]) -> dict[str, Any]:
    job, state, submit, start, end, nodes = row
    return {
        "job_id": job,
        "state": state.split()[0] if state else "",  # "CANCELLED by 0" -> CANCELLED
        "submit": _timestamp(submit),
        "start": _timestamp(start),
        "end": _timestamp(end),
        "nodes": int(nodes) if nodes.isdigit() else 0,
    }
