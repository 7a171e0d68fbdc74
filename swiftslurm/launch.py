"""The steps of submitting one run, shared by a single run (`__main__.run`) and every point of a sweep
(`sweeper.py`): the composed config as the schema, whether a run dir is submitted again, the dry-run text,
what a submission needs on this machine, and waiting for a job while printing its progress.
Login side only: imports OmegaConf (and submitit when waiting).
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swiftslurm.errors import RunFailed, report
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import layout as rundir
from swiftslurm.submit.report import dry_run_report, result_summary

if TYPE_CHECKING:
    import submitit

POLL_S = 2.0


def already_submitted(run_dir: Path, run_dir_given: bool) -> str | None:
    """Why this run is not submitted again (finished, or its job still queued or running); None to submit.
    Makes re-running a command (or a sweep) resume what stopped and leave alone what did not. Asked before the
    run dir is written: a run that is not submitted keeps its files as they are (`status` reads them).
    ``run_dir_given``: the user chose the run dir (run_dir=), so only another run_dir makes a new run."""
    from swiftslurm.ops.control import ACTIVE_STATES, facts_of

    if not (run_dir / rundir.JOB).is_file():
        return None
    facts = facts_of(run_dir)
    if facts.state == "finished":
        fresh = "a new run_dir=PATH" if run_dir_given else "a new run_name=NAME (or run_dir=PATH)"
        return f"already finished (job {facts.job_id}); not submitted again. HINT: {fresh} trains anew."
    if facts.state in ACTIVE_STATES:
        return f"already {facts.state} as job {facts.job_id}; not submitted again."
    return None


def dry_run_text(plan: JobPlan, run_dir: Path, not_written: str | None = None, notes: tuple[str, ...] = ()) -> str:
    """The dry run's report; ``not_written``: why the run dir was left as it is (its run finished or is queued);
    ``notes``: lines about the plan (the memory estimate) put before what was done, which ends the report."""
    how = f"sbatch {run_dir / rundir.SBATCH}" if plan.slurm else "python -m swiftslurm.node RUN_DIR"
    report = "\n".join([dry_run_report(plan), *(["", *notes] if notes else [])])
    if not_written is not None:
        left = f"Nothing submitted (dry_run=true), nothing written: {run_dir} is {not_written}"
        return f"{report}\n\n{left}"
    written = f"Nothing submitted (dry_run=true). Run directory written: {run_dir}"
    return f"{report}\n\n{written}\nSubmit by hand: {how}"


def ready_to_submit(plans: list[JobPlan]) -> None:
    """What submitting these runs needs here: the tiny model's files (checked once per cache, not per sweep
    point), and no cancel mark (submitting again is resuming)."""
    from swiftslurm import tiny

    for cache in sorted({plan.tiny_cache for plan in plans if plan.tiny_cache}):
        tiny.build_tiny_assets(Path(cache))
    for plan in plans:
        (Path(plan.run_dir) / rundir.CANCELLED).unlink(missing_ok=True)


_LOSS = re.compile(r"\{'loss': '([^']+)'.*?'global_step/max_steps': '([^']+)'")


def follow(job: submitit.Job[Any], plan: JobPlan) -> None:
    """Print training progress (the loss lines of node 0's log) until the job ends."""
    seen: dict[Path, int] = {}
    while not job.done():
        time.sleep(POLL_S)
        for log in sorted(rundir.leader_logs(plan.run_dir)):
            text = log.read_text(errors="replace")
            for match in _LOSS.finditer(text, seen.get(log, 0)):
                print(f"  step {match.group(2)}  loss {match.group(1)}", flush=True)
                seen[log] = match.end()  # a line still being written is matched next time


def wait_for(job: submitit.Job[Any], plan: JobPlan) -> int:
    """Wait for the job; print the result. Exit status 0 only if every node finished cleanly."""
    import submitit

    follow(job, plan)
    try:
        job.results()
    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as err:
        report(RunFailed(f"job {job.job_id} failed: {str(err).strip()[-2000:]}"))
        print(result_summary(plan), file=sys.stderr)
        return 1
    print(f"job {job.job_id} finished.\n{result_summary(plan)}")
    return 0
