"""One leader per run: the run directory's lease, its fencing token, and the job run's nonce.

`sbatch RUN_DIR/job.sbatch` twice (or a resubmission while the first job still runs) starts two leaders in
one run dir; both would quarantine, prune and close "lost" attempts in the same output dir. So the leader
takes the lease before it touches anything. It gets it when the lease is free, already its own job's (a
requeue), or held by a job SLURM no longer holds; otherwise it stops. Liveness is SLURM's word, never the
heartbeat's age (a holder in a long restore writes none): the heartbeat is for people.

The lease is a sequence of generations, `lease/<token>.json`; the newest is the lease, its number the fencing
token. Taking the lease creates the next generation, once and whole (jsonio.create_json_exclusive: link(2),
which the filesystem itself refuses when the name exists, on a local disk, NFS or Lustre alike), so two jobs
that take it at the same moment never get the same token: the one that loses the name reads again and finds
the other leading. Generations are never replaced or removed, so the newest token only grows. No POSIX lock
is involved: on NFS mounted `nolock` or `local_lock=...` and on Lustre `localflock` one binds a single node
only, and on Lustre `noflock` lockf fails (ENOSYS).

Fencing is compare-and-act, not lock-and-act: right before each step that changes the run (quarantine,
prune, closing a lost attempt, recording a phase, each upload, each manifest the trainer writes) the holder
lists the generations afresh and acts only while its own is the newest. The wrapper also checks at every
poll of the trainer and ends it once the lease is gone. The trainer gets the token through the environment
(TOKEN_ENV) and writes it into each manifest. docs/resilience.md, "Fencing", says what this guarantees where.

The nonce (`<job id>@<batch script start>`, exported once per run of the job by its batch script as
SWIFTSLURM_JOB_RUN; `<job id>@<SLURM start time>` from `scontrol show job` for a hand-written script without it)
names one run of one job: the leader writes it into resume.json,
and a follower accepts only a resume.json with its own job run's nonce. Job ids restart at 1 on a wiped
cluster, so logs/<attempt>/resume.json may be a stale one from an earlier job with the same id.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import NodeError, SwiftSlurmError
from swiftslurm.rundir.jsonio import create_json_exclusive, read_json
from swiftslurm.rundir.layout import lease_dir, lease_file, lease_generation

if TYPE_CHECKING:
    from swiftslurm.slurm_env import SlurmEnv


TOKEN_ENV = "SWIFTSLURM_LEASE_TOKEN"  # set by the wrapper for the trainer: the token its commits check
TAKE_TRIES = 5  # a job that loses the race for a generation reads the lease again, at most this often
_GENERATION = re.compile(r"(\d+)\.json")


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

    def lost(self, step: str = "go on leading the run") -> str | None:
        """Why this leader no longer holds the lease, in one line naming ``step`` (None: it still does)."""
        return lost(self.run_dir, self.token, step, self.job)

    def check(self, step: str) -> None:
        """Call right before a step that changes the run: raise LeaseLost unless this leader still holds the
        lease; else refresh the heartbeat."""
        if (why := self.lost(step)) is not None:
            raise LeaseLost(why)
        with contextlib.suppress(OSError):  # the heartbeat is for people: never fail a step for it
            os.utime(lease_generation(self.run_dir, self.token))


def current_token(run_dir: Path) -> int:
    """The lease's token now: its newest generation's (0: nobody ever held it). Listed afresh at every call;
    opening the folder revalidates it on NFS (close-to-open), so another node's new generation shows at once."""
    newest = _newest_generation(run_dir)
    return newest if newest is not None else int(_older_lease(run_dir).get("token") or 0)


def read(run_dir: Path) -> dict[str, Any]:
    """The lease as its newest generation says, with ``heartbeat`` (the file's mtime); {} when nobody ever held
    it. Before the first generation, the lease.json an older swiftslurm wrote, if any."""
    newest = _newest_generation(run_dir)
    if newest is None:
        return _older_lease(run_dir)
    path = lease_generation(run_dir, newest)
    try:
        beat = round(path.stat().st_mtime, 3)
    except OSError:
        beat = None
    return {**(read_json(path) or {}), "token": newest, "heartbeat": beat}


def holds(run_dir: Path, token: int) -> bool:
    return current_token(run_dir) == token


def lost(run_dir: Path, token: int, step: str, job: str | None = None) -> str | None:
    """Why the holder of ``token`` no longer holds the lease, in one line (None: it still does)."""
    if current_token(run_dir) == token:
        return None
    current = read(run_dir)
    who = f"job {job}" if job else "the job that started this trainer"
    return (
        f"{who} lost the lease on {run_dir} (token {token}) to job {current.get('job')} (token "
        f"{current.get('token')}); not doing: {step}. Only one job leads a run. HINT: let that job finish, or "
        "cancel it and requeue this one."
    )


def fence(run_dir: Path, token: int, step: str) -> None:
    """Raise LeaseLost unless ``token`` is still the lease's: call right before ``step``."""
    if (why := lost(run_dir, token, step)) is not None:
        raise LeaseLost(why)


LOCAL_PREFIX = "local-"  # a leader outside SLURM holds the lease as `local-<pid>`


def job_of(where: SlurmEnv) -> str:
    """The job that would hold the lease: the SLURM job id, or this process outside SLURM."""
    return str(where.job_id) if where.in_slurm else f"{LOCAL_PREFIX}{where.job_id or os.getpid()}"


def acquire(run_dir: Path, where: SlurmEnv, attempt: str, alive: Callable[[str], bool] | None = None) -> Lease | str:
    """Take the lease for this job, or say in one line why not (another job that SLURM still holds leads
    the run). ``alive`` asks SLURM about a job (default: squeue, retried as slurm.RETRY says)."""
    me = job_of(where)
    lease_dir(run_dir).mkdir(exist_ok=True)
    for _ in range(TAKE_TRIES):
        current = read(run_dir)
        holder = current.get("job")
        if holder and holder != me and (why := _still_leads(holder, alive or slurm_cli.job_alive)):
            return (
                f"job {me} does not lead {run_dir}: {why}; it stops without touching the run. HINT: one job per "
                f"run dir: wait for job {holder}, or `scancel {holder}` first (the run then resumes here)."
            )
        token = int(current.get("token") or 0) + 1
        record = {"job": me, "token": token, "attempt": attempt, "host": socket.gethostname()}
        if _create(run_dir, token, {**record, "acquired": round(time.time(), 3), "previous": holder}):
            return Lease(run_dir, me, token)
    return (
        f"job {me} does not lead {run_dir}: other jobs took its lease {TAKE_TRIES} times while it tried; it stops "
        f"without touching the run. HINT: one job per run dir: {lease_dir(run_dir)} says which jobs took it."
    )


def _create(run_dir: Path, token: int, record: dict[str, Any]) -> bool:
    """Create generation ``token`` (False: another job created it first)."""
    path = lease_generation(run_dir, token)
    try:
        return create_json_exclusive(path, record)
    except OSError as err:
        raise NodeError(
            f"cannot take the lease on {run_dir}: linking {path} failed ({err.strerror or err}). Leaders are "
            "fenced by creating a file that must not exist yet (link(2), as on local disks, NFS and Lustre), "
            "not by locks. HINT: put run_dir on a filesystem with hard links."
        ) from err


def _newest_generation(run_dir: Path) -> int | None:
    try:
        names = os.listdir(lease_dir(run_dir))
    except FileNotFoundError:
        return None
    return max((int(match.group(1)) for name in names if (match := _GENERATION.fullmatch(name))), default=None)


def _older_lease(run_dir: Path) -> dict[str, Any]:
    """lease.json, the lease an older swiftslurm kept in one file ({} without one)."""
    return read_json(lease_file(run_dir)) or {}


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
    where one node is the whole job). The batch script's SWIFTSLURM_JOB_RUN when it exported one (no controller
    call: asked by every node, SLURM's StartTime cost one `scontrol show job` per node and attempt)."""
    if not where.in_slurm or where.job_id is None:
        return None
    if where.job_run is not None:
        return where.job_run
    job = where.job_id
    try:
        return f"{job}@{slurm_cli.job_start(job)}"
    except SwiftSlurmError as err:  # then resume.json is taken as before nonces, whoever wrote it
        print(f"[swiftslurm] job {job}: SLURM could not say when it started, so no nonce: {err}", flush=True)
        return None
