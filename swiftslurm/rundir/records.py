"""What a run directory remembers between attempts: attempts.jsonl, status.json and per-node results.

attempts.jsonl is append-only, one line per attempt (each line one small write, so appends from
successive attempts never interleave). status.json is the run's current state, replaced atomically.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from swiftslurm.rundir.jsonio import (
    append_jsonl,
    peek_json,
    read_json,
    read_jsonl,
    sync_filesystems,
    write_json_atomic,
)
from swiftslurm.rundir.layout import (
    ATTEMPTS,
    CANCELLED,
    JOB,
    OPEN_ATTEMPT,
    STATUS,
    SUBMIT_REFUSED,
    node_result,
    nodes_with_results,
    wrapper_failure_file,
    wrapper_failure_files,
)


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt, as a line of attempts.jsonl (and attempt_open.json while it runs). Every field is optional:
    a lost attempt knows little, and rows written by earlier versions lack later fields; keys this version does
    not know are kept in ``extra``.

    On disk a row holds the facts it has, and the keys in ``keep_keys`` even when null or empty: a concluded
    attempt's row (CONCLUDED_KEYS) shows every fact it could have, so that a reader of the file sees
    `"failed_host": null`; a row read back is written with the keys it had."""

    attempt: str = ""
    job_id: str | None = None
    restart_count: int | None = None
    hosts: tuple[str, ...] = ()
    start: float | None = None
    end: float | None = None  # None: it ended without a record (closed as lost by the next attempt)
    exit_code: int | None = None
    signals: tuple[tuple[str, float], ...] = ()  # (signal name, when) in the order they came
    first_step_at: float | None = None
    last_step: int | None = None
    last_step_at: float | None = None  # when node 0 saw that step: the last sign of training
    max_steps: int | None = None
    resumed_from: str | None = None
    resume_step: int | None = None
    quarantined: tuple[str, ...] = ()  # set aside at the start, and a save that did not fit on the disk
    rejected: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()  # deleted at the start: earlier quarantine, prunes cut short (ckpt.reclaim)
    committed_step: int | None = None
    progressed: bool | None = None  # it committed a newer checkpoint than it resumed from
    failed_host: str | None = None
    reason: str | None = None  # decide.Reason's value
    decision: str | None = None  # decide.Action's value; None while the attempt runs
    why: str | None = None
    delay_s: float | None = None
    exclude_hosts: tuple[str, ...] = ()
    failed_host_evidence: str | None = None
    end_time_error: str | None = None
    hang: dict[str, Any] | None = None
    stop: dict[str, Any] | None = None  # after a stop signal: the agreed stop step, the save deadline (watch.py)
    phases: dict[str, float] | None = None  # phase name -> when the attempt entered it (attempt.py)
    nodes: int | None = None  # the attempt's node count, for a run that may shrink
    next_nodes: int | None = None  # the node count the next attempt asks for
    spares: tuple[str, ...] = ()  # the hosts standing by during this attempt (resilience.spare_nodes)
    swaps: tuple[tuple[str, str], ...] = ()  # (lost host, spare in its place) for the restart this decided
    swap_why: str | None = None  # why those hosts left the roster: "lost" (`blame`), or "straggler" (swap.py)
    preflight: str | None = None  # "failed": the preflight stopped the run before training
    refused: bool | None = None  # the wrapper refused to start the attempt
    restore_error: str | None = None  # the object store could not be read before training (node/resume.py)
    restored_from: str | None = None  # resumed_from was downloaded from this object (s3://bucket/prefix/checkpoint-N)
    requeue_error: str | None = None  # `scontrol requeue` failed after the row said requeue (amend_attempt)
    leftovers: tuple[str, ...] = ()  # "nodeN: PID NAME (state...)": trainer processes that outlived their KILL
    # The nodes named slow when the trainer ended (node/stragglers.py); "exclude": true where the run excludes
    # their host from the next requeue (resilience.straggler_action=exclude), as a failed host's
    stragglers: tuple[dict[str, Any], ...] = ()
    extra: dict[str, Any] = field(default_factory=dict, compare=False)
    keep_keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def facts(cls) -> tuple[str, ...]:
        """The names of the facts a row may hold (every field but ``extra`` and ``keep_keys``)."""
        return tuple(f.name for f in fields(cls) if f.name not in ("extra", "keep_keys"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AttemptRecord:
        """A row as written by this or an earlier version: a missing key, or a null where this version writes a
        list, reads as the field's default."""
        known = cls.facts()
        values = {name: _as_tuple(value) for name, value in data.items() if name in known and value is not None}
        if "attempt" in values:
            values["attempt"] = str(values["attempt"])
        extra = {k: v for k, v in data.items() if k not in known}
        return cls(**values, extra=extra, keep_keys=tuple(k for k in data if k in known))

    def as_dict(self) -> dict[str, Any]:
        row = {name: getattr(self, name) for name in self.facts()}
        row = {k: v for k, v in row.items() if k in self.keep_keys or not _unset(v)}
        return dict(sorted({**self.extra, **row}.items()))


def _unset(value: Any) -> bool:
    """What a field holds when the row has no such fact."""
    return value is None or (isinstance(value, (tuple, dict)) and not value)


# What a concluded attempt's row shows even when null or empty; only a run that may shrink adds its node counts,
# and the errors of an outage appear only when there was one.
_WHEN_SET = (
    "nodes",
    "next_nodes",
    "preflight",
    "refused",
    "restore_error",
    "restored_from",
    "requeue_error",
    "leftovers",
    "stragglers",
    "swap_why",
)
CONCLUDED_KEYS = tuple(k for k in AttemptRecord.facts() if k not in _WHEN_SET)
# The key of a line that corrects the attempt recorded before it with the same id (amend_attempt).
AMENDS = "amends"


def _as_tuple(value: Any) -> Any:
    """JSON lists as the record's tuples (signals: a tuple of pairs)."""
    if isinstance(value, list):
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def read_attempts(run_dir: Path) -> list[AttemptRecord]:
    """The recorded attempts, oldest first, each with its amendments folded in; a torn last line (a crash
    mid-append) is skipped."""
    return [AttemptRecord.from_dict(row) for row in read_attempt_rows(run_dir)]


def read_attempt_rows(run_dir: Path) -> list[dict[str, Any]]:
    """The rows of attempts.jsonl as JSON has them (the keys on disk), amendments folded in, oldest first."""
    rows: list[dict[str, Any]] = []
    for row in read_jsonl(run_dir / ATTEMPTS):
        if not row.pop(AMENDS, False):
            rows.append(row)
        elif (amended := next((r for r in reversed(rows) if r.get("attempt") == row.get("attempt")), None)) is not None:
            amended.update(row)
    return rows


def append_attempt(run_dir: Path, record: AttemptRecord) -> None:
    append_jsonl(run_dir / ATTEMPTS, [record.as_dict()])


def amend_attempt(run_dir: Path, attempt: str, **facts: Any) -> None:
    """Correct facts of a recorded attempt after the fact (its requeue failed after the row said requeue). The
    file stays append-only: a line with the attempt's id, ``facts`` and `"amends": true`, which read_attempts
    folds into the newest earlier row of that attempt (an amendment of no recorded attempt is ignored)."""
    append_jsonl(run_dir / ATTEMPTS, [{"attempt": attempt, AMENDS: True, **facts}])


def close_attempt(run_dir: Path, record: AttemptRecord) -> None:
    """Record a concluded attempt, then drop its open mark: a finished run dir holds no attempt_open.json. In
    that order, so a crash between them leaves a mark of a recorded attempt, which open_attempt ignores."""
    append_attempt(run_dir, record)
    opened = read_open_attempt(run_dir)
    if opened is not None and opened.attempt == record.attempt:
        (run_dir / OPEN_ATTEMPT).unlink(missing_ok=True)


def note_in_log(log: Path, text: str) -> None:
    """A line of swiftslurm's own in a node log, where `swiftslurm logs` shows it (the trainer appends after it)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"[swiftslurm] {text}\n")


def write_status(run_dir: Path, state: str, **facts: Any) -> None:
    """state: running | restarting | requeued | finished | failed | cancelled (what `status` shows: runs.STATES)."""
    write_json_atomic(run_dir / STATUS, {"state": state, "updated": round(time.time(), 3), **facts})


def update_status(run_dir: Path, **facts: Any) -> None:
    """Add facts to the current status (the state stays as it is)."""
    current = read_status(run_dir) or {"state": "running"}
    write_json_atomic(run_dir / STATUS, {**current, "updated": round(time.time(), 3), **facts})


def read_status(run_dir: Path) -> dict[str, Any] | None:
    return read_json(run_dir / STATUS)


def read_open_attempt(run_dir: Path) -> AttemptRecord | None:
    """The attempt marked open (attempt_open.json), or None."""
    data = read_json(run_dir / OPEN_ATTEMPT)
    return AttemptRecord.from_dict(data) if data is not None else None


def open_attempt(run_dir: Path, record: AttemptRecord) -> AttemptRecord | None:
    """Mark an attempt as started; return the previous open one if it never wrote its record."""
    previous = read_open_attempt(run_dir)
    write_json_atomic(run_dir / OPEN_ATTEMPT, record.as_dict())
    recorded = {r.attempt for r in read_attempts(run_dir)}
    return previous if previous and previous.attempt not in recorded else None


@dataclass(frozen=True)
class TrainerEnd:
    """How one node's trainer ended, as its wrapper saw it (logs/<attempt>/node<N>.json)."""

    node: int
    host: str
    exit_code: int
    ended_at: float | None = None  # when the wrapper saw the trainer exit (None: it started none)
    ended_by: str | None = None  # why the wrapper ended it itself (node/watch.py: a peer failed, a hang, a stop)
    leftovers: tuple[str, ...] = ()  # its processes still there when the wrapper stopped waiting (launch.py)


def write_node_result(
    attempt_dir: Path,
    node: int,
    host: str,
    exit_code: int,
    ended_at: float | None = None,
    ended_by: str | None = None,
    leftovers: tuple[str, ...] = (),
) -> None:
    attempt_dir.mkdir(parents=True, exist_ok=True)  # a node signalled before node 0 published anything made none
    result = {"node": node, "host": host, "exit_code": exit_code, "ended_at": ended_at, "ended_by": ended_by}
    write_json_atomic(node_result(attempt_dir, node), result | ({"leftovers": list(leftovers)} if leftovers else {}))


def read_node_result(attempt_dir: Path, node: int) -> TrainerEnd | None:
    """A node's result, or None while there is none (or it is being replaced)."""
    data = peek_json(node_result(attempt_dir, node)) or {}
    code, ended_at, ended_by = data.get("exit_code"), data.get("ended_at"), data.get("ended_by")
    if not isinstance(code, int):
        return None
    leftovers = data.get("leftovers")
    return TrainerEnd(
        node,
        str(data.get("host", "")),
        code,
        float(ended_at) if isinstance(ended_at, (int, float)) else None,
        str(ended_by) if ended_by else None,
        tuple(str(p) for p in leftovers) if isinstance(leftovers, list) else (),
    )


def write_wrapper_failure(attempt_dir: Path, node: int, host: str, phase: str, error: BaseException) -> None:
    """A node other than 0 whose wrapper raised in ``phase``: its own record of it (WRAPPER_FAILURE)."""
    attempt_dir.mkdir(parents=True, exist_ok=True)  # the attempt may not have begun anywhere yet
    record = {"node": node, "host": host, "phase": phase, "error": repr(error), "at": round(time.time(), 3)}
    write_json_atomic(wrapper_failure_file(attempt_dir, node), record)


def newest_wrapper_failure(run_dir: Path, job_id: str) -> str | None:
    """How the newest wrapper failure of a node other than 0 in job ``job_id``'s attempts reads, or None."""
    found = [
        (data, path.parent.name)
        for path in wrapper_failure_files(run_dir)
        if path.parent.name.split(".")[0] == job_id and (data := peek_json(path))
    ]
    if not found:
        return None
    data, attempt = max(found, key=lambda item: float(item[0].get("at") or 0))
    return (
        f"node {data.get('node')}'s wrapper ({data.get('host')}) failed in phase {data.get('phase')} of attempt "
        f"{attempt}: {data.get('error')}"
    )


def read_node_exit_code(path: Path) -> int | None:
    """The trainer's exit code in a node result (write_node_result), or None while there is none."""
    code = (peek_json(path) or {}).get("exit_code")  # None: not written yet, or being replaced
    return code if isinstance(code, int) else None


def silent_hosts(attempt_dir: Path, hosts: tuple[str, ...], wait_s: float, poll_s: float = 1.0) -> list[str]:
    """Hosts whose wrapper wrote no result within ``wait_s``: lost nodes (or killed wrappers)."""
    deadline = time.time() + wait_s
    while True:
        written = nodes_with_results(attempt_dir)
        missing = [h for i, h in enumerate(hosts) if i not in written]
        if not missing or time.time() >= deadline:
            return missing
        time.sleep(poll_s)


def record_submission(run_dir: Path, job_id: str, scheduler: str) -> None:
    """The job that now carries the run (a resubmission replaces it)."""
    write_json_atomic(run_dir / JOB, {"job_id": job_id, "scheduler": scheduler, "submitted": time.time()})
    (run_dir / SUBMIT_REFUSED).unlink(missing_ok=True)


def record_refused_submission(run_dir: Path, why: str) -> None:
    """The submission of a written run dir was refused (sbatch, the partition, the object store): `status`
    says so rather than calling the run a dry run. Nothing is written where the run dir does not exist."""
    if run_dir.is_dir():
        write_json_atomic(run_dir / SUBMIT_REFUSED, {"at": round(time.time(), 3), "why": why})


def read_refused_submission(run_dir: Path) -> dict[str, Any] | None:
    return read_json(run_dir / SUBMIT_REFUSED)


# job.json's key for a job whose submitit files are not in its run dir's submitit/ (a job array's task).
SUBMITIT_DIR = "submitit_dir"


def record_submissions(jobs: list[tuple[Path, str]], scheduler: str, submitit: Path | None = None) -> None:
    """record_submission for many runs (a job array, whose submitit files are in ``submitit``): each job.json
    whole or absent (temp file, rename), and one sync for all of them instead of two fsyncs per run."""
    now = time.time()
    where = {SUBMITIT_DIR: str(submitit)} if submitit else {}
    for run_dir, job_id in jobs:
        job = {"job_id": job_id, "scheduler": scheduler, "submitted": now, **where}
        write_json_atomic(run_dir / JOB, job, durable=False)
        (run_dir / SUBMIT_REFUSED).unlink(missing_ok=True)
    sync_filesystems([run_dir for run_dir, _ in jobs])


def is_cancelled(run_dir: Path) -> bool:
    return (run_dir / CANCELLED).is_file()
