"""The steps of submitting one run, shared by a single run (`__main__.run`) and every point of a sweep
(`sweeper.py`): whether a run dir is submitted again, whether it may be written (planned again in place),
where the run will resume, the dry-run text, what a submission needs on this machine. Waiting for the job
is ops/waiting.py's. Login side only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from swiftslurm.errors import ConfigError
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import layout as rundir
from swiftslurm.submit.report import dry_run_report


def already_submitted(run_dir: Path, run_dir_given: bool) -> str | None:
    """Why this run is not submitted again (finished, or its job still queued or running); None to submit.
    Makes re-running a command (or a sweep) resume what stopped and leave alone what did not. Asked before the
    run dir is written: a run that is not submitted keeps its files as they are (`status` reads them).
    ``run_dir_given``: the user chose the run dir (run_dir=), so only another run_dir makes a new run."""
    from swiftslurm.ops.runs import ACTIVE_STATES, facts_of

    if not (run_dir / rundir.JOB).is_file():
        return None
    facts = facts_of(run_dir)
    if facts.state == "finished":
        fresh = "a new run_dir=PATH" if run_dir_given else "a new run_name=NAME (or run_dir=PATH)"
        return f"already finished (job {facts.job_id}); not submitted again. HINT: {fresh} trains anew."
    if facts.state in ACTIVE_STATES:
        return f"already {facts.state} as job {facts.job_id}; not submitted again."
    return None


@dataclass(frozen=True)
class RunDirCheck:
    """What writing a run dir needs, found before anything is written: job.sbatch's text (SLURM), and the
    settings in which the run the dir holds differs from this plan, when that run may be replaced (it
    committed nothing and no job of it is queued or running; otherwise the check refuses)."""

    sbatch: str | None
    replaces: tuple[str, ...] = ()

    def note(self, run_dir: Path) -> str | None:
        """The line that says the run dir was planned again in place, or None."""
        if not self.replaces:
            return None
        return (
            f"{run_dir} held a run planned with different settings ({'; '.join(self.replaces)}) that committed "
            f"no checkpoint: planned again in place; its files are kept in {run_dir / rundir.REPLACED}/."
        )


def check_same_run(plan: JobPlan, existing: Path) -> tuple[str, ...]:
    """A run dir continues its own run: the settings in which the run it holds differs from ``plan`` (none:
    the same run). A different run may be replaced only while it has nothing to lose: no committed
    checkpoint, no job queued or running; otherwise the refusal names the settings that differ."""
    try:
        old = JobPlan.load(existing, any_version=True)  # an older swiftslurm's plan is planned again in place
    except (OSError, ValueError, TypeError) as err:  # half-written, edited by hand, or not a file
        raise ConfigError(
            f"run_dir {plan.run_dir} holds a {existing.name} that cannot be read ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:80]}). HINT: pass a new run_dir=PATH, or move the old directory away."
        ) from err
    changes = tuple(plan.identity_changes(old.identity_facts()))
    if changes and (kept := _what_would_be_lost(Path(plan.run_dir))):
        raise ConfigError(
            f"run_dir {plan.run_dir} holds a run planned with different settings ({'; '.join(changes)}) "
            f"and {kept}; re-using it would resume that run with other settings. HINT: pass a new "
            "run_dir=PATH (or run_name=NAME), or remove the old directory."
        )
    return changes


def _what_would_be_lost(run_dir: Path) -> str | None:
    """What a run dir's run has that planning it again would lose: a committed checkpoint, a live job."""
    from swiftslurm.ckpt.checkpoint import newest_committed
    from swiftslurm.ops.runs import ACTIVE_STATES, facts_of

    committed, _ = newest_committed(rundir.output_dir(run_dir))
    if committed is not None:
        return f"committed {committed.name}"
    facts = facts_of(run_dir)
    if facts.state in ACTIVE_STATES:
        return f"job {facts.job_id} {facts.state}"
    return None


def prepare_run_dir(plan: JobPlan, config_yaml: str) -> Path:
    """Create or re-use the run directory: config.yaml, plan.json and its digest, job.sbatch (SLURM), logs/."""
    return write_run_dir(plan, config_yaml, check_run_dir(plan))


def write_run_dir(plan: JobPlan, config_yaml: str, checked: RunDirCheck, durable: bool = True) -> Path:
    """Write a run dir as ``checked`` allows (the earlier run it holds set aside where it replaces one)."""
    from swiftslurm.submit import jobs as submit

    return submit.write_run_dir(plan, config_yaml, checked.sbatch, bool(checked.replaces), durable)


def check_run_dir(plan: JobPlan) -> RunDirCheck:
    """Everything writing the run dir would refuse, found before anything is written (a sweep checks every
    point first): a run dir holding another run that has something to lose, values #SBATCH cannot carry."""
    plan_path = rundir.plan_file(Path(plan.run_dir))
    replaces = check_same_run(plan, plan_path) if plan_path.exists() else ()
    from swiftslurm.render import render_sbatch

    sbatch = render_sbatch(plan) if plan.slurm is not None else None  # refuses values #SBATCH cannot carry
    return RunDirCheck(sbatch, replaces)


def resume_note(plan: JobPlan, remote_step: int | None) -> str | None:
    """Where the run will resume when that is a checkpoint in object storage newer than any in its run dir
    (a new run dir of a run name trained before, a wiped disk): said before it happens, not found afterwards."""
    from swiftslurm.ckpt.checkpoint import checkpoint_step, newest_committed

    if plan.storage is None or remote_step is None:
        return None
    local, _ = newest_committed(plan.output_dir)
    if local is not None and (checkpoint_step(local) or 0) >= remote_step:
        return None
    came = f"s3://{plan.storage.bucket}/{plan.storage.root}checkpoint-{remote_step}"
    return (
        f"will resume from {came}: the newest checkpoint under storage.prefix (planned with these settings), "
        f"newer than any in {plan.run_dir}. HINT: another storage.prefix (or run_name) trains anew."
    )


def dry_run_resume_note(plan: JobPlan) -> str | None:
    """The dry run's resume_note, when this shell has credentials to ask the store with (else what submitting
    will do); a store that cannot be asked is said, not an error: nothing is submitted."""
    from swiftslurm.errors import StorageError

    if plan.storage is None:
        return None
    if not any(name in os.environ for name in ("AWS_ACCESS_KEY_ID", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE")):
        return f"resume: {plan.storage.url} is asked for a newer checkpoint at submission (no credentials here)"
    try:
        from swiftslurm.submit.jobs import check_storage

        return resume_note(plan, check_storage(plan))
    except StorageError as err:
        return f"resume: could not ask {plan.storage.url} for a newer checkpoint: {str(err).splitlines()[0]}"


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
