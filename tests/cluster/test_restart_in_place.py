"""Restart in place on the real local SLURM cluster with real ms-swift (docs/resilience.md, "Restart in
place"): a rank killed with -9 while both nodes are alive restarts inside the same job (same id, no requeue,
no queue wait) from the newest commit and finishes; a failure that never lets the committed step advance
ends the run with "stopped: no progress" and no requeue."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import checkpoint_step, newest_committed
from swiftslurm.rundir.records import read_status
from swiftslurm.testing.cluster import (
    attempts,
    cancel_if_active,
    describe,
    job_instances,
    kill_9,
    logged_step,
    next_attempt,
    submit,
    training_workers,
    wait_for_run_end,
    wait_for_training,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

CRASH_PLUGIN = Path(__file__).resolve().parent / "crash_plugin.py"
MAX_STEPS = 120
SAVE_STEPS = 15


def committed_step(run_dir: Path) -> int:
    newest, _ = newest_committed(run_dir / "output")
    return (checkpoint_step(newest) or 0) if newest else 0


def first_step_after(run_dir: Path, attempt: str, resume_step: int) -> None:
    wait_until(lambda: logged_step(run_dir, attempt) > resume_step, 300, f"{attempt}'s first resumed step")


def test_a_rank_killed_with_every_node_alive_restarts_in_the_same_job_and_finishes(
    tmp_path: Path, slurm_cluster: None
) -> None:
    run_dir = tmp_path / "run"
    job = submit(run_dir, f"swift.max_steps={MAX_STEPS}", f"swift.save_steps={SAVE_STEPS}")
    try:
        first = next_attempt(run_dir, [])
        assert first is not None, f"the run ended before its first attempt started: {read_status(run_dir)}"
        assert wait_for_training(run_dir, first), "the first attempt ended before training"
        wait_until(lambda: committed_step(run_dir) >= SAVE_STEPS, 300, "a first commit")
        wait_until(lambda: len(training_workers(run_dir)) == 2, 60, "both training workers")
        (rank, pid) = training_workers(run_dir)[1]  # rank 1: on node 1, the node that does not decide
        kill_9([pid])
        killed_at = time.time()
        print(f"{first}: kill -9 rank {rank} (PID {pid}) after step {logged_step(run_dir, first)}")
        second = next_attempt(run_dir, [first])
        assert second is not None, f"no attempt after the kill: {read_status(run_dir)}"
        wait_until(lambda: bool(attempts(run_dir)), 60, "the killed attempt's record")
        resume_step = attempts(run_dir)[0]["committed_step"]
        first_step_after(run_dir, second, resume_step)
        print(f"kill -9 -> first resumed step ({second}): {time.time() - killed_at:.1f} s")
        state = wait_for_run_end(run_dir, job)
    finally:
        cancel_if_active(job)
    records = attempts(run_dir)
    for record in records:
        print(describe(record))
    assert state == "COMPLETED", (state, read_status(run_dir))
    assert second == f"{job}.i1", second  # a new attempt of the same job, inside the same allocation
    killed, *_, last = records
    assert (killed["attempt"], killed["reason"], killed["decision"]) == (job, "infra", "restart"), killed
    assert records[1]["attempt"] == second and records[1]["resume_step"] == killed["committed_step"] > 0, records
    assert (last["reason"], last["decision"], last["committed_step"]) == ("finished", "done", MAX_STEPS), last
    assert all(r["restart_count"] == 0 and r["job_id"] == job for r in records), records  # never requeued
    assert [state for state, _ in job_instances(job)] == ["COMPLETED"], job_instances(job)  # one run of the job


def test_restarts_that_never_advance_the_committed_step_stop_the_run(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    plugin = (f"swift.external_plugins=[{CRASH_PLUGIN}]", "swift.callbacks=[crash]")
    job = submit(
        run_dir, "swift.max_steps=200", "swift.save_steps=100", "resilience.max_consecutive_failures=1", *plugin
    )
    try:
        state = wait_for_run_end(run_dir, job)
    finally:
        cancel_if_active(job)
    records = attempts(run_dir)
    for record in records:
        print(describe(record))
    assert [r["decision"] for r in records] == ["restart", "stop"], records
    assert [r["attempt"] for r in records] == [job, f"{job}.i1"], records
    status = read_status(run_dir) or {}
    assert status.get("state") == "failed" and str(status.get("why")).startswith("stopped: no progress"), status
    assert len(job_instances(job)) == 1 and state != "COMPLETED", (state, job_instances(job))  # no requeue
