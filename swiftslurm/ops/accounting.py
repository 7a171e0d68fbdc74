"""SLURM's accounting of a run's jobs, cached in the run dir, and the run's goodput ledger built from it.

`status` asks `sacct --duplicates` (slurm_cli.job_runs) once for all the jobs of all the runs it shows, and
only for jobs whose accounting can still change: a job that has ended for good (not requeued, not waiting,
not running) is never asked about again, and one still running at most once every ACCOUNTING_TTL_S. The same
call tells how the jobs that left the queue ended (their newest row: `newest_states`), so `status` starts one
squeue and at most one sacct however many runs it shows. Busy clusters rate-limit sacct; a folder of a thousand
finished runs costs no SLURM call at all. The cache is RUN_DIR/accounting.json (rundir.ACCOUNTING); a run dir
that cannot be written to is simply not cached.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import SwiftSlurmError
from swiftslurm.ops import ledger
from swiftslurm.ops.submission import submission
from swiftslurm.plan import PlanGlance
from swiftslurm.rundir.jsonio import read_json, write_json_atomic
from swiftslurm.rundir.layout import ACCOUNTING, attempt_dir, trainer_timeline
from swiftslurm.rundir.records import AttemptRecord, read_attempt_rows, read_attempts, read_open_attempt
from swiftslurm.rundir.timeline import read_timeline

ACCOUNTING_TTL_S = 30.0  # a job whose accounting may still change is asked about at most this often
# SLURM states after which a job run's row never changes and no new run of the job comes.
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
)
Asker = Callable[[list[str]], list[dict[str, Any]]]
# How `status` asks SLURM (here and runs.ask_slurm): a person waits, so each question ends within 20 s.
STATUS_ASKS = slurm_cli.Retry(timeout_s=10.0, tries=3, first_pause_s=1.0, budget_s=20.0)


def ask_sacct(job_ids: list[str]) -> list[dict[str, Any]]:
    return slurm_cli.job_runs(job_ids, STATUS_ASKS)


def job_ids(run_dir: Path) -> list[str]:
    """Every SLURM job that carried the run: each attempt's, and the one that carries it now (submission.py)."""
    found = [str(row["job_id"]) for row in read_attempt_rows(run_dir) if row.get("job_id")]  # no records: only ids
    job = submission(run_dir)
    if job.get("job_id") and job.get("scheduler") != "local":
        found.append(str(job["job_id"]))
    return list(dict.fromkeys(found))


def is_final(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a job's accounting can no longer change: its newest run ended in a final state."""
    return bool(rows) and rows[-1].get("state") in FINAL_STATES and rows[-1].get("end") is not None


def refresh(
    run_dirs: Sequence[Path],
    ask: Asker | None = ask_sacct,
    now: float | None = None,
    left_queue: Collection[str] = (),
) -> tuple[dict[Path, dict[str, list[dict[str, Any]]]], str]:
    """Each run's job rows (job id -> rows), from its cache where that is final or fresh, the rest from one
    `ask` for all runs together (None: the cache only); also why SLURM could not be asked ("" if it could or
    did not need to be). ``left_queue``: jobs squeue no longer lists, asked unless their cached rows are final
    (a fresh cache saying RUNNING is wrong about them), so that their newest row tells how they ended."""
    now = time.time() if now is None else now
    cached = {d: _read_cache(d) for d in run_dirs}
    wanted = {d: job_ids(d) for d in run_dirs}
    asked_about = {j for d in run_dirs for j in wanted[d] if _stale(cached[d].get(j), now, j in left_queue)}
    stale = sorted(asked_about) if ask else []
    asked: dict[str, list[dict[str, Any]]] = {}
    error = ""
    # A row answers every id the runs know its job by (an array task's `A_i` and its raw id), asked or not: the
    # entry under the other id would keep a stale row (RUNNING, no End) beside the fresh one.
    known = sorted({j for d in run_dirs for j in wanted[d]})
    if stale and ask is not None:
        try:
            for row in ask(stale):
                for job in answered(row, known):
                    asked.setdefault(job, []).append(row)
        except (SwiftSlurmError, OSError) as err:
            error = str(err).strip().splitlines()[-1][:200] if str(err).strip() else type(err).__name__
    result = {}
    for d in run_dirs:
        told = [j for j in wanted[d] if (j in stale or j in asked) and not error]
        fresh = {j: _entry(asked.get(j), cached[d].get(j), now) for j in told}
        entries = {**cached[d], **fresh}
        if fresh:
            _write_cache(d, entries)
        result[d] = {j: entries[j]["rows"] for j in wanted[d] if j in entries}
    return result, error


def _entry(rows: list[dict[str, Any]] | None, cached: Mapping[str, Any] | None, now: float) -> dict[str, Any]:
    """A job's cache entry after asking: sacct's rows, or, where it said nothing of a job it once did (purged
    from its database), the cached ones: what SLURM accounted does not stop having happened."""
    return {"rows": rows or (cached or {}).get("rows", []), "asked_at": now}


def answered(row: Mapping[str, Any], asked: Sequence[str]) -> list[str]:
    """Which of the ``asked`` job ids a sacct row answers: an array task is asked for by the name submitit gave
    it (`11_2`, job.json) and by its raw id (`14`, the attempt's record), and its one row answers both."""
    return [job for job in dict.fromkeys((str(row["job_id"]), str(row.get("raw_id") or row["job_id"]))) if job in asked]


def newest_states(
    jobs: Mapping[Path, Mapping[str, Sequence[Mapping[str, Any]]]], job_ids: Collection[str]
) -> dict[str, str]:
    """SLURM's state of each of these jobs' newest run, from the rows `refresh` gave (jobs without rows: absent)."""
    rows = {job: runs for by_job in jobs.values() for job, runs in by_job.items() if runs}
    return {job: str(rows[job][-1].get("state", "")) for job in job_ids if job in rows}


def _stale(entry: Mapping[str, Any] | None, now: float, left_queue: bool = False) -> bool:
    if entry is None:
        return True
    rows = entry.get("rows", [])
    if any("raw_id" not in r for r in rows):
        return True  # cached before sacct's JobIDRaw was read: an array task's attempts could not find it
    if is_final(rows):
        return False
    return left_queue or now - float(entry.get("asked_at", 0)) >= ACCOUNTING_TTL_S


def _read_cache(run_dir: Path) -> dict[str, Any]:
    jobs = (read_json(run_dir / ACCOUNTING) or {}).get("jobs")
    return jobs if isinstance(jobs, dict) else {}


def _write_cache(run_dir: Path, jobs: dict[str, Any]) -> None:
    # Not durable: a cache lost in a crash costs one more question, while an fsync per run dir would cost a
    # folder of runs on a network filesystem seconds. A run dir this user cannot write: no cache, asked again.
    with contextlib.suppress(OSError):
        write_json_atomic(run_dir / ACCOUNTING, {"jobs": jobs}, durable=False)


# ---------------------------------------------------------------- the run's ledger


def run_ledger(
    run_dir: Path,
    plan: PlanGlance,
    jobs: Mapping[str, list[dict[str, Any]]] | None,
    running: bool = False,
    now: float | None = None,
    recorded: Sequence[AttemptRecord] | None = None,
) -> ledger.Ledger:
    """The run's ledger from its records and SLURM's rows of its jobs (None or missing: the records alone).
    ``running``: the open attempt is training now (else, without a record, it was lost); ``recorded``: the run's
    attempt records where the caller has read them already (None: read here)."""
    now = time.time() if now is None else now
    devices, unit = plan.devices_per_node()
    allocations = allocations_of([r for rows in (jobs or {}).values() for r in rows], devices)
    recorded = read_attempts(run_dir) if recorded is None else recorded
    attempts = [ledger.attempt_marks(r, _events(run_dir, r)) for r in recorded]
    opened = _open_attempt(run_dir, {a.attempt for a in attempts})
    if opened is not None:
        attempts.append(ledger.attempt_marks(opened, _events(run_dir, opened), running=running))
    return ledger.compute(allocations, attempts, devices, unit, now)


def allocations_of(rows: Sequence[Mapping[str, Any]], devices: int) -> list[ledger.Allocation]:
    """The job runs that held nodes (a job cancelled while it waited never started), each once: an array task's
    row comes under both of its ids (answered), and one run is one (raw id, Start)."""
    runs: dict[tuple[str, float], ledger.Allocation] = {}
    for r in rows:
        if r.get("start") is None or int(r.get("nodes") or 0) <= 0:
            continue
        job, raw = str(r["job_id"]), str(r.get("raw_id") or r["job_id"])
        width = int(r["nodes"]) * devices
        resized = r.get("state") == "RESIZING"
        start, end, submit = float(r["start"]), r.get("end"), r.get("submit")
        allocation = ledger.Allocation(job, start, end, width, submit, raw_id=raw, resized=resized)
        known = runs.get((raw, allocation.start))
        if known is None or (known.end is None and allocation.end is not None):  # the row that saw it end wins
            runs[(raw, allocation.start)] = allocation
    return list(runs.values())


def _events(run_dir: Path, record: AttemptRecord) -> list[dict[str, Any]]:
    return read_timeline(trainer_timeline(attempt_dir(run_dir, record.attempt)))


def _open_attempt(run_dir: Path, recorded: set[str]) -> AttemptRecord | None:
    """The attempt marked open that has no record yet: running now (or lost, until the next one says so)."""
    opened = read_open_attempt(run_dir)
    return opened if opened is not None and opened.attempt not in recorded else None
