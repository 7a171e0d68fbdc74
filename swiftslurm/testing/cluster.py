"""Runs on the local SLURM cluster as the tests watch them: submit, the job's state, the run's attempts, logs and
status, its training processes, and waits that never outlast what they wait for.

Every wait here ends one of three ways: what it waits for happened; it can no longer happen (the run has ended,
or its job has left SLURM for good: `RunOver`, or None where a caller handles that); or its time is up
(`TimedOut`). A wait is given what can end it as ``over``: a function that says why the run can no longer go
on (`run_over`), or None while it can.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from swiftslurm.rundir.records import read_attempt_rows, read_status
from swiftslurm.slurm_env import expand_hostlist
from swiftslurm.testing.cli import swiftslurm

T = TypeVar("T")
Over = Callable[[], "str | None"]  # why the run can no longer go on, or None while it can

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL"}
RUN_ENDED = {"finished", "failed", "cancelled"}  # status.json states after which no attempt comes
STEP_LINE = re.compile(r"'global_step/max_steps': '(\d+)/(\d+)'")
EXEC_LINE = "[swiftslurm] exec: "
FAST_RETRIES = ("resilience.backoff_base_s=1", "resilience.max_consecutive_failures=20")  # plan overrides
JOB_GRACE_S = 60.0  # a requeued job passes through states that look final: only this long in them is an end


class TimedOut(AssertionError):
    """A wait ran out of time."""


class RunOver(AssertionError):
    """What a wait was for can no longer happen: the run ended, or its job did, first."""


def wait_until(
    probe: Callable[[], T | None], timeout_s: float, what: str, poll_s: float = 0.5, over: Over | None = None
) -> T:
    """Poll ``probe`` until it returns something truthy, and return that. ``over`` is asked before each probe,
    so a probe that succeeds after the run ended (its last attempt, its record) still counts."""
    deadline = time.monotonic() + timeout_s
    while True:
        why_over = over() if over is not None else None
        value = probe()
        if value:
            return value
        if why_over:
            raise RunOver(f"{what}: cannot happen any more ({why_over})")
        if time.monotonic() > deadline:
            raise TimedOut(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


# ---------------------------------------------------------------- SLURM


def submit(run_dir: Path, *overrides: str) -> str:
    """Submit a run on the local cluster without waiting; return its SLURM job id."""
    done = swiftslurm("+cluster=local-slurm", f"run_dir={run_dir}", *overrides, cwd=run_dir.parent, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    match = re.search(r"submitted job (\d+)", done.stdout)
    assert match, done.stdout
    return match.group(1)


def job_state(job_id: str) -> str:
    """The state sacct gives the job's newest run ("UNKNOWN" while sacct has no row). Its last row: a job SLURM
    resized (`--no-kill`, a node lost) has a RESIZING row before it."""
    out = subprocess.run(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"], capture_output=True, text=True)
    states = out.stdout.splitlines()
    return states[-1].split()[0] if states else "UNKNOWN"


def queue_state(job_id: str) -> str | None:
    """The job's state as slurmctld has it now (PENDING, RUNNING, COMPLETED, ...); None once it left the queue."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.split()
    return out[0] if out else None


def final_state(job_id: str) -> str | None:
    """sacct's state if the job looks ended to both the queue and sacct now, else None."""
    queued, state = queue_state(job_id), job_state(job_id)
    return state if state in TERMINAL and (queued is None or queued in TERMINAL) else None


def wait_for_job(job_id: str, timeout_s: float = 600) -> str:
    """Poll sacct until the job reaches a terminal state; return it (scancel it if it does not in time)."""

    def terminal() -> str | None:
        state = job_state(job_id)
        return state if state in TERMINAL else None

    try:
        return wait_until(terminal, timeout_s, f"job {job_id}", poll_s=2)
    except TimedOut:
        subprocess.run(["scancel", job_id])
        raise TimedOut(f"job {job_id} still {job_state(job_id)} after {timeout_s:.0f} s (cancelled)") from None


def cancel_if_active(job_id: str) -> None:
    """scancel a job that is still pending, running or requeued (a test that failed must not leave it behind)."""
    queued = queue_state(job_id)
    if queued is not None and queued not in TERMINAL:
        subprocess.run(["scancel", job_id], capture_output=True)


def job_hosts(job_id: str) -> list[str]:
    """The nodes the job runs on now, first (the batch host, node 0) first."""
    nodelist = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True).stdout
    return hosts_of(nodelist.strip())


def hosts_of(nodelist: str) -> list[str]:
    return [] if not nodelist or nodelist == "None assigned" else expand_hostlist(nodelist)


def job_instances(job_id: str) -> list[tuple[str, list[str]]]:
    """(state, nodes) of every run of the job, requeued ones included, oldest first (sacct --duplicates)."""
    argv = ["sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", "State,NodeList"]
    out = subprocess.run(argv, capture_output=True, text=True).stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return [(state.split()[0], hosts_of(nodes)) for state, nodes in rows]


def preempt(job_id: str, timeout_s: float = 120) -> None:
    """`scancel --signal=USR2`: what SLURM sends ahead of a preemption; asked again while slurmctld does not answer
    (another soak process froze it), an error only once ``timeout_s`` has passed."""
    argv = ["scancel", "--signal=USR2", job_id]
    deadline = time.monotonic() + timeout_s
    while (done := subprocess.run(argv, capture_output=True, text=True)).returncode != 0:
        if "timed out" not in done.stderr or time.monotonic() > deadline:
            raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
        time.sleep(1)


# ---------------------------------------------------------------- the run's end


@dataclass
class RunEnd:
    """Says why a run can no longer go on: its status.json says it ended, or (given its job) SLURM has shown
    the job ended for ``grace_s`` without the run saying so (killed and not requeued). Use it as ``over``."""

    run_dir: Path
    job_id: str | None = None
    grace_s: float = JOB_GRACE_S
    job_final: Callable[[str], str | None] = final_state  # SLURM's word; a fake in unit tests
    _final_since: float | None = field(default=None, init=False)

    def __call__(self) -> str | None:
        state = run_state(self.run_dir)
        if state in RUN_ENDED:
            return f"the run has ended: status.json says {state}"
        if self.job_id is None:
            return None
        final = self.job_final(self.job_id)
        if final is None:
            self._final_since = None
            return None
        self._final_since = self._final_since or time.monotonic()
        if time.monotonic() - self._final_since < self.grace_s:
            return None
        return f"job {self.job_id} has been {final} for {self.grace_s:.0f} s without the run saying it ended"


def run_over(run_dir: Path, job_id: str | None = None) -> Over:
    return RunEnd(run_dir, job_id)


def wait_for_run_end(run_dir: Path, job_id: str, timeout_s: float = 600) -> str:
    """The job's final state (sacct) once the run has ended and SLURM agrees; or once SLURM has shown the job
    ended for a minute without the run saying so. A requeued job passes through states that look final
    (REQUEUED, NODE_FAIL), so the queue and the run's own status.json decide too."""
    gone_since: list[float] = []
    ended = RunEnd(run_dir, job_id)

    def final() -> str | None:
        queued, state = queue_state(job_id), job_state(job_id)
        gone_since[:] = (gone_since or [time.monotonic()]) if queued is None and state == "UNKNOWN" else []
        assert not gone_since or time.monotonic() - gone_since[0] < 60, (
            f"job {job_id} is gone from squeue and sacct: was the cluster restarted (slurm-local.sh up) meanwhile?"
        )
        slurm_final = state in TERMINAL and (queued is None or queued in TERMINAL)
        return state if slurm_final and ended() else None

    return wait_until(final, timeout_s, f"job {job_id} ({run_dir}) to end", poll_s=2)


# ---------------------------------------------------------------- the run dir


def attempts(run_dir: Path) -> list[dict[str, Any]]:
    """The run's attempt records as attempts.jsonl holds them (the keys on disk, amendments folded in), oldest
    first."""
    return read_attempt_rows(run_dir)


def status(run_dir: Path) -> dict[str, Any]:
    """status.json ({} before the wrapper wrote it)."""
    return read_status(run_dir) or {}


def run_state(run_dir: Path) -> str | None:
    return status(run_dir).get("state")


def recorded_attempts(run_dir: Path) -> set[str]:
    return {record["attempt"] for record in attempts(run_dir)}


ATTEMPT_ORDER = re.compile(r"^\d+(?:\.r(\d+))?(?:\.i(\d+))?$")


def attempt_ids(run_dir: Path) -> list[str]:
    """The attempts that have a log folder, oldest first: '<job>', '<job>.i1' (restarted in place),
    '<job>.r1' (requeued), '<job>.r1.i1', ..."""
    logs = run_dir / "logs"
    names = [p.name for p in logs.iterdir() if p.is_dir() and ATTEMPT_ORDER.match(p.name)] if logs.is_dir() else []
    return sorted(names, key=lambda name: tuple(int(n or 0) for n in ATTEMPT_ORDER.match(name).groups()))  # type: ignore[union-attr]


def node_log(run_dir: Path, attempt: str, node: int) -> str:
    try:
        return (run_dir / "logs" / attempt / f"node{node}.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def exec_line(run_dir: Path, attempt: str, node: int) -> str | None:
    """The command line the node's wrapper started ms-swift with (written once it chose the resume point)."""
    return next((line for line in node_log(run_dir, attempt, node).splitlines() if line.startswith(EXEC_LINE)), None)


def logged_step(run_dir: Path, attempt: str) -> int:
    """The newest training step node 0 has logged in this attempt (ms-swift logs every `logging_steps`)."""
    steps = STEP_LINE.findall(node_log(run_dir, attempt, 0))
    return int(steps[-1][0]) if steps else 0


def current_step(run_dir: Path) -> int:
    """The newest training step any attempt's node 0 has logged."""
    logs = run_dir.glob("logs/*/node0.log")
    return max((int(m[0]) for log in logs for m in STEP_LINE.findall(log.read_text(errors="replace"))), default=0)


def next_attempt(
    run_dir: Path, known: list[str], timeout_s: float = 900, over: Over | None = None, nodes: int = 2
) -> str | None:
    """The oldest attempt not in ``known`` whose ``nodes`` nodes have all started ms-swift, once they have; None
    once the run has ended without one (``over``: the run's status.json by default)."""

    def started() -> str | None:
        new = [a for a in attempt_ids(run_dir) if a not in known]
        return next((a for a in new if all(exec_line(run_dir, a, node) for node in range(nodes))), None)

    try:
        return wait_until(
            started, timeout_s, f"a new attempt of {run_dir} (known: {known})", over=over or run_over(run_dir)
        )
    except RunOver as ended:
        print(f"no attempt after {known[-1] if known else 'none'}: {ended}", flush=True)
        return None


def wait_for_training(run_dir: Path, attempt: str, timeout_s: float = 300) -> bool:
    """Wait until the attempt logs a training step (True), or ends before that (False: e.g. another test's
    urgent job preempted it, or it resumed at the last step)."""

    def trains_or_ended() -> str | None:
        if STEP_LINE.search(node_log(run_dir, attempt, 0)):
            return "trains"
        return "ended" if attempt in recorded_attempts(run_dir) else None

    return wait_until(trains_or_ended, timeout_s, f"attempt {attempt} to train") == "trains"


def preempt_at_steps(run_dir: Path, job_id: str, steps: list[int]) -> None:
    """USR2 (`preempt`) once training passes each step, each time waiting for the preempted attempt's record.
    Raises RunOver if the run ends before a step."""
    over = run_over(run_dir, job_id)
    for step in steps:
        wait_until(lambda s=step: current_step(run_dir) >= s, 300, f"step {step}", over=over)  # type: ignore[misc]
        before = len(attempts(run_dir))
        preempt(job_id)
        wait_until(lambda b=before: len(attempts(run_dir)) > b, 120, "the preempted attempt's record")  # type: ignore[misc]


def describe(record: dict[str, Any]) -> str:
    """One attempt record in a line, with its start-up and total seconds, for the test's output."""

    def since_start(key: str) -> str:
        start, at = record.get("start"), record.get(key)
        return f"{at - start:.0f}s" if isinstance(start, float) and isinstance(at, float) else "-"

    facts = ("hosts", "reason", "decision", "resume_step", "committed_step", "failed_host", "exclude_hosts")
    shown = ", ".join(f"{k}={record.get(k)}" for k in facts)
    return (
        f"{record.get('attempt')}: {shown}, first step {since_start('first_step_at')}, "
        f"ended {since_start('end')}\n    why: {record.get('why')}"
    )


# ---------------------------------------------------------------- training processes


def training_workers(run_dir: Path, started_after: float = 0.0) -> list[tuple[int, int]]:
    """(rank, PID) of the run's ms-swift training processes started after ``started_after`` (epoch seconds),
    rank 0 first. torchrun's command line names sft.py too, so only a process running sft.py as its script
    counts; a DataLoader worker forked from a rank has the rank's command line and environment, so a match whose
    parent matched too is not a rank."""
    output = str(run_dir / "output")
    found: dict[int, tuple[int, int]] = {}  # PID -> (rank, parent PID)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if not any(arg.endswith("swift/cli/sft.py") for arg in argv[1:3]) or output not in argv:
                continue
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if _started_at(stat) < started_after:
                continue
            env = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
            rank = next((int(v.split("=", 1)[1]) for v in env if v.startswith("RANK=")), -1)
            found[int(entry.name)] = (rank, int(stat[1]))
    return sorted((rank, pid) for pid, (rank, parent) in found.items() if parent not in found)


def _started_at(stat_after_name: list[str]) -> float:
    """A process's start as epoch seconds, from the fields of /proc/PID/stat after its name (field 22: clock
    ticks since boot)."""
    booted = time.time() - time.clock_gettime(time.CLOCK_BOOTTIME)
    return booted + int(stat_after_name[19]) / os.sysconf("SC_CLK_TCK")


def previous_attempt_end(run_dir: Path, attempt: str) -> float:
    """When the newest recorded attempt other than ``attempt`` ended (epoch seconds; 0 if none has)."""
    return max((float(r.get("end") or 0) for r in attempts(run_dir) if r.get("attempt") != attempt), default=0.0)


def workers_of(run_dir: Path, attempt: str, count: int = 2) -> list[int]:
    """PIDs of the attempt's ``count`` training workers, rank 0 first; [] if the attempt ended first. A worker of
    an earlier attempt still exiting is not one: only processes started after that attempt's end count."""
    since = previous_attempt_end(run_dir, attempt)

    def found() -> list[int] | str | None:
        pids = [pid for _, pid in training_workers(run_dir, since)]
        return pids if len(pids) == count else "ended" if attempt in recorded_attempts(run_dir) else None

    pids = wait_until(found, 60, f"the training workers of {attempt}")
    return pids if isinstance(pids, list) else []


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_9(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pids: list[int], timeout_s: float = 30) -> None:
    wait_until(lambda: not any(alive(p) for p in pids), timeout_s, f"PIDs {pids} to die", poll_s=0.1)


# ---------------------------------------------------------------- the cluster's own faults

CLUSTER_STATE = Path(os.environ.get("SWIFTSLURM_SLURM_STATE", "/tmp/swiftslurm-slurm"))  # scripts/slurm-local.sh


def slurmctld_pid() -> int:
    """The local cluster's slurmctld (scripts/slurm-local.sh records every daemon it starts)."""
    return int((CLUSTER_STATE / "pids" / "slurmctld.pid").read_text().split()[0])


@contextlib.contextmanager
def slurmctld_stopped() -> Iterator[None]:
    """slurmctld frozen (SIGSTOP) inside the block: every SLURM command times out, as during a mass preemption
    on a busy controller; it carries on (SIGCONT) after, whatever happened inside."""
    pid = slurmctld_pid()
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def resume_drained_nodes() -> list[str]:
    """Put back the nodes SLURM drained with "Kill task failed": a step ending while slurmctld was frozen cannot
    report its end in time, so slurmd drains its node, which an admin would resume. Returns the nodes resumed."""
    listing = subprocess.run(
        ["sinfo", "-h", "-N", "-t", "drain,drained,draining", "-o", "%N|%E"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    drained = sorted({n for n, _, why in (line.partition("|") for line in listing.splitlines()) if "Kill task" in why})
    for node in drained:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], timeout=30, check=False)
    return drained


def shared_mounts() -> Path:
    """Where a filesystem mounted now is seen by every node of the local cluster (scripts/slurm-local.sh)."""
    return CLUSTER_STATE / "mnt"
