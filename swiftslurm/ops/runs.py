"""What a run directory says about its run, and what SLURM adds: the facts behind `status`, `cancel`,
`resume` and the plots. Reading never changes anything; SLURM being unreachable is a fact, not an error.

A run directory holds: plan.json (the plan), job.json (the latest submission), status.json (the leader's
view), attempts.jsonl (one record per attempt), sync.json (object storage), output/logging.jsonl
(ms-swift's metrics), and cancelled.json once someone cancelled the run (names: swiftslurm/rundir/layout.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from swiftslurm import slurm as slurm_cli
from swiftslurm.ckpt.checkpoint import checkpoint_step, newest_manifest
from swiftslurm.errors import SwiftSlurmError
from swiftslurm.ops.accounting import STATUS_ASKS, run_ledger
from swiftslurm.ops.ledger import Ledger
from swiftslurm.ops.submission import submission, superseded
from swiftslurm.plan import PlanGlance
from swiftslurm.rundir.beat import STALE_S, spare_silences
from swiftslurm.rundir.jsonio import read_json
from swiftslurm.rundir.layout import (
    SYNC_STATE,
    attempt_dir,
    logs_dir,
    output_dir,
    pace_dir,
    slurm_log,
    stragglers_file,
)
from swiftslurm.rundir.metrics import read_latest
from swiftslurm.rundir.pace import read_paces
from swiftslurm.rundir.records import (
    AttemptRecord,
    is_cancelled,
    newest_wrapper_failure,
    read_attempts,
    read_open_attempt,
    read_refused_submission,
    read_status,
)

# What the leader writes in status.json, refined by what SLURM says about the job right now.
FINAL_STATES = ("finished", "failed", "cancelled")
ACTIVE_STATES = ("pending", "running", "requeued")  # a job carries the run now: not submitted again
# Every state `status` can show (docs/operations.md lists each; tests/unit/test_status_view.py holds them equal).
STATES = ("planned", "pending", "running", "restarting", "requeued", *FINAL_STATES)


@dataclass(frozen=True)
class SlurmView:
    """What SLURM says about some jobs now; `available` False when squeue/sacct could not be asked."""

    available: bool
    states: dict[str, str] = field(default_factory=dict)  # job id -> PENDING, RUNNING, COMPLETED, ...
    error: str = ""
    accounting_error: str = ""  # why sacct's accounting could not be read (the ledger then uses its cache)


def ask_queue(job_ids: list[str]) -> SlurmView:
    """One squeue for all these jobs: the states of those still in the queue. Never raises."""
    try:
        return SlurmView(available=True, states=slurm_cli.queue_states(job_ids, STATUS_ASKS))
    except SwiftSlurmError as err:
        return SlurmView(available=False, error=str(err).strip().splitlines()[-1][:200])


def ask_slurm(job_ids: list[str]) -> SlurmView:
    """One squeue for jobs in the queue, one sacct for the rest. Never raises."""
    if not job_ids:
        return SlurmView(available=True)
    try:
        states = slurm_cli.queue_states(job_ids, STATUS_ASKS)
        ended = [job for job in job_ids if job not in states]
        if ended:
            states |= slurm_cli.accounted_states(ended, STATUS_ASKS)
    except SwiftSlurmError as err:
        return SlurmView(available=False, error=str(err).strip().splitlines()[-1][:200])
    return SlurmView(available=True, states=states)


@dataclass(frozen=True)
class RunFacts:
    """One run, as `status` shows it."""

    run_dir: str
    run_name: str
    state: str  # one of STATES
    why: str
    job_id: str | None
    slurm_state: str | None
    attempts: int
    attempt_reasons: tuple[str, ...]
    committed_step: int | None
    max_steps: int | None
    loss: float | None
    samples_per_s: float | None
    goodput: float | None
    storage: dict[str, Any] | None
    ledger: Ledger | None = None  # where the allocated device-hours went (swiftslurm/ops/ledger.py)
    spares_left: int | None = None  # hosts still standing by (resilience.spare_nodes); None: the run has none
    # (host taken off, the spare in its place, why: "lost" or "straggler"), oldest first
    swaps: tuple[tuple[str, str, str], ...] = ()
    # While the run runs, each spare standing by: host, silent_s (since its wrapper's last beat), alive (within
    # STALE_S: node 0 would call it in); see `standing_spares`
    spare_beats: tuple[dict[str, Any], ...] = ()
    # The nodes named slow in the newest attempt (node/stragglers.py): node, host, ratio, since, since_step, step
    stragglers: tuple[dict[str, Any], ...] = ()
    # Each node's published pace in the newest attempt (rundir/pace.py): node, forward_s, data_s (None: not
    # timed), step; see `newest_paces`
    paces: tuple[dict[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        facts = asdict(self)
        facts["ledger"] = self.ledger.as_dict() if self.ledger else None
        return facts


def _attempt_reason(record: AttemptRecord) -> str:
    """reason→decision; with the node count for a run that may shrink (its records hold `nodes`)."""
    text = f"{record.reason}→{record.decision}"
    return f"{text} on {record.nodes} nodes" if record.nodes else text


@dataclass(frozen=True)
class RunState:
    """A run's state as `status` decides it, and no more: what `logs -f` asks at every poll."""

    state: str  # one of STATES
    why: str
    job_id: str | None
    slurm_state: str | None


def run_state(run_dir: Path, slurm: SlurmView | None = None) -> RunState:
    """The run's state from its job.json, status.json and markers, and SLURM's view of its job (None: none)."""
    job = submission(run_dir)
    status = read_status(run_dir) or {}
    if superseded(status, job):
        status = {}  # the wrapper's last word is about an earlier job: the new one's state is SLURM's
    job_id = str(job.get("job_id") or status.get("job_id") or "") or None
    slurm_state = slurm.states.get(job_id) if slurm and job_id else None
    if job.get("scheduler") == "local" and job_id:
        slurm_state = _local_job_state(job_id)
    state, why = decide_state(status, slurm_state, is_cancelled(run_dir), bool(job))
    if state == "failed" and job_id:  # another node's wrapper failing ends node 0 too, mid-way: say it first
        why = "; ".join(filter(None, (newest_wrapper_failure(run_dir, job_id), why)))
    if job.get("by_hand") and not status:
        why = _hand_submitted_why(run_dir, str(job_id), state, why)
    if (refused := read_refused_submission(run_dir)) and float(refused["at"]) > float(job.get("submitted") or 0):
        why = _refused_why(refused, state, why)
    return RunState(state, why, job_id, slurm_state)


def gather(
    run_dir: Path, slurm: SlurmView | None = None, jobs: dict[str, list[dict[str, Any]]] | None = None
) -> RunFacts:
    """Everything known about one run; ``slurm`` from one `ask_slurm` over many runs (None: run dir only);
    ``jobs``: SLURM's accounting rows of the run's jobs (accounting.refresh; None: the records alone)."""
    plan = PlanGlance.read(run_dir)
    decided = run_state(run_dir, slurm)
    state, why, job_id, slurm_state = decided.state, decided.why, decided.job_id, decided.slurm_state
    attempts = read_attempts(run_dir)
    metrics = read_latest(run_dir)
    committed = newest_manifest(output_dir(run_dir))
    batch = plan.batch.global_ if plan.batch else None
    spent = run_ledger(run_dir, plan, jobs, running=state == "running", recorded=attempts)
    standing = standing_spares(run_dir, state, time.time())
    return RunFacts(
        run_dir=str(run_dir),
        run_name=plan.run_name or run_dir.name,
        state=state,
        why=why,
        job_id=job_id,
        slurm_state=slurm_state,
        attempts=len(attempts),
        attempt_reasons=tuple(_attempt_reason(a) for a in attempts),
        committed_step=checkpoint_step(committed) if committed else None,
        max_steps=metrics.max_steps,
        loss=metrics.loss,
        samples_per_s=batch / metrics.seconds_per_step if metrics.seconds_per_step and batch else None,
        goodput=spent.goodput,
        storage=read_json(run_dir / SYNC_STATE),
        ledger=spent if spent.allocated_s > 0 else None,
        spares_left=len(standing) if standing else spares_left(attempts),
        swaps=tuple((old, new, record.swap_why or "lost") for record in attempts for old, new in record.swaps),
        spare_beats=standing,
        stragglers=newest_stragglers(run_dir, attempts),
        paces=newest_paces(run_dir, attempts),
    )


def spares_left(attempts: list[AttemptRecord]) -> int | None:
    """The spares standing by after the newest attempt that had any: its spares, less those its decision put on
    the roster (a requeued job starts with fresh ones; None: no attempt had spares)."""
    newest = next((record for record in reversed(attempts) if record.spares), None)
    if newest is None:
        return 0 if any(record.swaps for record in attempts) else None
    return len(newest.spares) - len(newest.swaps)


def standing_spares(run_dir: Path, state: str, now: float) -> tuple[dict[str, Any], ...]:
    """While the run runs, each spare standing by in its attempt (status.json's `spares`, written by node 0) with
    the seconds its wrapper has been silent at ``now`` (rundir/beat.py, from the open attempt's start for one that
    has not beaten yet) and whether that is within STALE_S, as node 0 asks before it calls a spare in."""
    status = read_status(run_dir) or {}
    hosts, attempt = status.get("spares"), status.get("attempt")
    if state != "running" or not isinstance(hosts, list) or not hosts or not attempt:
        return ()
    opened = read_open_attempt(run_dir)
    since = opened.start if opened is not None and opened.attempt == attempt and opened.start else 0.0
    silences = spare_silences(attempt_dir(run_dir, str(attempt)), map(str, hosts), now, since)
    return tuple({"host": host, "silent_s": round(s, 1), "alive": s <= STALE_S} for host, s in silences.items())


def newest_paces(run_dir: Path, attempts: list[AttemptRecord]) -> tuple[dict[str, Any], ...]:
    """Each node's pace in the run's newest attempt (pace/node<N>.json, by its local rank 0), by node: the median
    forward and data-loader wait per step of its slowest rank's recent steps."""
    newest = _newest_attempt(run_dir, attempts)
    paces = read_paces(pace_dir(attempt_dir(run_dir, newest))) if newest else {}
    return tuple(
        {"node": node, "forward_s": pace.forward_s, "data_s": pace.data_s, "step": pace.step}
        for node, pace in sorted(paces.items())
    )


def _newest_attempt(run_dir: Path, attempts: list[AttemptRecord]) -> str | None:
    """The attempt running now, else the newest recorded one."""
    running = read_open_attempt(run_dir)
    return running.attempt if running else attempts[-1].attempt if attempts else None


def newest_stragglers(run_dir: Path, attempts: list[AttemptRecord]) -> tuple[dict[str, Any], ...]:
    """The nodes named slow in the run's newest attempt (node 0's stragglers.json), while it runs and after."""
    newest = _newest_attempt(run_dir, attempts)
    report = read_json(stragglers_file(attempt_dir(run_dir, newest))) if newest else None
    named = (report or {}).get("stragglers")
    return tuple(s for s in named if isinstance(s, dict)) if isinstance(named, list) else ()


def _local_job_state(pid: str) -> str:
    """A local job (submitit's local executor: the job id is the process id) is running while its process
    lives; gone without a final word from the wrapper, it failed (killed, machine rebooted)."""
    return "RUNNING" if pid.isdigit() and Path(f"/proc/{pid}").exists() else "FAILED"


def slurm_job_ids(run_dirs: list[Path]) -> list[str]:
    """The job ids SLURM can answer for (local jobs are processes of this machine, not SLURM jobs)."""
    jobs = [submission(d) for d in run_dirs]
    return [str(j["job_id"]) for j in jobs if j.get("job_id") and j.get("scheduler") != "local"]


def _refused_why(refused: dict[str, Any], state: str, why: str) -> str:
    """The latest submission was refused: for a run never submitted that is all there is to say."""
    said = f"submission refused at {time.strftime('%H:%M:%S', time.localtime(float(refused['at'])))}: {refused['why']}"
    return said if state == "planned" else f"{why}; the latest {said}" if why else f"the latest {said}"


def _hand_submitted_why(run_dir: Path, job_id: str, state: str, why: str) -> str:
    """A run submitted by hand whose wrapper has written nothing yet: say where SLURM's own output is."""
    log = slurm_log(logs_dir(run_dir), job_id)
    if state == "pending":
        return f"submitted by hand as job {job_id}; no word from the wrapper yet: see {log}"
    return f"{why}; see {log}" if why else f"see {log}"


# SLURM states of a job that is over. A requeued job in the queue is PENDING (squeue); sacct's REQUEUED for a
# job no longer in the queue means it was removed while waiting to start again.
_SLURM_ENDED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
    "REQUEUED",
}


def decide_state(status: dict[str, Any], slurm_state: str | None, cancelled: bool, submitted: bool) -> tuple[str, str]:
    """The run's state from the leader's status.json and SLURM's view of its job (None: unknown)."""
    written = str(status.get("state", ""))
    why = str(status.get("why", ""))
    if written in FINAL_STATES:
        return written, why
    if cancelled and slurm_state in (None, *_SLURM_ENDED):
        return "cancelled", "cancelled with `swiftslurm cancel`"
    if slurm_state == "PENDING":
        return ("requeued" if written == "requeued" else "pending"), why or "waiting for resources"
    if slurm_state in ("RUNNING", "COMPLETING", "CONFIGURING"):
        return "running", why
    if slurm_state in _SLURM_ENDED:
        # The job is over but the leader never wrote a final state: it was killed (or its node lost).
        return "failed", f"job {slurm_state.lower()} without a final record from the wrapper; {why}".rstrip("; ")
    if written in STATES:
        return written, why
    if submitted:
        return "pending", why
    # No job.json and no word from a wrapper: written by a dry run (or sbatch by hand, not started yet).
    return "planned", why or "never submitted by swiftslurm (dry run); submit it with the same command without dry_run"


def facts_of(run_dir: Path) -> RunFacts:
    """One run's facts with SLURM asked about its job (one squeue, and one sacct if the job has left the queue)."""
    job_ids = slurm_job_ids([run_dir])
    return gather(run_dir, ask_slurm(job_ids) if job_ids else None)


def state_of(run_dir: Path) -> RunState:
    """One run's state with SLURM asked about its job, as facts_of, without reading its metrics, checkpoints or
    ledger: `logs -f` asks every second, and those do not change what it prints."""
    job_ids = slurm_job_ids([run_dir])
    return run_state(run_dir, ask_slurm(job_ids) if job_ids else None)
