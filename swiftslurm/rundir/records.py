"""What a run directory remembers between attempts: attempts.jsonl, status.json and per-node results.

attempts.jsonl is append-only, one line per attempt (each line one small write, so appends from
successive attempts never interleave). status.json is the run's current state, replaced atomically.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from swiftslurm.rundir.jsonio import sync_filesystems, write_json_atomic
from swiftslurm.rundir.layout import ATTEMPTS, CANCELLED, JOB, OPEN_ATTEMPT, STATUS, node_result


def read_attempts(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / ATTEMPTS
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # a torn last line from a crash: skip it, keep the rest
            continue
    return records


def append_attempt(run_dir: Path, record: dict[str, Any]) -> None:
    with open(run_dir / ATTEMPTS, "a") as out:
        out.write(json.dumps(record, sort_keys=True) + "\n")


def close_attempt(run_dir: Path, record: dict[str, Any]) -> None:
    """Record a concluded attempt, then drop its open mark: a finished run dir holds no attempt_open.json. In
    that order, so a crash between them leaves a mark of a recorded attempt, which open_attempt ignores."""
    append_attempt(run_dir, record)
    if (read_open_attempt(run_dir) or {}).get("attempt") == record.get("attempt"):
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
    try:
        data = json.loads((run_dir / STATUS).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_open_attempt(run_dir: Path) -> dict[str, Any] | None:
    """The attempt marked open (attempt_open.json), or None."""
    try:
        data = json.loads((run_dir / OPEN_ATTEMPT).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def open_attempt(run_dir: Path, record: dict[str, Any]) -> dict[str, Any] | None:
    """Mark an attempt as started; return the previous open one if it never wrote its record."""
    path = run_dir / OPEN_ATTEMPT
    previous = None
    if path.is_file():
        try:
            previous = json.loads(path.read_text())
        except json.JSONDecodeError:
            previous = None
    write_json_atomic(path, record)
    recorded = {r.get("attempt") for r in read_attempts(run_dir)}
    return previous if previous and previous.get("attempt") not in recorded else None


def write_node_result(attempt_dir: Path, node: int, host: str, exit_code: int) -> None:
    attempt_dir.mkdir(parents=True, exist_ok=True)  # a node signalled before node 0 published anything made none
    write_json_atomic(node_result(attempt_dir, node), {"node": node, "host": host, "exit_code": exit_code})


def read_node_exit_code(path: Path) -> int | None:
    """The trainer's exit code in a node result (write_node_result), or None while there is none."""
    try:
        code = json.loads(path.read_text()).get("exit_code")
    except (OSError, ValueError, AttributeError):  # not written yet, or being replaced
        return None
    return code if isinstance(code, int) else None


def silent_hosts(attempt_dir: Path, hosts: tuple[str, ...], wait_s: float, poll_s: float = 1.0) -> list[str]:
    """Hosts whose wrapper wrote no result within ``wait_s``: lost nodes (or killed wrappers)."""
    deadline = time.time() + wait_s
    while True:
        missing = [h for i, h in enumerate(hosts) if not node_result(attempt_dir, i).is_file()]
        if not missing or time.time() >= deadline:
            return missing
        time.sleep(poll_s)


def record_submission(run_dir: Path, job_id: str, scheduler: str) -> None:
    """The job that now carries the run (a resubmission replaces it)."""
    write_json_atomic(run_dir / JOB, {"job_id": job_id, "scheduler": scheduler, "submitted": time.time()})


def record_submissions(jobs: list[tuple[Path, str]], scheduler: str) -> None:
    """record_submission for many runs (a job array): each job.json whole or absent (temp file, rename), and
    one sync for all of them instead of two fsyncs per run."""
    now = time.time()
    for run_dir, job_id in jobs:
        tmp = run_dir / f".{JOB}.{os.getpid()}"
        tmp.write_text(json.dumps({"job_id": job_id, "scheduler": scheduler, "submitted": now}, indent=1))
        os.replace(tmp, run_dir / JOB)
    sync_filesystems([run_dir for run_dir, _ in jobs])


def is_cancelled(run_dir: Path) -> bool:
    return (run_dir / CANCELLED).is_file()
