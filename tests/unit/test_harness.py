"""The shared test harness (swiftslurm.testing): its waits end when what they wait for can no longer happen, and
the product never imports it. A fake run here: a run dir written by hand, SLURM's word a function."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from swiftslurm.testing.cluster import (
    RunEnd,
    RunOver,
    TimedOut,
    _started_at,
    next_attempt,
    previous_attempt_end,
    run_over,
    wait_until,
)
from swiftslurm.testing.speed import REFERENCE_S, slowdown
from tests.unit.test_layout import module_graph


def fake_run(tmp_path: Path, state: str, attempts: dict[str, int] | None = None) -> Path:
    """A run dir whose status.json says ``state``, with the given attempts' node logs (nodes that started
    ms-swift each have the wrapper's exec line)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "status.json").write_text(json.dumps({"state": state}))
    for attempt, started_nodes in (attempts or {}).items():
        (run_dir / "logs" / attempt).mkdir(parents=True)
        for node in range(started_nodes):
            (run_dir / "logs" / attempt / f"node{node}.log").write_text("[swiftslurm] exec: swift sft ...\n")
    return run_dir


def test_waiting_for_the_next_attempt_of_a_finished_run_returns_none_at_once(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "finished", {"7": 2})
    started = time.monotonic()
    assert next_attempt(run_dir, ["7"], timeout_s=600) is None
    assert time.monotonic() - started < 1


def test_an_attempt_that_started_before_the_run_ended_is_still_found(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "finished", {"7": 2, "7.r1": 2})
    assert next_attempt(run_dir, ["7"], timeout_s=600) == "7.r1"


def test_an_attempt_is_new_only_once_both_nodes_started_ms_swift(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "finished", {"7": 2, "7.r1": 1})
    assert next_attempt(run_dir, ["7"], timeout_s=600) is None


def test_a_wait_ends_at_once_with_why_it_cannot_happen(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "failed")
    started = time.monotonic()
    with pytest.raises(
        RunOver, match=re.escape("step 300: cannot happen any more (the run has ended: status.json says failed)")
    ):
        wait_until(lambda: False, 600, "step 300", over=run_over(run_dir))
    assert time.monotonic() - started < 1


def test_a_running_run_is_waited_for_until_the_time_is_up(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "running")
    with pytest.raises(TimedOut, match="after 0 s waiting for step 300"):
        wait_until(lambda: False, 0.1, "step 300", poll_s=0.01, over=run_over(run_dir))


def test_a_job_that_ended_without_the_run_saying_so_ends_the_wait_after_the_grace(tmp_path: Path) -> None:
    """A requeue passes through states that look final: only a job that stays ended ends the run."""
    run_dir = fake_run(tmp_path, "running")
    slurm = {"final": "NODE_FAIL"}
    over = RunEnd(run_dir, "7", grace_s=0.05, job_final=lambda job: slurm["final"])
    assert over() is None  # just ended: may be a requeue
    slurm["final"] = None  # requeued: pending again
    time.sleep(0.06)
    assert over() is None
    slurm["final"] = "CANCELLED"
    assert over() is None
    time.sleep(0.06)
    assert over() == "job 7 has been CANCELLED for 0 s without the run saying it ended"


def test_the_product_never_imports_the_harness() -> None:
    graph = module_graph()
    product = [m for m in graph if not m.startswith("swiftslurm.testing")]
    assert sorted((m, o) for m in product for o in graph[m] if o.startswith("swiftslurm.testing")) == []


def test_a_process_start_is_read_from_proc_as_epoch_seconds() -> None:
    """The soak tells a new attempt's workers from an earlier attempt's still exiting by when they started."""
    stat = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    assert 0 <= time.time() - _started_at(stat) < 3600  # this test process started moments ago


def test_the_previous_attempt_ends_at_the_newest_other_record(tmp_path: Path) -> None:
    run_dir = fake_run(tmp_path, "running")
    rows = [{"attempt": "4", "end": 100.0}, {"attempt": "4.i1", "end": 250.5}]
    (run_dir / "attempts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert previous_attempt_end(run_dir, "4.i2") == 250.5
    assert previous_attempt_end(run_dir, "4.i1") == 100.0  # its own record (written once it ended) is not earlier
    (tmp_path / "new").mkdir()
    assert previous_attempt_end(fake_run(tmp_path / "new", "running"), "1") == 0.0


@pytest.mark.parametrize(
    ("seconds", "factor"),
    [(3.0, 1.0), (REFERENCE_S, 1.0), (REFERENCE_S * 1.8, 1.8), (REFERENCE_S * 1.234, 1.23)],
)
def test_tier_budgets_grow_with_the_measured_slowdown_and_never_shrink(seconds: float, factor: float) -> None:
    assert slowdown(seconds) == factor
