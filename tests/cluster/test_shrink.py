"""Resume on fewer nodes (`resilience.min_nodes=2`) on the real local SLURM cluster (three slurmd nodes,
scripts/slurm-local.sh), with real ms-swift: a 3-node run loses a node for good mid-run, resumes on the other
two from its newest committed checkpoint with the same global batch (gradient accumulation 2 -> 3), and
finishes; its losses are compared with an uninterrupted 3-node run of the same plan.

Tolerances, and why: the tiny model's per-step loss (logged every 5 steps) is noisy, and ms-swift's sampler
draws its permutation over `len(dataset) // world_size * world_size` samples, so with the 400-sample tiny
dataset the 2-node order after the resume is not the 3-node one (400 is not a multiple of 3). The same
global batch, learning-rate schedule and step count must still land where the uninterrupted run does:
- FINAL_TOLERANCE: the mean loss of the last LAST_LOGS logged steps within 5 % of the uninterrupted run's.
- JUMP_TOLERANCE: the first LAST_LOGS losses after the resume within 5 % of the uninterrupted run's at the
  same steps. The tiny model's loss moves only ~7 % in 60 steps, so a restart from scratch or a reset
  schedule is caught by the exact checks instead: `--resume_from_checkpoint` in the resumed command and the
  learning rate equal to the uninterrupted run's at every logged step.

Measured on 2026-12-01 (60 steps, node 3 lost after checkpoint-10): 0.1 % just after the resume, 0.0 % at the
end, for ddp and zero2; the learning rate equal at every logged step.
"""

from __future__ import annotations

import contextlib
import json
import re
import statistics
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import checkpoint_step, newest_committed
from swiftslurm.ops.runs import gather
from swiftslurm.rundir.records import read_status
from swiftslurm.testing.cluster import (
    FAST_RETRIES,
    attempt_ids,
    attempts,
    cancel_if_active,
    exec_line,
    job_hosts,
    node_log,
    run_over,
    submit,
    wait_for_run_end,
    wait_until,
)
from swiftslurm.testing.nodes import cluster_state_dir, lose_node, restore_node

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STEPS = 60
SAVE_STEPS = 10
LAST_LOGS = 5
FINAL_TOLERANCE = 0.05  # measured 2026-12-01: 0.0 % (ddp and zero2)
JUMP_TOLERANCE = 0.05  # measured: 0.1 %
LOSS_LINE = re.compile(r"'loss': '([\d.]+)'.*?'global_step/max_steps': '(\d+)/\d+'")
SHRINKING = (
    "cluster.nodes=3",
    "global_batch_size=6",  # micro 1 × 3 ranks × accumulation 2; on 2 nodes: × 2 ranks × 3
    "resilience.min_nodes=2",
    # Each node's 2 CPUs: 6 CPUs cannot come from 2 nodes, so the requeue must ask for 4 (NumCPUs), as on a real
    # cluster where cpus_per_task is a whole node's cores.
    "cluster.cpus_per_task=2",
    f"swift.max_steps={STEPS}",
    f"swift.save_steps={SAVE_STEPS}",
    *FAST_RETRIES,
)
# zero2: the leader converts checkpoint-10 (3 optimizer shards) to its universal form for 2 ranks.
STRATEGIES = ["strategy=ddp", "strategy=zero2"]


def losses(run_dir: Path) -> dict[int, float]:
    """step -> loss, as node 0 logged them, over every attempt (a later attempt's log wins for a step)."""
    found: dict[int, float] = {}
    for attempt in attempt_ids(run_dir):
        for loss, step in LOSS_LINE.findall(node_log(run_dir, attempt, 0)):
            found[int(step)] = float(loss)
    return found


def schedule(run_dir: Path) -> dict[int, tuple[float, float]]:
    """step -> (learning rate, epoch) from ms-swift's logging.jsonl (a later attempt's line wins for a step)."""
    found: dict[int, tuple[float, float]] = {}
    for line in (run_dir / "output" / "logging.jsonl").read_text().splitlines():
        with contextlib.suppress(ValueError, KeyError):
            record = json.loads(line)
            step = int(str(record["global_step/max_steps"]).split("/")[0])
            found[step] = (float(record["learning_rate"]), float(record["epoch"]))
    return found


def mean_at(curve: dict[int, float], steps: list[int]) -> float:
    return statistics.fmean(curve[s] for s in steps)


def run_uninterrupted(tmp_path: Path, strategy: str) -> dict[int, float]:
    run_dir = tmp_path / "whole"
    job = submit(run_dir, strategy, *SHRINKING)
    try:
        assert wait_for_run_end(run_dir, job, timeout_s=1800) == "COMPLETED", read_status(run_dir)
    finally:
        cancel_if_active(job)
    return losses(run_dir)


def lose_a_node_for_good(run_dir: Path, job: str) -> tuple[str, str]:
    """Once the first attempt has committed a checkpoint, lose its last node (never node 0, whose wrapper
    decides); return (the lost node, the attempt it ran)."""
    over = run_over(run_dir, job)
    first = wait_until(lambda: next(iter(attempt_ids(run_dir)), None), 600, "the first attempt", over=over)

    # Committed (its manifest written), not only begun: a node lost mid-save leaves nothing to resume from.
    def committed() -> bool:
        newest, _ = newest_committed(run_dir / "output")
        return newest is not None and checkpoint_step(newest) >= SAVE_STEPS

    wait_until(committed, 900, "a first committed checkpoint", over=over)
    hosts = job_hosts(job)
    assert len(hosts) == 3, hosts
    lose_node(hosts[2])
    return hosts[2], first


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_lost_node_resumes_on_two_with_the_same_global_batch(
    tmp_path: Path, slurm_cluster: None, strategy: str
) -> None:
    whole = run_uninterrupted(tmp_path, strategy)
    run_dir = tmp_path / "shrunk"
    job = submit(run_dir, strategy, *SHRINKING)
    lost: str | None = None
    try:
        lost, victim = lose_a_node_for_good(run_dir, job)
        state = wait_for_run_end(run_dir, job, timeout_s=1800)  # the node stays lost until the run ended
    finally:
        cancel_if_active(job)
        if lost is not None:
            restore_node(lost, cluster_state_dir())
    records = attempts(run_dir)
    for record in records:
        print({k: record.get(k) for k in ("attempt", "hosts", "nodes", "next_nodes", "reason", "decision", "why")})
    assert state == "COMPLETED" and (read_status(run_dir) or {}).get("state") == "finished", records
    ids = [r["attempt"] for r in records]
    hit, later = records[ids.index(victim)], records[ids.index(victim) + 1 :]
    assert (hit["nodes"], hit["next_nodes"]) == (3, 2), hit
    assert later and later[-1]["decision"] == "done", later
    for record in later:
        assert record["nodes"] == 2 and lost not in record["hosts"], record
    shown = gather(run_dir).attempt_reasons  # what `status` lists: each attempt with its node count
    assert shown[ids.index(victim)].endswith("on 3 nodes") and shown[-1] == "finished→done on 2 nodes", shown
    resumed = later[0]["attempt"]
    command = exec_line(run_dir, resumed, 0) or ""
    assert "--resume_from_checkpoint" in command and command.endswith("--gradient_accumulation_steps 3"), command
    # ZeRO-2's 3 optimizer shards load at 2 ranks only from the universal form node 0 made beside the checkpoint.
    assert (f"checkpoint-{later[0]['resume_step']}-universal" in command) == (strategy == "strategy=zero2"), command
    assert_losses_continue(whole, losses(run_dir), int(later[0]["resume_step"]))
    # Same global batch: the learning-rate schedule goes on exactly as uninterrupted, and the data position
    # (epoch) with it; HF counts the epoch in per-rank batches (400 // 3 a rank on 3 nodes, 200 on 2), so it
    # agrees to rounding, not exactly.
    planned, shrunk = schedule(tmp_path / "whole"), schedule(run_dir)
    after = [s for s in sorted(shrunk) if s > int(later[0]["resume_step"])]
    same = [shrunk[s][0] == pytest.approx(planned[s][0], rel=1e-6) for s in after]
    near = [shrunk[s][1] == pytest.approx(planned[s][1], rel=0.01) for s in after]
    assert after and all(same) and all(near), (
        {s: shrunk[s] for s in after[:5]},
        {s: planned.get(s) for s in after[:5]},
    )


def assert_losses_continue(whole: dict[int, float], shrunk: dict[int, float], resume_step: int) -> None:
    after = sorted(s for s in shrunk if s > resume_step)[:LAST_LOGS]
    last = sorted(whole)[-LAST_LOGS:]
    assert after and all(s in whole for s in after), (after, sorted(whole))
    jump = abs(mean_at(shrunk, after) - mean_at(whole, after)) / mean_at(whole, after)
    final = abs(mean_at(shrunk, last) - mean_at(whole, last)) / mean_at(whole, last)
    print(f"after the resume at {resume_step}: {jump:.1%} from the uninterrupted run; at the end: {final:.1%}")
    assert jump <= JUMP_TOLERANCE, ({s: shrunk[s] for s in after}, {s: whole[s] for s in after})
    assert final <= FINAL_TOLERANCE, ({s: shrunk[s] for s in last}, {s: whole[s] for s in last})
