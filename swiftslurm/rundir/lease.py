"""One leader per run: the run directory's lease, its fencing token, and the job run's nonce.

`sbatch RUN_DIR/job.sbatch` twice (or a resubmission while the first job still runs) starts two leaders in
one run dir; both would quarantine, prune and close "lost" attempts in the same output dir. So the leader
takes the lease (rundir.LEASE) before it touches anything. It gets it when the lease is free, already its own
job's (a requeue), or held by a job SLURM no longer holds; otherwise it stops. Liveness is SLURM's word,
never the heartbeat's age (a holder in a long restore writes none): the heartbeat is for people.

Every acquisition raises the fencing token by one. Before each destructive step (quarantine, prune, closing
a lost attempt) the leader checks that the lease still carries its token, so a leader that lost the lease
does nothing destructive. The trainer's retention gets the token through the environment (TOKEN_ENV).

The nonce (`<job id>@<SLURM start time>`) names one run of one job: the leader writes it into resume.json,
and a follower accepts only a resume.json with its own job run's nonce. Job ids restart at 1 on a wiped
cluster, so logs/<attempt>/resume.json may be a stale one from an earlier job with the same id.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import NodeError, SwiftSlurmError
from swiftslurm.rundir.jsonio import read_json, write_json_atomic
from swiftslurm.rundir.layout import lease_file, lease_lock

if TYPE_CHECKING:
    from swiftslurm.slurm_env import SlurmEnv


TOKEN_ENV = "SWIFTSLURM_LEASE_TOKEN"  # set by the wrapper for the trainer: the token its retention checks


class LeaseLost(NodeError):
    """This leader's lease was taken by another job: it must not change the run dir any more."""


@dataclass(frozen=True)
class Lease:
    """The lease this leader holds on ``run_dir``, as of its acquisition."""

    run_dir: Path
    job: str
    token: int

    def holds(self) -> bool:
        """Whether the lease still carries this leader's token (for steps that skip rather than fail)."""
        return holds(self.run_dir, self.token)

    def check(self, step: str) -> None:
        """Call before a destructive step: raise LeaseLost unless this leader still holds the lease; else
        refresh the heartbeat."""
        with _locked(self.run_dir):
            current = read(self.run_dir)
            if current.get("token") != self.token:
                raise LeaseLost(
                    f"job {self.job} lost the lease on {self.run_dir} (token {self.token}) to job "
                    f"{current.get('job')} (token {current.get('token')}); not doing: {step}. Only one job "
                    "leads a run. HINT: let that job finish, or cancel it and requeue this one."
                )
            write_json_atomic(lease_file(self.run_dir), {**current, "heartbeat": round(time.time(), 3)})


def read(run_dir: Path) -> dict[str, Any]:
    """The lease as written ({} when nobody ever held it, or it is unreadable)."""
    return read_json(lease_file(run_dir)) or {}


def holds(run_dir: Path, token: int) -> bool:
    return read(run_dir).get("token") == token


def job_of(where: SlurmEnv) -> str:
    """The job that would hold the lease: the SLURM job id, or this process outside SLURM."""
    return str(where.job_id) if where.in_slurm else f"local-{where.job_id or os.getpid()}"


def acquire(run_dir: Path, where: SlurmEnv, attempt: str, alive: Callable[[str], bool] | None = None) -> Lease | str:
    """Take the lease for this job, or say in one line why not (another job that SLURM still holds leads
    the run). ``alive`` asks SLURM about a job (default: squeue, retried as slurm.RETRY says)."""
    me = job_of(where)
    with _locked(run_dir):
        current = read(run_dir)
        holder = current.get("job")
        if holder and holder != me and (why := _still_leads(holder, alive or slurm_cli.job_alive)):
            return (
                f"job {me} does not lead {run_dir}: {why}; it stops without touching the run. HINT: one job per "
                f"run dir: wait for job {holder}, or `scancel {holder}` first (the run then resumes here)."
            )
        token = int(current.get("token") or 0) + 1
        now = round(time.time(), 3)
        lease = {"job": me, "token": token, "attempt": attempt, "host": socket.gethostname(), "acquired": now}
        write_json_atomic(lease_file(run_dir), {**lease, "heartbeat": now, "previous": holder})
    return Lease(run_dir, me, token)


def led_elsewhere(run_dir: Path, where: SlurmEnv, alive: Callable[[str], bool] | None = None) -> str | None:
    """Why another job leads the run now (None: the lease is free, this job's, or held by a job SLURM no longer
    holds). Read-only, for a job that records without leading: one that takes the lease on its way out would
    stop a resubmission that starts while it is still completing."""
    holder = read(run_dir).get("job")
    if not holder or holder == job_of(where):
        return None
    return _still_leads(holder, alive or slurm_cli.job_alive)


def _still_leads(holder: str, alive: Callable[[str], bool]) -> str | None:
    """Why ``holder`` still leads (None: it no longer does). A job outside SLURM cannot be asked about."""
    if holder.startswith("local-"):
        return None
    try:
        return f"job {holder} holds the lease and SLURM still holds that job" if alive(holder) else None
    except SwiftSlurmError as err:
        return f"job {holder} holds the lease and SLURM could not say whether it still runs ({err})"


def job_alive(job: str) -> bool:
    """Whether SLURM still holds ``job`` (False for a job outside SLURM, which cannot be asked about)."""
    return not job.startswith("local-") and slurm_cli.job_alive(job)


def nonce(where: SlurmEnv) -> str | None:
    """`<job id>@<start time>`: this run of this SLURM job, the same on every node (None outside SLURM,
    where one node is the whole job)."""
    if not where.in_slurm or where.job_id is None:
        return None
    job = where.job_id
    try:
        return f"{job}@{slurm_cli.job_start(job)}"
    except SwiftSlurmError as err:  # then resume.json is taken as before nonces, whoever wrote it
        print(f"[swiftslurm] job {job}: SLURM could not say when it started, so no nonce: {err}", flush=True)
        return None


@contextmanager
def _locked(run_dir: Path) -> Iterator[None]:
    """An exclusive POSIX lock on lease.lock (NFS carries these) while the lease is read and replaced."""
    with open(lease_lock(run_dir), "a") as handle:
        fcntl.lockf(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(handle, fcntl.LOCK_UN)
