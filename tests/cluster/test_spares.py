"""Hot spares (`resilience.spare_nodes=1`, docs/resilience.md "Hot spares") on the real local SLURM cluster with
real ms-swift: a job of 3 nodes trains on 2 while the third stands by; once the first checkpoint is committed,
training node 1 is lost as if it lost power (its slurmd, its wrapper and its trainer killed with -9). The run
goes on inside the same job (one run in `sacct`, SLURM_RESTART_COUNT 0) on node 0 and the spare, from that
commit, at the same world size, and ends with the very adapter of a run never interrupted. Meanwhile the spare
beats, and `status` shows it alive. (A spare whose wrapper died is skipped only once its beat is 180 s old: shown
by tests/component/test_spares.py with a real wrapper process, not here, where it would add minutes.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import checkpoint_step, newest_committed
from swiftslurm.ops.runs import gather
from swiftslurm.rundir.layout import attempt_dir, spare_beat_file
from swiftslurm.rundir.records import read_status
from swiftslurm.testing.cluster import (
    attempts,
    cancel_if_active,
    describe,
    exec_line,
    job_hosts,
    job_instances,
    logged_step,
    next_attempt,
    run_over,
    submit,
    wait_for_run_end,
    wait_until,
)
from swiftslurm.testing.nodes import cluster_state_dir, lose_node, restore_node
from tests.cluster.conftest import ADAPTER, LONG

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

FIRST_SAVE = 50  # LONG saves every 50 of 120 steps


def committed_step(run_dir: Path) -> int:
    newest, _ = newest_committed(run_dir / "output")
    return (checkpoint_step(newest) or 0) if newest else 0


def test_a_lost_training_node_is_replaced_by_the_spare_inside_the_same_job(
    tmp_path: Path, slurm_cluster: None, uninterrupted: bytes
) -> None:
    run_dir = tmp_path / "run"
    job = submit(run_dir, *LONG, "resilience.spare_nodes=1")
    lost: str | None = None
    try:
        over = run_over(run_dir, job)
        first = next_attempt(run_dir, [], over=over)
        assert first is not None, f"the run ended before its first attempt started: {read_status(run_dir)}"
        hosts = job_hosts(job)  # SLURM's order: node 0 and node 1 train, the third stands by
        assert len(hosts) == 3, hosts
        wait_until(lambda: committed_step(run_dir) >= FIRST_SAVE, 300, "the first commit", over=over)
        # The spare's wrapper beats while it stands by, and `status` shows it (node 0 names it in status.json).
        assert spare_beat_file(attempt_dir(run_dir, first), hosts[2]).is_file(), "the spare wrote no heartbeat"
        standing = gather(run_dir).spare_beats
        assert [(beat["host"], beat["alive"]) for beat in standing] == [(hosts[2], True)], standing
        lost = lost_host = hosts[1]
        lose_node(lost)
        lost_at = time.time()
        print(f"{first}: lost {lost} after step {logged_step(run_dir, first)}")
        second = next_attempt(run_dir, [first], over=over)
        assert second is not None, f"no attempt after the loss: {read_status(run_dir)}"
        # Back only once SLURM has let it go (down, the job resized without it), as a node that lost power comes
        # back: a slurmd that registers again before that finds its step missing, and srun ends the whole step.
        wait_until(lambda: lost not in job_hosts(job), 120, f"SLURM to take {lost} out of job {job}")
        restore_node(lost, cluster_state_dir())  # while a node is lost, slurm-local.sh status fails
        lost = None
        wait_until(lambda: logged_step(run_dir, second) > FIRST_SAVE, 300, f"{second}'s first resumed step")
        print(f"loss -> first resumed step ({second}): {time.time() - lost_at:.1f} s")
        state = wait_for_run_end(run_dir, job)
    finally:
        cancel_if_active(job)
        if lost is not None:
            restore_node(lost, cluster_state_dir())
    records = attempts(run_dir)
    for record in records:
        print(describe(record))
    assert state == "COMPLETED", (state, read_status(run_dir))
    # Never requeued: SLURM resized the job instead (sacct: a RESIZING row on 3 nodes, then the job on the 2 left).
    runs = job_instances(job)
    assert [state for state, _ in runs] == ["RESIZING", "COMPLETED"] and lost_host not in runs[-1][1], runs
    assert all(r["restart_count"] == 0 and r["job_id"] == job for r in records), records
    hit, *_, last = records
    assert (hit["attempt"], hit["decision"], hit["failed_host"]) == (job, "restart", hosts[1]), hit
    assert hit["hosts"] == hosts[:2] and hit["spares"] == [hosts[2]], hit
    assert hit["swaps"] == [[hosts[1], hosts[2]]], hit
    resumed = records[1]
    assert resumed["attempt"] == second == f"{job}.i1", resumed
    assert resumed["hosts"] == [hosts[0], hosts[2]] and resumed.get("spares", []) == [], resumed
    assert resumed["resume_step"] == hit["committed_step"] == FIRST_SAVE, resumed
    assert "--resume_from_checkpoint" in (exec_line(run_dir, second, 1) or ""), "the spare did not resume"
    assert (last["reason"], last["decision"], last["committed_step"]) == ("finished", "done", 120), last
    assert (run_dir / ADAPTER).read_bytes() == uninterrupted, "the final adapter differs from the uninterrupted run's"
    facts = gather(run_dir)
    assert (facts.spares_left, facts.swaps) == (0, ((hosts[1], hosts[2], "lost"),)), facts
