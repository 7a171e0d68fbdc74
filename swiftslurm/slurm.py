"""The one seam for SLURM's command-line tools (sbatch, scontrol, squeue, sacct, sinfo, scancel).

Every argv is built here, every answer read here, and SLURM's time grammar parsed here (parse_time). A command
that fails because the controller could not answer for a moment (busy, restarting, unreachable) is asked again
a few times with back-off, within a bounded time (Retry). What still fails raises a typed error naming the
command and what SLURM said (errors.py): JobGone when the controller does not know the job, SlurmUnavailable
when it never answered, SlurmError for anything else.

The one process this module starts is `start_process`, called through the module attribute `runner`; unit tests
replace `runner` (and `sleep`, `clock`) with fakes, so they never reach a SLURM command.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from swiftslurm.errors import JobGone, SlurmError, SlurmUnavailable

TIMED_OUT = 124  # the exit status an Answer carries when the command did not answer in time (as timeout(1))

# What SLURM (or `_ask`, for a timeout) says when the controller could not answer for a moment: asked again.
TRANSIENT = (
    "socket timed out",
    "unable to contact slurm controller",
    "resource temporarily unavailable",
    "zero bytes were transmitted or received",
    "connection refused",
    "connection timed out",
    "communication connection failure",
    "slurm backup controller in standby mode",
    "did not answer within",
    "try again later",  # "Job can not be altered now, try again later": the job is between states
)
# What SLURM says when its controller does not know the job (ended and purged after MinJobAge, or never there).
JOB_GONE = "invalid job id"
# scancel's word for a job that has already ended: nothing left to cancel.
ALREADY_ENDED = "already"
# What `scontrol requeue` says of a job that is pending again (not "Job is no longer pending execution").
ALREADY_PENDING = "job is pending execution"


@dataclass(frozen=True)
class Answer:
    """What one run of a SLURM command left: its exit status and its output."""

    returncode: int
    stdout: str = ""
    stderr: str = ""

    @property
    def said(self) -> str:
        """SLURM's own words about a failure (stderr, else stdout, else the exit status)."""
        return self.stderr.strip() or self.stdout.strip() or f"exit status {self.returncode}"


Runner = Callable[[Sequence[str], float], Answer]


@dataclass(frozen=True)
class Retry:
    """How a SLURM command is asked, and asked again after a transient controller error."""

    timeout_s: float = 30.0  # one try's answer; a healthy slurmctld answers within a second
    tries: int = 3  # in all, the first one included
    first_pause_s: float = 2.0  # before the second try; doubled before each further one
    budget_s: float = 60.0  # all tries and pauses together; each try's timeout is cut to what is left of it

    def pause_after(self, tried: int) -> float:
        return self.first_pause_s * 2 ** (tried - 1)


RETRY = Retry()
# sbatch is asked once: a submission whose answer was lost may have been accepted, and a second one would run
# the job twice (sbatch waits and asks again by itself while the controller is busy).
ONCE = Retry(tries=1)


def start_process(argv: Sequence[str], timeout_s: float) -> Answer:
    """Run one SLURM command: the only process this module starts. Raises FileNotFoundError when it is not on
    PATH, TimeoutError when it has not answered within ``timeout_s``."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as err:
        raise TimeoutError(f"{argv[0]} did not answer within {timeout_s:g} s") from err
    return Answer(done.returncode, done.stdout, done.stderr)


runner: Runner = start_process
sleep: Callable[[float], None] = time.sleep
clock: Callable[[], float] = time.monotonic


def run(argv: list[str], retry: Retry = RETRY) -> str:
    """Run a SLURM command and return its stdout. A transient controller error is asked again (``retry``);
    a failure raises JobGone, SlurmUnavailable or SlurmError, each naming the command and what SLURM said."""
    started, tried = clock(), 0
    while True:
        tried += 1
        answer = _ask(argv, max(1.0, min(retry.timeout_s, retry.budget_s - (clock() - started))))
        if answer.returncode == 0:
            return answer.stdout
        spent, pause = clock() - started, retry.pause_after(tried)
        if not is_transient(answer.said) or tried >= retry.tries or spent + pause >= retry.budget_s:
            raise _failure(argv, answer.said, tried, spent)
        sleep(pause)


def is_transient(said: str) -> bool:
    """Whether SLURM's answer says its controller could not answer for a moment (then it is asked again)."""
    return any(words in said.lower() for words in TRANSIENT)


def _ask(argv: list[str], timeout_s: float) -> Answer:
    try:
        return runner(argv, timeout_s)
    except TimeoutError:
        return Answer(TIMED_OUT, stderr=f"did not answer within {timeout_s:g} s: is slurmctld up?")
    except FileNotFoundError as err:
        raise SlurmError(
            f"`{argv[0]}` is not on PATH: this machine is not a SLURM login node. HINT: run swiftslurm where "
            "`sinfo` works, or drop +cluster=... to train on this machine.",
            tuple(argv),
            str(err),
        ) from err
    except OSError as err:
        raise SlurmError(f"`{_shown(argv)}` could not be started: {err}", tuple(argv), str(err)) from err


def _failure(argv: list[str], said: str, tried: int, spent: float) -> SlurmError:
    """The typed error for a SLURM command that failed for good: the one place that tells a job gone and a
    controller that never answered from any other failure."""
    command, lower = _shown(argv), said.lower()
    if JOB_GONE in lower or (argv[0] == "scancel" and ALREADY_ENDED in lower):
        return JobGone(f"`{command}` failed: {said}", tuple(argv), said, tried)
    if is_transient(said):
        times = "once" if tried == 1 else f"{tried} times in {spent:.0f} s"
        message = f"`{command}` failed ({times}): {said}. HINT: is slurmctld up? `scontrol ping` says; try again."
        return SlurmUnavailable(message, tuple(argv), said, tried)
    return SlurmError(f"`{command}` failed: {said}", tuple(argv), said, tried)


def _shown(argv: Sequence[str]) -> str:
    return " ".join(argv)


# --- SLURM's time grammar -------------------------------------------------------------------------------------

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
NO_LIMIT = ("UNLIMITED", "INFINITE")  # SLURM's spellings of "no time limit" (any case)
TIME_FORMS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"


def parse_time(text: str) -> int | None:
    """A SLURM time (sbatch's --time, scontrol's TimeLimit) in seconds; None for no limit (UNLIMITED,
    INFINITE). SLURM's forms: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS: a bare number is minutes, and
    with a day the first number after the dash is hours. Raises ValueError for anything else."""
    text = str(text).strip()
    if text.upper() in NO_LIMIT:
        return None
    match = _TIME.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a SLURM time ({TIME_FORMS})")
    days, first, second, third = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        return int(days) * 86400 + int(first) * 3600 + int(second or 0) * 60 + int(third or 0)
    if third is not None:  # HH:MM:SS
        return int(first) * 3600 + int(second) * 60 + int(third)
    return int(first) * 60 + int(second or 0)  # MM[:SS]


def _timestamp(value: str) -> float | None:
    """scontrol's or sacct's local ISO time (whole seconds) in seconds since the epoch; None for "Unknown",
    "None" and anything else that is not a time."""
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


# --- jobs -----------------------------------------------------------------------------------------------------


def submit_batch(script: Path) -> str:
    """Submit a batch script; returns the job id (asked once: ONCE says why)."""
    return run(["sbatch", "--parsable", str(script)], ONCE).strip().split(";")[0]


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job -o`'s KEY=VALUE fields of one job (times in the controller's local time)."""
    return dict(re.findall(r"(\w+)=(\S+)", run(["scontrol", "show", "job", "-o", job_id])))


@dataclass(frozen=True)
class JobTimes:
    """When SLURM ends a job, in seconds since the epoch (None: SLURM sets no such end)."""

    limit_ends: float | None  # StartTime + TimeLimit: the time limit (a preemption does not move it)
    kill_at: float | None  # EndTime: when SLURM ends it as things stand (a preemption moves it to its grace's end)


def job_times(job_id: str) -> JobTimes:
    """When this job's time limit ends and when SLURM ends it, from one `scontrol show job`. They differ once
    the job is preempted: taking EndTime for the limit would make every preemption look like a time-out."""
    fields = job_fields(job_id)
    start, limit = _timestamp(fields.get("StartTime", "Unknown")), _time_limit(job_id, fields)
    ends = None if start is None or limit is None else start + limit
    return JobTimes(limit_ends=ends, kill_at=_timestamp(fields.get("EndTime", "Unknown")))


def _time_limit(job_id: str, fields: Mapping[str, str]) -> int | None:
    """The job's TimeLimit in seconds (None: none, or the partition's, which scontrol does not print)."""
    text = fields.get("TimeLimit", "UNLIMITED")
    if text in ("Partition_Limit", "NONE"):
        return None
    try:
        return parse_time(text)
    except ValueError as err:
        raise SlurmError(f"`scontrol show job {job_id}` printed TimeLimit={text}: {err}", said=text) from err


def job_start(job_id: str) -> str:
    """When SLURM started this job (its StartTime, as scontrol prints it): with the id, it names one run of
    the job; a requeue starts it anew, and a wiped cluster that hands out the id again starts it later."""
    return job_fields(job_id).get("StartTime", "Unknown")


def job_alive(job_id: str) -> bool:
    """Whether SLURM still holds this job: running, ending, or waiting to run (again, after a requeue).
    False once it has left the queue or SLURM never heard of it (job ids restart on a wiped cluster)."""
    try:
        return bool(run(["squeue", "-h", "-j", job_id, "-o", "%T"]).split())
    except JobGone:
        return False


# One argument of a command line holds at most 128 KiB on Linux (MAX_ARG_STRLEN). A job list longer than this is
# asked in several calls; 10,000 job ids of 8 digits (a folder of a few thousand runs) still fit in one.
JOB_LIST_CHARS = 100_000


def job_lists(job_ids: Sequence[str], limit: int = JOB_LIST_CHARS) -> list[str]:
    """The comma-separated lists that name these jobs for `-j`, as few as fit ``limit`` characters each."""
    lists: list[list[str]] = []
    length = limit + 1
    for job in job_ids:
        if length + 1 + len(job) > limit:
            lists.append([])
            length = -1
        lists[-1].append(job)
        length += 1 + len(job)
    return [",".join(jobs) for jobs in lists]


def queue_states(job_ids: Sequence[str], retry: Retry = RETRY) -> dict[str, str]:
    """squeue's state of each of these jobs still in the queue (PENDING, RUNNING, ...); the others are absent.
    One squeue for all of them (job_lists), each array task on its own line (`-r`: a pending array's tasks
    would otherwise be printed as one `12_[3-9]`)."""
    states: dict[str, str] = {}
    for jobs in job_lists(job_ids):
        try:
            out = run(["squeue", "-h", "-r", "-j", jobs, "-o", "%i %T"], retry)
        except JobGone:
            continue
        states |= dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)
    return states


def pending_queue(partition: str | None, retry: Retry = RETRY) -> list[tuple[str, str]]:
    """The partition's pending jobs, next to start first (squeue's priority order): (job id, SLURM's reason)."""
    where = ["-p", partition] if partition else []
    out = run(["squeue", "-h", "-t", "PENDING", *where, "--sort=-p,i", "-o", "%i|%r"], retry)
    return [(job, reason) for job, _, reason in (line.partition("|") for line in out.splitlines()) if job]


def accounted_states(job_ids: Sequence[str], retry: Retry = RETRY) -> dict[str, str]:
    """sacct's state of each of these jobs' latest run (COMPLETED, FAILED, CANCELLED, ...)."""
    out = "\n".join(
        run(["sacct", "-X", "-n", "-P", "-j", jobs, "-o", "JobID,State"], retry) for jobs in job_lists(job_ids)
    )
    states = {}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        if job and state:
            states[job] = state.split()[0]  # "CANCELLED by 0" -> CANCELLED
    return states


JOB_RUN_FIELDS = ("JobID", "JobIDRaw", "State", "Submit", "Start", "End", "AllocNodes")


def job_runs(job_ids: list[str], retry: Retry = RETRY) -> list[dict[str, Any]]:
    """Every run of these jobs in SLURM's accounting, oldest first: `sacct --duplicates` gives a requeued job
    one row per run. Each: job_id (sacct's JobID: `<array>_<i>` for an array task), raw_id (JobIDRaw: the id
    SLURM_JOB_ID gives inside the job, the same as job_id but for an array task), state, submit/start/end in
    seconds since the epoch (None: not yet), nodes. A job may be asked for by either id."""
    rows = []
    for jobs in job_lists(job_ids):
        argv = ["sacct", "-D", "-X", "-n", "-P", "-j", jobs, "-o", ",".join(JOB_RUN_FIELDS)]
        rows += [line.split("|") for line in run(argv, retry).splitlines()]
    return [_job_run(row) for row in rows if len(row) == len(JOB_RUN_FIELDS)]


def _job_run(row: list[str]) -> dict[str, Any]:
    job, raw, state, submit, start, end, nodes = row
    return {
        "job_id": job,
        "raw_id": raw or job,
        "state": state.split()[0] if state else "",  # "CANCELLED by 0" -> CANCELLED
        "submit": _timestamp(submit),
        "start": _timestamp(start),
        "end": _timestamp(end),
        "nodes": int(nodes) if nodes.isdigit() else 0,
    }


def requeue(job_id: str) -> None:
    """Put the job back in the queue under the same id, asked again like any command (RETRY) while the controller
    does not answer: a mass preemption keeps slurmctld busy. A requeue is idempotent: a try that timed out here
    may have been carried out by the controller, and the next one then finds the job pending again, which counts
    as requeued (as does SLURM requeueing it itself, after a node failure). Raises SlurmError when it failed."""
    try:
        run(["scontrol", "requeue", job_id])
    except SlurmError as err:
        if ALREADY_PENDING not in err.said.lower():
            raise


def update_job(job_id: str, fields: Mapping[str, str]) -> None:
    """`scontrol update JobId=... KEY=VALUE ...` (an empty value clears the field, e.g. ExcNodeList=)."""
    run(["scontrol", "update", f"JobId={job_id}", *(f"{key}={value}" for key, value in fields.items())])


def cancel(job_ids: Sequence[str], signal: str | None = None) -> None:
    """scancel these jobs (with ``signal``: only send it, e.g. USR2 to save first). Jobs that ended meanwhile
    are fine: nothing is left to cancel."""
    argv = ["scancel", *([f"--signal={signal}"] if signal else []), *job_ids]
    with contextlib.suppress(JobGone):
        run(argv)


# --- nodes and partitions -------------------------------------------------------------------------------------

# `scontrol show hostnames` parses the list itself and asks no controller: one try, briefly, since its caller has
# an expansion of its own to fall back on.
HOSTNAMES = Retry(timeout_s=10.0, tries=1, budget_s=10.0)


def hostnames(nodelist: str, retry: Retry = HOSTNAMES) -> list[str]:
    """SLURM's own expansion of a host list (`scontrol show hostnames`): SLURM's order, its duplicates kept.
    Raises SlurmError when scontrol is missing or fails, and when it prints no host: it exits 0 for a list it
    refuses, saying "Invalid hostlist" on stderr only."""
    argv = ["scontrol", "show", "hostnames", nodelist]
    hosts = run(argv, retry).split()
    if not hosts:
        raise SlurmError(f"`{_shown(argv)}` printed no host: SLURM refuses the list", tuple(argv), "no host")
    return hosts


def partitions() -> set[str]:
    """Names of the partitions this cluster has (the default one is marked '*' by sinfo; stripped)."""
    return {line.strip().rstrip("*") for line in run(["sinfo", "-h", "-o", "%P"]).splitlines() if line.strip()}


def node_states(hosts: list[str]) -> dict[str, str]:
    """SLURM's state of each of these nodes ("ALLOCATED", "IDLE+NOT_RESPONDING", "DOWN+DRAIN", ...)."""
    out = run(["scontrol", "show", "node", "-o", ",".join(hosts)])
    states = {}
    for line in out.splitlines():
        fields = dict(re.findall(r"(\w+)=(\S+)", line))
        if "NodeName" in fields:
            states[fields["NodeName"]] = fields.get("State", "UNKNOWN")
    return states


# Preflight asks these on every node within its own timeout: briefly, twice at most.
PREFLIGHT = Retry(timeout_s=10.0, tries=2, first_pause_s=1.0, budget_s=20.0)


def client_version(retry: Retry = PREFLIGHT) -> str:
    """The version of the `scontrol` on PATH ("22.05.8" of "slurm-wlm 22.05.8"): the client's own, asking no one."""
    words = run(["scontrol", "--version"], retry).split()
    return words[-1] if words else ""


def node_version(node: str, retry: Retry = PREFLIGHT) -> str:
    """The version of the slurmd on ``node``, as slurmctld reports it (`scontrol show node`): asking it proves
    that this client reads slurm.conf, authenticates through munge and speaks the controller's protocol."""
    out = run(["scontrol", "show", "node", "-o", node], retry)
    return dict(re.findall(r"(\w+)=(\S+)", out)).get("Version", "")


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
