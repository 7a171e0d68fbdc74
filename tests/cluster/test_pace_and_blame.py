"""Issue 25, items 15 and 16, on the real local SLURM cluster with real ms-swift: a run whose steps and saves are
longer than the step ceiling (its logged lines farther apart than it) is not taken for hung; and a failure on
node 1 is the attempt's cause, not node 0's trainer that its wrapper ended for it."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftslurm.testing.cluster import attempts, cancel_if_active, describe, status, submit, wait_for_run_end

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
SLOW_PACE = HERE / "slow_pace_plugin.py"  # steps of 5 s, saves of 30 s more (slow_pace_plugin.STEP_S, SAVE_S)
OOM = HERE / "oom_plugin.py"


def test_steps_logged_further_apart_than_the_ceiling_and_a_long_first_save_are_not_a_hang(
    tmp_path: Path, slurm_cluster: None
) -> None:
    """With `logging_steps=5` the logged lines come 25 s apart and the first save takes 30 s, both above
    `hang_timeout_s=20`: the watchdog that read the lines called this run hung at its second one."""
    run_dir = tmp_path / "run"
    job = submit(
        run_dir,
        f"swift.external_plugins=[{SLOW_PACE}]",
        "swift.callbacks=[slow_pace]",
        "swift.logging_steps=5",
        "swift.max_steps=10",
        "swift.save_steps=5",
        "resilience.hang_window_floor_s=5",
        "resilience.hang_timeout_s=20",
        "resilience.pause_timeout_s=100",
    )
    try:
        state = wait_for_run_end(run_dir, job, timeout_s=900)
    finally:
        cancel_if_active(job)
    records = attempts(run_dir)
    for record in records:
        print(describe(record))
    assert state == "COMPLETED" and len(records) == 1, (state, records)
    (only,) = records
    assert (only["reason"], only["hang"], only["last_step"]) == ("finished", None, 10), only


def test_an_oom_on_node_1_stops_the_run_as_a_user_error_naming_node_1(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    job = submit(run_dir, f"swift.external_plugins=[{OOM}]", "swift.callbacks=[oom]", "swift.max_steps=40")
    try:
        wait_for_run_end(run_dir, job)
    finally:
        cancel_if_active(job)
    records = attempts(run_dir)
    for record in records:
        print(describe(record))
    assert len(records) == 1, records  # not retried: the same batch runs out of memory again
    (only,) = records
    assert (only["reason"], only["decision"]) == ("user_error", "stop"), only["why"]
    assert "failed first: torch.OutOfMemoryError: CUDA out of memory" in only["why"], only["why"]
    assert only["why"].startswith("user error: node 1 (") and only["failed_host"] is None, only
    assert status(run_dir).get("state") == "failed", status(run_dir)
