"""Operating runs: `swiftslurm logs|cancel|resume RUN_OR_SWEEP_DIR` (status: swiftslurm.ops.status).

- logs: the current attempt's node logs and its job's wrapper output, ms-swift's argument dump folded to a line
  (swiftslurm/ops/follow.py); `--follow` keeps printing, announces each new attempt (a requeue) and ends with the
  run's end state.
- cancel: stop for good. Marks the run cancelled (the wrapper then never requeues it); a running job is
  asked to save its current step first (USR2) and given time to record it; then `scancel`. A sweep's (or a
  folder's) runs are cancelled together: one signal to all, one wait, one `scancel`.
- resume: resubmit a stopped, failed or cancelled run; it continues from its newest committed checkpoint.
  A sweep dir resumes every point that is not finished or still queued, as the sweep submitted them: one job
  array per allocation with the sweep's array_parallelism (a job per point where it was 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import SwiftSlurmError, report
from swiftslurm.ops.follow import FOLLOW_POLL_S, show_logs
from swiftslurm.ops.runs import (
    ACTIVE_STATES,
    FINAL_STATES,
    RunFacts,
    ask_slurm,
    facts_of,
    gather,
    slurm_job_ids,
    state_of,
)
from swiftslurm.ops.waiting import Narrator
from swiftslurm.rundir.jsonio import write_json_atomic
from swiftslurm.rundir.layout import CANCELLED, SUBMITIT, plan_file
from swiftslurm.rundir.records import read_attempts, record_submission, record_submissions
from swiftslurm.rundir.sweepdir import array_parallelism, is_sweep, read_points, record_resubmissions, run_dirs

if TYPE_CHECKING:
    from swiftslurm.plan import JobPlan

CANCEL_SAVE_WAIT_S = 120.0  # how long `cancel` lets a running job save and record before it scancels


class OpsError(SwiftSlurmError):
    """An operation that cannot be done on this run; the message says why and what to do."""


def cancel(run_dir: Path, save_wait_s: float = CANCEL_SAVE_WAIT_S) -> str:
    """Stop one run for good (cancel_all of one)."""
    return cancel_all([run_dir], save_wait_s)[0]


def cancel_all(
    run_dirs: list[Path],
    save_wait_s: float = CANCEL_SAVE_WAIT_S,
    narrate: Narrator | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> list[str]:
    """Stop runs for good, all at once: a sweep's points save the step each is at now, not one after another
    while the others train on. Each run is marked cancelled (the wrapper then stops instead of requeuing);
    every running job is asked to save with one `scancel --signal=USR2` (as before a preemption) and all get the
    same ``save_wait_s`` to record their attempts: a plain `scancel` leaves only SLURM's KillWait (often 30 s or
    less) to save, commit and record. Then one `scancel` ends whatever is left (jobs waiting in the queue,
    wrappers that did not finish). Returns one line per run, in order.

    Args:
        narrate: says the save signal and the wait while it lasts (stdout by default); its clock times the wait.
        sleep: what the wait sleeps with between two looks at the records."""
    job_ids = slurm_job_ids(run_dirs)
    slurm = ask_slurm(job_ids) if job_ids else None
    facts = {run_dir: gather(run_dir, slurm) for run_dir in run_dirs}
    said = {
        d: f"{f.run_name}: already {f.state}; nothing to cancel." for d, f in facts.items() if f.state in FINAL_STATES
    }
    for run_dir in [d for d in run_dirs if d not in said]:
        write_json_atomic(run_dir / CANCELLED, {"at": time.time()})
        if not (facts[run_dir].job_id and slurm_job_ids([run_dir])):
            said[run_dir] = (
                f"{facts[run_dir].run_name}: marked cancelled (no SLURM job; a local run stops with Ctrl-C)."
            )
    live = [d for d in run_dirs if d not in said]
    recorded = {d: len(read_attempts(d)) for d in live if facts[d].state == "running"}
    if recorded:
        narrate, saving = narrate or Narrator(), [str(facts[d].job_id) for d in recorded]
        slurm_cli.cancel(saving, signal="USR2")
        for run_dir, job in zip(recorded, saving, strict=True):
            narrate.say(f"{facts[run_dir].run_name}: asked job {job} to save its current step (USR2)")
        _wait_for_records(recorded, saving, save_wait_s, narrate, sleep)
    if live:
        slurm_cli.cancel([str(facts[d].job_id) for d in live])
    for run_dir in live:
        said[run_dir] = f"{facts[run_dir].run_name}: cancelled job {facts[run_dir].job_id}{_saved(run_dir, recorded)}."
    return [said[d] for d in run_dirs]


def _wait_for_records(
    recorded: dict[Path, int], jobs: list[str], wait_s: float, narrate: Narrator, sleep: Callable[[float], None]
) -> None:
    """Until each run has more attempt records than ``recorded`` says, or ``wait_s`` has passed by the narrator's
    clock; said at once and every REPEAT_S while it lasts (``jobs``: the jobs asked to save)."""
    deadline = narrate.clock() + wait_s
    while (done := sum(len(read_attempts(d)) > n for d, n in recorded.items())) < len(recorded) and (
        narrate.clock() < deadline
    ):
        narrate(_awaited(jobs, done, wait_s))
        sleep(FOLLOW_POLL_S)


def _awaited(jobs: list[str], done: int, wait_s: float) -> str:
    """'waiting up to 120 s for job 12 to record its attempt'; for several jobs, how many have recorded."""
    if len(jobs) == 1:
        return f"waiting up to {wait_s:.0f} s for job {jobs[0]} to record its attempt"
    count = len(jobs)
    return f"waiting up to {wait_s:.0f} s for {count} jobs to record their attempts ({done} of {count} recorded)"


def _saved(run_dir: Path, recorded: dict[Path, int]) -> str:
    """'; saved at step N' when the run recorded its attempt after the save signal, else ''."""
    attempts = read_attempts(run_dir)
    if run_dir not in recorded or len(attempts) <= recorded[run_dir]:
        return ""
    return f"; saved at step {attempts[-1].committed_step}"


def resume(run_dir: Path) -> str:
    """Resubmit one run (a sweep's points: resume_sweep)."""
    from swiftslurm.plan import JobPlan
    from swiftslurm.submit import jobs as submit

    facts = facts_of(run_dir)
    if (why := _not_resumed(facts)) is not None:
        return why
    plan = JobPlan.load(plan_file(run_dir))
    (run_dir / CANCELLED).unlink(missing_ok=True)
    job = submit.submit(plan)
    record_submission(run_dir, str(job.job_id), plan.scheduler)
    return _resubmitted(facts, str(job.job_id))


@dataclass(frozen=True)
class _Point:
    """A sweep point to resubmit."""

    run_dir: Path
    facts: RunFacts
    plan: JobPlan


def resume_sweep(sweep_dir: Path, say: Callable[[str], None] = print) -> None:
    """Resubmit the sweep's points that are not finished, queued or running, as the sweep submitted them
    (submit.array_groups): one job array per allocation and array_parallelism recorded, one job per other point;
    each new job recorded in the point's run dir and in sweep.jsonl. One line per point, in point order; when a
    submission fails (SubmitError, raised once the lines are said), only the points decided before it have one."""
    from swiftslurm.plan import JobPlan
    from swiftslurm.submit import jobs as submit

    points = read_points(sweep_dir)
    run_dirs = [Path(p["run_dir"]) for p in points]
    job_ids = slurm_job_ids(run_dirs)
    slurm = ask_slurm(job_ids) if job_ids else None  # one squeue (and sacct) for every point
    said: dict[Path, str] = {}
    todo: list[tuple[_Point, JobPlan, int]] = []
    for point, run_dir in zip(points, run_dirs, strict=True):
        facts = gather(run_dir, slurm)
        if (why := _not_resumed(facts)) is not None:
            said[run_dir] = why
        else:
            plan = JobPlan.load(plan_file(run_dir))
            todo.append((_Point(run_dir, facts, plan), plan, array_parallelism(point)))
    arrays, singles = submit.array_groups(todo)
    try:
        for parallelism, members in arrays:
            _uncancel(members)
            jobs = submit.submit_array([m.plan for m in members], sweep_dir / SUBMITIT, parallelism)
            _record_resubmitted(sweep_dir, members, [str(job.job_id) for job in jobs], said)
        for single in singles:
            _uncancel([single])
            _record_resubmitted(sweep_dir, [single], [str(submit.submit(single.plan).job_id)], said)
    finally:
        for run_dir in run_dirs:
            if run_dir in said:
                say(said[run_dir])


def _uncancel(points: list[_Point]) -> None:
    for point in points:
        (point.run_dir / CANCELLED).unlink(missing_ok=True)


def _record_resubmitted(sweep_dir: Path, points: list[_Point], jobs: list[str], said: dict[Path, str]) -> None:
    """Each point's new job, in its run dir and in the sweep's record, and the line that says so."""
    resubmitted = [(point.run_dir, job) for point, job in zip(points, jobs, strict=True)]
    record_submissions(resubmitted, points[0].plan.scheduler)
    record_resubmissions(sweep_dir, resubmitted)
    said.update((point.run_dir, _resubmitted(point.facts, job)) for point, job in zip(points, jobs, strict=True))


def _not_resumed(facts: RunFacts) -> str | None:
    """Why a run is not resubmitted (finished, or its job still queued or running); None: it is."""
    if facts.state in ACTIVE_STATES:
        return f"{facts.run_name}: {facts.state} as job {facts.job_id}; not resubmitted."
    if facts.state == "finished":
        return f"{facts.run_name}: finished; nothing to resume."
    return None


def _resubmitted(facts: RunFacts, job_id: str) -> str:
    where = f"step {facts.committed_step}" if facts.committed_step else "the start (nothing committed)"
    return f"{facts.run_name}: resubmitted as job {job_id}; resumes from {where}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="swiftslurm", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    logs = commands.add_parser("logs", help="the current attempt's node logs and its job's wrapper output")
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
            return show_logs(args.run_dir, state_of, args.node, args.follow, args.verbose)
        dirs = run_dirs(args.path)
        if not dirs:
            raise OpsError(f"{args.path} holds no run (no plan.json, no sweep.jsonl).")
        if args.command == "cancel":  # all together: a sweep's points stop at the same moment
            print("\n".join(cancel_all(dirs)))
            return 0
        if is_sweep(args.path):  # as the sweep submitted its points: its arrays, with their array_parallelism
            resume_sweep(args.path)
            return 0
        for run_dir in dirs:
            print(resume(run_dir))
    except SwiftSlurmError as err:
        return report(err)
    return 0


if __name__ == "__main__":
    sys.exit(main())
