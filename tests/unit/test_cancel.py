"""What `swiftslurm cancel` says while running jobs save (swiftslurm/ops/control.py): the save signal sent to each
job, what it waits for and for how long at most, and a line every REPEAT_S with the time spent; the result lines
after. SLURM is faked at its seam (ask_slurm, slurm.cancel); the wait runs on a fake clock whose sleep moves time on
and lets a run record its attempt when the test says."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from swiftslurm import slurm as slurm_cli
from swiftslurm.ops import control as ops
from swiftslurm.ops.runs import SlurmView
from swiftslurm.ops.waiting import REPEAT_S, Narrator
from swiftslurm.rundir import records
from swiftslurm.rundir.records import AttemptRecord


class FakeTime:
    """A clock that moves only when slept on; ``at(t, change)`` makes a change once t seconds have passed."""

    def __init__(self) -> None:
        self.now = 0.0
        self.due: list[tuple[float, Callable[[], None]]] = []

    def at(self, when: float, change: Callable[[], None]) -> None:
        self.due.append((when, change))

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for when, change in [d for d in self.due if d[0] <= self.now]:
            self.due.remove((when, change))
            change()


def running_run(run_dir: Path, name: str, job_id: str) -> Path:
    run_dir.mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"run_name": name}))
    records.record_submission(run_dir, job_id, "slurm")
    records.write_status(run_dir, "running", job_id=job_id, attempt=job_id, phase="train")
    return run_dir


@pytest.fixture
def scancels(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list[str], str | None]]:
    """SLURM says every job is running; each scancel is recorded (job ids, signal)."""
    sent: list[tuple[list[str], str | None]] = []
    monkeypatch.setattr(ops, "ask_slurm", lambda ids: SlurmView(available=True, states=dict.fromkeys(ids, "RUNNING")))
    monkeypatch.setattr(slurm_cli, "cancel", lambda ids, signal=None: sent.append((list(ids), signal)))
    return sent


def said(out: io.StringIO) -> list[str]:
    """The lines printed, without their HH:MM:SS."""
    return [line.split("  ", 1)[1] for line in out.getvalue().splitlines()]


def test_cancel_says_what_it_waits_for_and_the_time_spent_until_the_job_records(
    tmp_path: Path, scancels: list[tuple[list[str], str | None]]
) -> None:
    run_dir = running_run(tmp_path / "run", "tiny", "12")
    clock, out = FakeTime(), io.StringIO()
    clock.at(40.0, lambda: records.append_attempt(run_dir, AttemptRecord("12", committed_step=40, reason="cancelled")))
    result = ops.cancel_all([run_dir], narrate=Narrator(out=out, clock=lambda: clock.now), sleep=clock.sleep)
    waiting = "waiting up to 120 s for job 12 to record its attempt"
    assert said(out) == [
        "tiny: asked job 12 to save its current step (USR2)",
        waiting,
        f"still {waiting} ({REPEAT_S:.0f} s)",
        f"still {waiting} ({2 * REPEAT_S:.0f} s)",
    ]
    assert result == ["tiny: cancelled job 12; saved at step 40."]
    assert scancels == [(["12"], "USR2"), (["12"], None)]


def test_a_sweeps_cancel_counts_the_records_and_stops_waiting_at_its_bound(
    tmp_path: Path, scancels: list[tuple[list[str], str | None]]
) -> None:
    first = running_run(tmp_path / "a", "point-a", "21")
    second = running_run(tmp_path / "b", "point-b", "22")
    clock, out = FakeTime(), io.StringIO()
    clock.at(10.0, lambda: records.append_attempt(first, AttemptRecord("21", committed_step=8, reason="cancelled")))
    narrate = Narrator(out=out, clock=lambda: clock.now)
    result = ops.cancel_all([first, second], save_wait_s=60.0, narrate=narrate, sleep=clock.sleep)
    lines = said(out)
    assert lines[:4] == [
        "point-a: asked job 21 to save its current step (USR2)",
        "point-b: asked job 22 to save its current step (USR2)",
        "waiting up to 60 s for 2 jobs to record their attempts (0 of 2 recorded)",
        "waiting up to 60 s for 2 jobs to record their attempts (1 of 2 recorded)",  # at the next REPEAT_S
    ]
    assert lines[-1] == "still waiting up to 60 s for 2 jobs to record their attempts (1 of 2 recorded) (45 s)"
    assert clock.now == pytest.approx(60.0)  # no longer than the bound it stated
    assert result == ["point-a: cancelled job 21; saved at step 8.", "point-b: cancelled job 22."]
    assert scancels == [(["21", "22"], "USR2"), (["21", "22"], None)]
