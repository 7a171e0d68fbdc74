"""Issue 15, item 2: a real hang in a real collective (rank 1 never reaches a step's all-reduce), on the real
SLURM cluster with real ms-swift: found within the learned window, every rank's stacks saved, restarted inside
the same allocation, finished."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import is_committed
from swiftslurm.rundir.layout import hang_file, stack_file, stacks_dir
from swiftslurm.testing.cluster import attempts, status, submit, wait_for_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
HANG_PLUGIN = Path(__file__).resolve().parent / "hang_plugin.py"
HANG_STEP = 27  # hang_plugin.HANG_STEP (importing it would import ms-swift here)
FLOOR_S, CEILING_S = 10.0, 120.0  # the ceiling is well inside Gloo's own timeout (cluster.nccl.timeout_s=300)
POLL_S = 0.5  # node/watch.py's POLL_S: the watchdog looks this often


def test_a_rank_blocked_in_a_collective_is_found_within_its_window_with_every_ranks_stacks(
    tmp_path: Path, slurm_cluster: None
) -> None:
    run_dir = tmp_path / "run"
    job = submit(
        run_dir,
        f"swift.external_plugins=[{HANG_PLUGIN}]",
        "swift.callbacks=[hang]",
        "swift.logging_steps=1",  # a gap per step: the window is learned from the steps before the hang
        f"resilience.hang_window_floor_s={FLOOR_S}",
        f"resilience.hang_timeout_s={CEILING_S}",
        "resilience.backoff_base_s=1",
    )
    assert wait_for_job(job) == "COMPLETED"
    hung, *_, last = attempts(run_dir)
    assert (hung["reason"], hung["decision"]) == ("infra", "restart"), hung["why"]
    hang = hung["hang"]
    assert hang["step"] == HANG_STEP - 1 and "step gaps" in hang["basis"], hang
    # Learned from this run's own steps, within the configured floor and ceiling; found one poll after it.
    assert FLOOR_S <= hang["window_s"] <= CEILING_S
    assert hang["window_s"] <= hang["stalled_s"] <= hang["window_s"] + 10 * POLL_S, hang  # stalled_s: 0.1 s
    assert last["hang"] is None  # the end of training (final save, exit) is not taken for a hang
    here = Path(hang["stacks"]).parent
    assert json.loads(hang_file(here).read_text())["step"] == HANG_STEP - 1
    assert hang["stacks_missing"] == [] and f"stacks of every rank in {stacks_dir(here)}" in hung["why"]
    blocked = stack_file(stacks_dir(here), 1).read_text()
    waiting = stack_file(stacks_dir(here), 0).read_text()
    assert "rank_1_never_reaches_the_all_reduce" in blocked, blocked
    assert "torch/nn/parallel/distributed.py" in waiting or "torch/autograd" in waiting, waiting

    blocked_at = (run_dir / "hang.once").stat().st_mtime  # hang_plugin.MARKER, written as rank 1 blocks
    figures = {
        "window_s": hang["window_s"],
        "basis": hang["basis"],
        "blocked_to_detected_s": round(hang["detected_at"] - blocked_at, 1),
        "detected_to_record_s": round(hung["end"] - hang["detected_at"], 1),
        "blocked_to_resumed_first_step_s": round(last["first_step_at"] - blocked_at, 1),
    }
    print(f"[hang figures] {json.dumps(figures)}")

    assert last["job_id"] == hung["job_id"] and last["reason"] == "finished"
    assert last["attempt"] == f"{hung['attempt']}.i1", last["attempt"]  # restarted in place, same job
    assert last["resume_step"] == hung["committed_step"] == 20
    assert is_committed(run_dir / "output" / "checkpoint-40") and status(run_dir)["state"] == "finished"
