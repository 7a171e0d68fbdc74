"""Issue 15, item 2: the hang window learned from the run's own step times (pure), and the stacks of every rank
dumped before a hung trainer is killed (real processes, real signals; no SLURM, no ms-swift)."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from swiftslurm.engines.megatron import pauses_after
from swiftslurm.engines.progress import PAUSE_LINE, PAUSE_PATTERN, LineFollower
from swiftslurm.node import stacks
from swiftslurm.node.hang import Gap, HangLimits, StepGaps, percentile, window

LIMITS = HangLimits(startup_s=3600.0, factor=5.0, floor_s=60.0, ceiling_s=1800.0)


@pytest.mark.parametrize(
    ("gap", "ordinary", "paused", "seconds", "basis"),
    [
        (Gap.STARTUP, [], [], 3600.0, "before the first step"),
        (Gap.STEPS, [2.0, 2.0], [], 1800.0, "fewer than 3 step gaps"),  # not learned yet: the ceiling
        (Gap.STEPS, [2.0, 2.0, 2.0], [], 60.0, "(the floor)"),  # 5 × 2 s, raised to the floor
        (Gap.STEPS, [30.0] * 10, [], 150.0, "5 × p95 of 10 step gaps (30.0 s)"),
        (Gap.STEPS, [30.0] * 19 + [400.0], [], 150.0, "p95"),  # one slow step in 20 does not widen it
        (Gap.STEPS, [30.0] * 18 + [400.0] * 2, [], 1800.0, "(the ceiling)"),  # two do: 5 × 400 s, capped
        (Gap.PAUSE, [30.0] * 10, [], 1800.0, "first save/eval"),  # a pause never seen: the ceiling
        (Gap.PAUSE, [30.0] * 10, [90.0, 120.0], 600.0, "longest save/eval gap (120.0 s)"),
        (Gap.STEPS, [30.0] * 10, [120.0], 150.0, "step gaps"),  # a past pause does not widen ordinary gaps
        (Gap.END, [30.0] * 10, [1.0], 1800.0, "after the last step"),  # the end of training is not learned
    ],
)
def test_the_window_is_learned_from_the_runs_own_gaps(
    gap: Gap, ordinary: list[float], paused: list[float], seconds: float, basis: str
) -> None:
    got = window(gap, ordinary, paused, LIMITS)
    assert got.seconds == seconds and basis in got.basis, got


def test_a_run_with_second_long_steps_is_hung_in_minutes_not_half_an_hour() -> None:
    gaps = StepGaps()
    for step, at in enumerate(range(100, 200, 5), start=1):  # a logged step every 5 s
        gaps.observe(step * 5, float(at), last_step=1000)
    assert gaps.window(replace(LIMITS, floor_s=120.0)).seconds == 120.0  # 5 × 5 s = 25 s, raised to the floor


def test_percentile_is_a_value_that_was_seen() -> None:
    assert percentile([3.0, 1.0, 2.0], 95) == 3.0
    assert percentile(list(map(float, range(1, 101))), 95) == 95.0
    assert percentile([7.0], 50) == 7.0


def test_only_the_recent_gaps_count() -> None:
    gaps = StepGaps()
    at = 0.0
    for step in range(1, 200):
        at += 100.0 if step < 100 else 10.0  # slow start (100 s steps), then 10 s steps for 100 steps
        gaps.observe(step, at)
    assert gaps.window(replace(LIMITS, floor_s=1.0)).seconds == 50.0


def steps(gaps: StepGaps, *seen: tuple[int, float]) -> None:
    for step, at in seen:
        gaps.observe(step, at, last_step=40)


def test_the_gap_after_an_announced_save_is_a_pause_and_learned_apart() -> None:
    gaps = StepGaps()
    steps(gaps, (5, 0.0), (10, 5.0))
    gaps.announce(10)  # logging_steps 5, save_steps 10: announced before step 10's line
    assert gaps.gap() is Gap.PAUSE
    steps(gaps, (15, 65.0), (20, 70.0))  # the save took 60 s
    assert list(gaps.ordinary) == [5.0, 5.0] and gaps.paused == [60.0]
    assert gaps.gap() is Gap.STEPS


def test_a_pause_between_logged_steps_belongs_to_the_gap_it_falls_in() -> None:
    gaps = StepGaps()
    steps(gaps, (5, 0.0))
    gaps.announce(7)  # save_steps 7 with logging_steps 5: the save follows step 7, inside the gap 5 -> 10
    gaps.announce(10)  # and step 10's own save, announced before step 10's line is read: the next gap's
    steps(gaps, (10, 40.0))
    assert gaps.paused == [40.0] and gaps.gap() is Gap.PAUSE  # 5 -> 10 held the save at 7; 10 -> 15 holds 10's


def test_an_announcement_read_late_changes_no_past_gap() -> None:
    gaps = StepGaps()
    steps(gaps, (5, 0.0), (10, 5.0))
    gaps.announce(7)  # read after step 10's line: that gap is gone
    assert gaps.gap() is Gap.STEPS


def test_the_end_of_training_gets_the_ceiling_not_the_pace_of_saves() -> None:
    """Seen on the local cluster: quick saves (0.5 s) made a 10 s window for the final save, ms-swift's end of
    training and the processes' exit, which took longer: a run that had finished was killed as hung."""
    gaps = StepGaps()
    steps(gaps, (9, 0.0), (10, 0.5))
    gaps.announce(10)
    steps(gaps, (11, 1.0), (12, 1.5), (13, 2.0), (14, 2.5), (40, 16.0))  # the final save, then the exit
    assert gaps.gap() is Gap.END and gaps.window(replace(LIMITS, floor_s=10.0)).seconds == 1800.0


def test_the_ranks_announcement_is_what_the_wrapper_reads(tmp_path: Path) -> None:
    log = tmp_path / "node0.log"
    log.write_text("old line\n")
    follower = LineFollower(log, PAUSE_PATTERN)
    with open(log, "a") as out:
        out.write(PAUSE_LINE.format(step=20, kinds="save, eval") + "\n" + PAUSE_LINE.format(step=30, kinds="e"))
    assert [m.group(1) for m in follower.new_matches()] == ["20"]  # the second line is not whole yet
    with open(log, "a") as out:
        out.write("poch\n")
    assert [m.group(2) for m in follower.new_matches()] == ["epoch"]


@pytest.mark.parametrize(
    ("iteration", "args", "follows"),
    [
        (10, {}, (True, False)),
        (11, {}, (False, False)),
        (100, {}, (True, False)),  # the last iteration: the final save
        (100, {"eval_iters": 5}, (True, True)),
        (20, {"eval_steps": 20, "eval_iters": 5}, (True, True)),
        (20, {"eval_steps": 20, "eval_iters": 0}, (True, False)),  # no evaluation data
        (7, {"save_steps": None}, (False, False)),
    ],
)
def test_megatron_pauses_follow_its_default_flow(iteration: int, args: dict[str, int], follows: tuple) -> None:
    megatron_args = SimpleNamespace(**{"train_iters": 100, "save_steps": 10, "eval_steps": None, **args})
    assert pauses_after(iteration, megatron_args, saving=False) == follows
    assert pauses_after(iteration, megatron_args, saving=True)[0]  # the stop vote asked for a save


def test_a_rank_that_never_registered_is_not_waited_for(tmp_path: Path) -> None:
    started = time.monotonic()
    assert stacks.wait_for_stacks(tmp_path, range(4), timeout_s=60) == [0, 1, 2, 3]
    assert time.monotonic() - started < 30  # the bound is 60 s: nothing was waited for
