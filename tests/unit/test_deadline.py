"""When a trainer still running after a stop signal is killed (node/deadline.py, pure), table-tested: signal at
0, signal_lead_s 120, SLURM's answer as scontrol gives it."""

from __future__ import annotations

import pytest

from swiftslurm.node.deadline import LEAD, SLURM_END, EndTimes, SaveDeadline, earliest, save_deadline

LEAD_S = 120


@pytest.mark.parametrize(
    ("kill_at", "limit_ends", "at", "basis"),
    [
        (120, 120, 90, SLURM_END),  # the time limit's warning, on time: SLURM kills at 120
        (180, 180, 150, SLURM_END),  # sent 60 s early (sbatch's "up to 60 seconds earlier")
        (600, 36_000, 570, SLURM_END),  # preempted: EndTime moved to the end of a GraceTime of 600 s
        (40, 36_000, 20, SLURM_END),  # a grace of 40 s: half of it is node 0's
        (36_000, 36_000, 120, LEAD),  # a USR2 by hand, hours before the limit: the lead time
        (150, None, 120, SLURM_END),  # no time limit known (the partition's): EndTime near enough is SLURM's
        (0, 36_000, 120, LEAD),  # scancel: EndTime is the cancel itself, the kill comes after KillWait
        (None, None, 120, LEAD),  # no end time (UNLIMITED, or not asked)
    ],
)
def test_the_deadline_follows_slurms_kill_time(
    kill_at: float | None, limit_ends: float | None, at: float, basis: str
) -> None:
    deadline = save_deadline(0.0, LEAD_S, EndTimes(kill_at, limit_ends, "scontrol"))
    assert (deadline.at, deadline.basis, deadline.kill_at) == (at, basis, kill_at)


def test_a_later_signal_only_brings_the_deadline_forward() -> None:
    first = SaveDeadline(120.0, LEAD)
    assert earliest(first, SaveDeadline(300.0, SLURM_END)) is first
    assert earliest(first, later := SaveDeadline(30.0, SLURM_END)) is later


def test_a_published_deadline_reads_back() -> None:
    deadline = SaveDeadline(1.5, SLURM_END, 31.5, "scontrol")
    assert SaveDeadline.from_dict(deadline.as_dict()) == deadline
    assert SaveDeadline.from_dict({"at": "soon"}) is None
