"""Issue 30, part 2: `resilience.straggler_action=swap` on the real local SLURM cluster with real ms-swift. A job of
3 nodes trains on 2 while the third stands by (`resilience.spare_nodes=1`); from step SLOW_FROM one HOST's training
forwards take 1.5 times as long (slow_node_plugin.py, by host: the spare that takes its node rank is not slowed).
Node 0 names that host, every node stops at a checkpoint, and the attempt restarts in place inside the same job
(one run in `sacct`, SLURM_RESTART_COUNT 0), the spare at node rank 1, from that stop checkpoint; the slow host
trains no more, and the run completes.

Nothing is timed: the slowness is forced (1.5× against 1.2×), and the run is longer than naming can take on any
machine: each step lasts at least STEP_FLOOR_S (step_floor_plugin.py), and naming takes a bounded wall time (see
MAX_STEPS)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftslurm.ops.runs import gather
from swiftslurm.rundir.records import read_status
from swiftslurm.testing.cluster import (
    attempts,
    cancel_if_active,
    describe,
    exec_line,
    job_hosts,
    job_instances,
    node_log,
    run_over,
    submit,
    wait_for_run_end,
    wait_until,
)
from swiftslurm.testing.node_group import group_nodes

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
PLUGINS = f"swift.external_plugins=[{HERE / 'step_floor_plugin.py'},{HERE / 'slow_node_plugin.py'}]"
SLOW_FROM = 10
FORWARD_S = 0.05  # every node's forward floor (slow_node_plugin.py), as test_stragglers.py: the cores' noise is small
# Naming needs the pace's median to turn (~8 slow steps after the 5 warm-up ones), a pace written and read every 5 s
# (PUBLISH_S) and resilience.straggler_s=10 slow: ~30 s, at most 120 steps at the 0.25 s floor on the fastest
# machine; a slower one makes fewer. 200 steps leave the restart onto the spare at least 80 to train. One save, at
# the last step: the stop checkpoint is then the only one the next attempt can resume from.
MAX_STEPS = 200
RUN = (
    f"swift.max_steps={MAX_STEPS}",
    f"swift.save_steps={MAX_STEPS}",
    "resilience.spare_nodes=1",
    "resilience.straggler_action=swap",
    "resilience.straggler_s=10",
    PLUGINS,
    "swift.callbacks=[step_floor,slow_node]",
    f"+cluster.env.SWIFTSLURM_TEST_SLOW_FROM='{SLOW_FROM}'",
    f"+cluster.env.SWIFTSLURM_TEST_FORWARD_S='{FORWARD_S}'",
)


def test_a_straggler_is_swapped_for_the_spare_inside_the_same_job(tmp_path: Path, slurm_cluster: None) -> None:
    nodes = group_nodes()
    assert len(nodes) >= 3, nodes
    # SLURM gives a job of 3 nodes the partition's first 3 in order when the others are excluded: node 0 leads,
    # node 1 (the slow host) trains, the third stands by.
    slow, pinned = nodes[1], [f"cluster.exclude={','.join(nodes[3:])}"] if len(nodes) > 3 else []
    run_dir = tmp_path / "run"
    job = submit(run_dir, *RUN, *pinned, f"+cluster.env.SWIFTSLURM_TEST_SLOW_HOST='{slow}'")
    try:
        over = run_over(run_dir, job)
        hosts = wait_until(lambda: job_hosts(job), 120, f"job {job}'s nodes", over=over)
        assert hosts == nodes[:3], (hosts, nodes)
        state = wait_for_run_end(run_dir, job)
    finally:
        cancel_if_active(job)
    records = attempts(run_dir)
    for record in records:
        print(describe(record))
    assert state == "COMPLETED", (state, read_status(run_dir))
    assert [state for state, _ in job_instances(job)] == ["COMPLETED"]  # never requeued
    assert all(r["restart_count"] == 0 and r["job_id"] == job for r in records), records
    hit, resumed, *_ = records
    # Named, stopped at a checkpoint, and swapped for the spare at its node rank
    assert (hit["attempt"], hit["reason"], hit["decision"]) == (job, "straggler", "restart"), hit
    assert hit["hosts"] == hosts[:2] and hit["spares"] == [hosts[2]], hit
    assert (hit["swaps"], hit["swap_why"]) == ([[slow, hosts[2]]], "straggler"), hit
    (named,) = [s for s in hit["stragglers"] if s.get("swap")]
    assert (named["node"], named["host"]) == (1, slow) and named["since_step"] >= SLOW_FROM, named
    stop = hit["stop"]["step"]
    assert stop is not None and hit["committed_step"] == stop < MAX_STEPS, hit  # the stop checkpoint is committed
    assert f"a straggler swapped for a spare: node 1 ({slow})" in node_log(run_dir, job, 0)
    # Resumed from it on node 0 and the spare, at the same world size; the slow host trains no more
    assert resumed["attempt"] == f"{job}.i1" and resumed["hosts"] == [hosts[0], hosts[2]], resumed
    assert resumed["resume_step"] == stop and resumed["resumed_from"].endswith(f"checkpoint-{stop}"), resumed
    assert "--resume_from_checkpoint" in (exec_line(run_dir, resumed["attempt"], 1) or ""), "the spare did not resume"
    assert all(slow not in r["hosts"] for r in records[1:]), records
    last = records[-1]
    assert (last["reason"], last["decision"], last["committed_step"]) == ("finished", "done", MAX_STEPS), last
    facts = gather(run_dir)
    assert (facts.spares_left, facts.swaps) == (0, ((slow, hosts[2], "straggler"),)), facts
