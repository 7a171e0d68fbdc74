"""Put this SLURM job back in the queue (same job id) for the next attempt, with the decision's exclusions
and back-off, and wait for SLURM to end this attempt."""

from __future__ import annotations

import signal
import time
from typing import NoReturn

from swiftslurm import slurm_cli
from swiftslurm.errors import SwiftSlurmError
from swiftslurm.node import decide
from swiftslurm.node.slurm_env import SlurmEnv, configured_exclusions
from swiftslurm.plan import JobPlan


def requeue(where: SlurmEnv, plan: JobPlan, decision: decide.Decision) -> NoReturn:
    """Requeue this job (same id); exclusions and back-off are set on it once it is pending again."""
    # `scontrol requeue` TERMs this very step; the update that follows must still get through.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    job = str(where.job_id)
    try:
        slurm_cli.run(["scontrol", "requeue", job])
    except SwiftSlurmError as err:
        if "pending" not in str(err).lower():  # SLURM requeued it already (node failure): carry on
            raise
    updates = _updates(plan, decision)
    if updates:
        slurm_cli.run(["scontrol", "update", f"JobId={job}", *updates])
    if not _excluded(plan, decision):  # clear exclusions that expired (ExcNodeList stays on a requeued job)
        try:
            slurm_cli.run(["scontrol", "update", f"JobId={job}", "ExcNodeList="])
        except SwiftSlurmError as err:  # the job keeps its old exclusions: it still runs, on fewer nodes
            print(f"[swiftslurm] could not clear the job's excluded nodes: {err}", flush=True)
    # Wait here for SLURM to end this attempt (TERM is ignored, KILL follows after KillWait): returning
    # would let submitit record a result, and its waiter would take the requeued job for finished.
    while True:
        time.sleep(60)


def _updates(plan: JobPlan, decision: decide.Decision) -> list[str]:
    """`scontrol update` fields for the pending job: hosts to avoid and when to start."""
    updates = []
    if excluded := _excluded(plan, decision):
        updates.append(f"ExcNodeList={','.join(excluded)}")
    if decision.delay_s > 0:
        updates.append(f"StartTime=now+{int(decision.delay_s)}")
    return updates


def _excluded(plan: JobPlan, decision: decide.Decision) -> list[str]:
    """The job's whole exclusion list (ExcNodeList replaces it): the cluster config's and the decision's."""
    configured = configured_exclusions(plan)
    return sorted({*configured, *decision.exclude_hosts})
