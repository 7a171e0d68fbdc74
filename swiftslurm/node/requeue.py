"""Put this SLURM job back in the queue (same job id) for the next attempt, with the decision's exclusions
and back-off, and end this attempt's process at once (Requeued). The requeue is asked again while slurmctld
does not answer (slurm.requeue); when it still fails, SlurmError reaches the caller, which records it. Once
the job is requeued, a failure to set its back-off or exclusions is only logged: the job comes back regardless."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import NoReturn

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import SwiftSlurmError
from swiftslurm.node import decide
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import records
from swiftslurm.signals import ignore_from_now_on
from swiftslurm.slurm_env import SlurmEnv, configured_exclusions


class Requeued(SystemExit):
    """SLURM has accepted the requeue: this process ends now, with exit code 0, and returns nothing. Not
    returning matters: submitit would record the returned value as the job's result, and its waiter
    (`wait=true`) would take the requeued job for finished. A SystemExit passes submitit's `except
    Exception` around the job without a result being written, unwinds this process's own cleanups, and ends
    it before SLURM's KillWait instead of being KILLed after it (the old run's step ends, and the job is
    pending again, ~KillWait sooner: docs/resilience.md, "Measured")."""

    def __init__(self, job: str) -> None:
        super().__init__(0)
        self.job = job


def requeue(where: SlurmEnv, plan: JobPlan, decision: decide.Decision) -> NoReturn:
    """Requeue this job (same id); exclusions and back-off are set on it once it is pending again; then
    raise Requeued. Raises SlurmError when SLURM did not requeue it."""
    # `scontrol requeue` TERMs this very step; the update that follows must still get through.
    ignore_from_now_on((signal.SIGTERM,))
    job = str(where.job_id)
    slurm_cli.requeue(job)
    if updates := _updates(plan, decision):
        try:
            slurm_cli.update_job(job, updates)
        except SwiftSlurmError as err:  # requeued all the same: it may start sooner, or on an excluded host
            print(f"[swiftslurm] job {job} is requeued, but without {', '.join(updates)}: {err}", flush=True)
    if decision.nodes is not None:
        _set_node_count(job, decision.nodes, _cpus_per_task(plan))
    if not _excluded(plan, decision) and _excluded_before(plan):  # ExcNodeList stays on a requeued job: clear it
        try:
            slurm_cli.update_job(job, {"ExcNodeList": ""})
        except SwiftSlurmError as err:  # the job keeps its old exclusions: it still runs, on fewer nodes
            print(f"[swiftslurm] could not clear the job's excluded nodes: {err}", flush=True)
    print(f"[swiftslurm] job {job} requeued: this attempt ends now", flush=True)
    raise Requeued(job)


def _set_node_count(job: str, nodes: int, cpus_per_task: int) -> None:
    """Ask for exactly ``nodes`` nodes, one task each (a run that may shrink: decide.with_node_count). A
    range ("2-2") because a bare count may leave the job's old maximum in place. NumCPUs too: SLURM 22.05 keeps
    the job's old total, and 3 nodes' CPUs asked of 2 nodes leave the job pending for good (BadConstraints).
    On failure the job keeps the node count it had: it still runs once that many nodes are there."""
    shape = {"NumNodes": f"{nodes}-{nodes}", "NumTasks": str(nodes), "NumCPUs": str(nodes * cpus_per_task)}
    try:
        slurm_cli.update_job(job, shape)
    except SwiftSlurmError as err:
        print(f"[swiftslurm] could not set the job's node count to {nodes}: {err}", flush=True)


def _cpus_per_task(plan: JobPlan) -> int:
    """--cpus-per-task of the job (one task per node); SLURM's default is 1."""
    return (plan.slurm.cpus_per_task if plan.slurm else None) or 1


def _updates(plan: JobPlan, decision: decide.Decision) -> dict[str, str]:
    """`scontrol update` fields for the pending job: hosts to avoid and when to start."""
    updates = {}
    if excluded := _excluded(plan, decision):
        updates["ExcNodeList"] = ",".join(excluded)
    if decision.delay_s > 0:
        updates["StartTime"] = f"now+{int(decision.delay_s)}"
    return updates


def _excluded_before(plan: JobPlan) -> bool:
    """Whether an earlier requeue of this run may have left hosts in the job's ExcNodeList (an attempt decided to
    exclude some): only then is there anything to clear. Without one, the clearing `scontrol update` was a
    controller call on every requeue for nothing."""
    return any(attempt.exclude_hosts for attempt in records.read_attempts(Path(plan.run_dir)))


def _excluded(plan: JobPlan, decision: decide.Decision) -> list[str]:
    """The job's whole exclusion list (ExcNodeList replaces it): the cluster config's and the decision's."""
    configured = configured_exclusions(plan)
    return sorted({*configured, *decision.exclude_hosts})
