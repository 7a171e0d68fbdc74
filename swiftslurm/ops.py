"""Operating runs: `swiftslurm logs|cancel|resume RUN_OR_SWEEP_DIR` (status: swiftslurm.status).

- logs: the current attempt's node logs, ms-swift's argument dump folded to a line (swiftslurm/follow.py);
  `--follow` keeps printing, announces each new attempt (a requeue) and ends with the run's end state.
- cancel: stop for good. Marks the run cancelled (the wrapper then never requeues it); a running job is
  asked to save its current step first (USR2) and given time to record it; then `scancel`.
- resume: resubmit a stopped, failed or cancelled run; it continues from its newest committed checkpoint.
  A sweep dir resumes every point that is not finished or still queued.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from swiftslurm import slurm_cli
from swiftslurm.errors import SwiftSlurmError
from swiftslurm.follow import FOLLOW_POLL_S, show_logs
from swiftslurm.node.ckpt.checkpoint import write_json_atomic
from swiftslurm.node.records import read_attempts
from swiftslurm.rundir import CANCELLED, plan_file
from swiftslurm.runs import (
    FINAL_STATES,
    RunFacts,
    ask_slurm,
    gather,
    record_submission,
    slurm_job_ids,
)
from swiftslurm.sweep import run_dirs

ACTIVE_STATES = ("pending", "running", "requeued")
CANCEL_SAVE_WAIT_S = 120.0  # how long `cancel` lets a running job save and record before it scancels


class OpsError(SwiftSlurmError):
    """An operation that cannot be done on this run; the message says why and what to do."""


def facts_of(run_dir: Path) -> RunFacts:
    job_ids = slurm_job_ids([run_dir])
    return gather(run_dir, ask_slurm(job_ids) if job_ids else None)


def cancel(run_dir: Path, save_wait_s: float = CANCEL_SAVE_WAIT_S) -> str:
    """Stop the run for good. A running job is first asked to save (USR2, as before a preemption; the mark
    makes the wrapper stop instead of requeuing) and given ``save_wait_s`` to record its attempt: a plain
    `scancel` leaves it only SLURM's KillWait (often 30 s or less) to save, commit and record. Then
    `scancel` ends whatever is left (a job waiting in the queue, a wrapper that did not finish)."""
    facts = facts_of(run_dir)
    if facts.state in FINAL_STATES:
        return f"{facts.run_name}: already {facts.state}; nothing to cancel."
    write_json_atomic(run_dir / CANCELLED, {"at": time.time()})
    if not (facts.job_id and slurm_job_ids([run_dir])):
        return f"{facts.run_name}: marked cancelled (no SLURM job; a local run stops with Ctrl-C)."
    saved = ""
    if facts.state == "running":
        recorded = len(read_attempts(run_dir))
        _scancel(["--signal=USR2", facts.job_id])
        deadline = time.monotonic() + save_wait_s
        while len(read_attempts(run_dir)) == recorded and time.monotonic() < deadline:
            time.sleep(FOLLOW_POLL_S)
        if len(read_attempts(run_dir)) > recorded:
            saved = f"; saved at step {read_attempts(run_dir)[-1].get('committed_step')}"
    _scancel([facts.job_id])
    return f"{facts.run_name}: cancelled job {facts.job_id}{saved}."


def _scancel(args: list[str]) -> None:
    try:
        slurm_cli.run(["scancel", *args])
    except SwiftSlurmError as err:  # the job ended meanwhile: nothing left to cancel
        if "already" not in str(err).lower() and "invalid job id" not in str(err).lower():
            raise


def resume(run_dir: Path) -> str:
    from swiftslurm import submit
    from swiftslurm.plan import JobPlan

    facts = facts_of(run_dir)
    if facts.state in ACTIVE_STATES:
        return f"{facts.run_name}: {facts.state} as job {facts.job_id}; not resubmitted."
    if facts.state == "finished":
        return f"{facts.run_name}: finished; nothing to resume."
    plan = JobPlan.load(plan_file(run_dir))
    (run_dir / CANCELLED).unlink(missing_ok=True)
    job = submit.submit(plan)
    record_submission(run_dir, str(job.job_id), plan.scheduler)
    where = f"step {facts.committed_step}" if facts.committed_step else "the start (nothing committed)"
    return f"{facts.run_name}: resubmitted as job {job.job_id}; resumes from {where}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swiftslurm", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    logs = commands.add_parser("logs", help="the current attempt's node logs")
    logs.add_argument("run_dir", type=Path)
    logs.add_argument("--node", type=int, help="only this node (0 = the leader)")
    logs.add_argument("-f", "--follow", action="store_true", help="keep following until the run ends")
    logs.add_argument("-v", "--verbose", action="store_true", help="also ms-swift's multi-line dumps (args: ...)")
    for name, text in (("cancel", "stop for good (no requeue)"), ("resume", "resubmit from the newest checkpoint")):
        commands.add_parser(name, help=text).add_argument("path", type=Path, help="run dir or sweep dir")
    args = parser.parse_args(argv)
    try:
        if args.command == "logs":
            if not plan_file(args.run_dir).is_file():
                hint = "HINT: `swiftslurm status runs/` lists the runs."
                raise OpsError(f"{args.run_dir} is not a run dir (no plan.json). {hint}")
            return show_logs(args.run_dir, facts_of, args.node, args.follow, args.verbose)
        action = cancel if args.command == "cancel" else resume
        dirs = run_dirs(args.path)
        if not dirs:
            raise OpsError(f"{args.path} holds no run (no plan.json, no sweep.jsonl).")
        for run_dir in dirs:
            print(action(run_dir))
    except SwiftSlurmError as err:
        print(f"swiftslurm: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
