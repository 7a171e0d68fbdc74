"""Issue 15, item 2: the hang window learned from the run's own step times (pure), and the stacks of every rank
dumped before a hung trainer is killed. Issue 25, item 15: progress is global rank 0's per-step heartbeat (not
the lines ms-swift logs every `logging_steps`), and saves and evaluations are kept out of the step times."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from swiftslurm.engines.hooks import pauses
from swiftslurm.engines.megatron import pauses_after
from swiftslurm.node import stacks
from swiftslurm.node.hang import Gap, HangLimits, StepGaps, percentile, window
from swiftslurm.node.watch import _Watcher, hang_limits
from swiftslurm.rundir.beat import EPOCH, EVAL, SAVE, STEP, Beat, ProgressWatch, StepBeat, read_beat
from swiftslurm.rundir.layout import node_log, progress_file
from swiftslurm.signals import SignalLog
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

LIMITS = HangLimits(startup_s=3600.0, factor=5.0, floor_s=60.0, ceiling_s=1800.0, pause_s=7200.0)


@pytest.mark.parametrize(
    ("gap", "steps", "paused", "seconds", "basis"),
    [
        (Gap.STARTUP, [], [], 3600.0, "before the first step"),
        (Gap.STEPS, [2.0, 2.0], [], 1800.0, "fewer than 3 step gaps"),  # not learned yet: the ceiling
        (Gap.STEPS, [2.0, 2.0, 2.0], [], 60.0, "(the floor)"),  # 5 × 2 s, raised to the floor
        (Gap.STEPS, [30.0] * 10, [], 150.0, "5 × p95 of 10 step gaps (30.0 s)"),
        (Gap.STEPS, [30.0] * 19 + [400.0], [], 150.0, "p95"),  # one slow step in 20 does not widen it
        (Gap.STEPS, [30.0] * 18 + [400.0] * 2, [], 1800.0, "(the ceiling)"),  # two do: 5 × 400 s, capped
        (Gap.PAUSE, [30.0] * 10, [], 7200.0, "the first save of this attempt (resilience.pause_timeout_s)"),
        (Gap.PAUSE, [30.0] * 10, [90.0, 120.0], 1800.0, "(resilience.hang_timeout_s)"),  # never below a step's
        (Gap.PAUSE, [30.0] * 10, [90.0, 600.0], 3000.0, "5 × the longest save (600.0 s)"),
        (Gap.PAUSE, [30.0] * 10, [2000.0], 7200.0, "(resilience.pause_timeout_s)"),  # 5 × 2000 s, capped
        (Gap.STEPS, [30.0] * 10, [120.0], 150.0, "step gaps"),  # a past pause does not widen the steps'
        (Gap.END, [30.0] * 10, [1.0], 1800.0, "after the last step"),  # the end of training is not learned
    ],
)
def test_the_window_is_learned_from_the_runs_own_gaps(
    gap: Gap, steps: list[float], paused: list[float], seconds: float, basis: str
) -> None:
    got = window(gap, steps, paused, LIMITS, kind=SAVE)
    assert got.seconds == seconds and basis in got.basis, got


def test_a_pause_timeout_below_the_step_ceiling_never_shortens_a_pause() -> None:
    short = replace(LIMITS, pause_s=600.0)  # a user who raised hang_timeout_s above pause_timeout_s
    assert window(Gap.PAUSE, [], [], short, kind=EVAL).seconds == 1800.0
    assert window(Gap.PAUSE, [], [400.0], short, kind=EVAL).seconds == 1800.0


def beats(gaps: StepGaps, *seen: tuple[int, str, float], last: int = 40) -> None:
    for step, phase, at in seen:
        gaps.observe(Beat(step, last, phase, at))


def test_a_run_with_second_long_steps_is_hung_in_minutes_not_half_an_hour() -> None:
    gaps = StepGaps()
    beats(gaps, *((step, STEP, 100.0 + 5 * step) for step in range(1, 20)), last=1000)  # a step every 5 s
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
        beats(gaps, (step, STEP, at), last=1000)
    assert gaps.window(replace(LIMITS, floor_s=1.0)).seconds == 50.0


def test_each_pause_is_learned_apart_from_the_steps_and_from_the_other_kinds() -> None:
    gaps = StepGaps()
    beats(gaps, (9, STEP, 0.0), (10, EVAL, 5.0))  # step 10 took 5 s; an evaluation, then a save follow it
    assert gaps.gap() is Gap.PAUSE and "the first eval" in gaps.window(LIMITS).basis
    beats(gaps, (10, SAVE, 125.0), (10, STEP, 485.0), (11, STEP, 490.0))  # the eval took 120 s, the save 360 s
    assert list(gaps.steps) == [5.0, 5.0] and gaps.paused == {EVAL: [120.0], SAVE: [360.0]}
    assert gaps.gap() is Gap.STEPS
    beats(gaps, (12, SAVE, 495.0))
    assert gaps.window(LIMITS).seconds == 1800.0 and "the longest save (360.0 s)" in gaps.window(LIMITS).basis


def test_an_epoch_end_right_after_a_save_adds_no_step() -> None:
    gaps = StepGaps()
    beats(gaps, (9, STEP, 0.0), (10, SAVE, 5.0), (10, STEP, 65.0), (10, EPOCH, 65.5), (11, STEP, 200.0))
    assert list(gaps.steps) == [5.0] and gaps.paused == {SAVE: [60.0], EPOCH: [134.5]}


def test_the_end_of_training_gets_the_ceiling_not_the_pace_of_saves() -> None:
    """Seen on the local cluster: quick saves (0.5 s) made a 10 s window for the final save, ms-swift's end of
    training and the processes' exit, which took longer: a run that had finished was killed as hung."""
    gaps = StepGaps()
    beats(gaps, (9, STEP, 0.0), (10, SAVE, 0.5), (10, STEP, 1.0), *((s, STEP, s - 9.0) for s in range(11, 41)))
    assert gaps.gap() is Gap.END and gaps.window(replace(LIMITS, floor_s=10.0)).seconds == 1800.0
    beats(gaps, (40, SAVE, 32.0))  # the last commit is still being written (Committer.finish)
    assert gaps.gap() is Gap.PAUSE


# --- the heartbeat: written by global rank 0, read by node 0's wrapper -----------------------------------------


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_heartbeat_says_each_pause_in_the_order_the_loop_runs_them(tmp_path: Path) -> None:
    clock, path = Clock(), tmp_path / "progress.json"
    beat = StepBeat(path, clock)
    seen: list[tuple[int, str, float]] = []

    def now_at(t: float, change: Callable[[], None]) -> None:
        clock.now = t
        change()
        got = read_beat(path)
        assert got is not None
        seen.append((got.step, got.phase, got.t))

    now_at(1001.0, lambda: beat.step_ended(10, 40, pauses(evaluate=True, save=True)))
    now_at(1002.0, lambda: beat.pausing(EVAL))  # Megatron's eval begin, foreseen at the step's end: no new beat
    now_at(1003.0, lambda: beat.pause_ended(EVAL))
    now_at(1004.0, lambda: beat.pause_ended(SAVE))
    now_at(1005.0, lambda: beat.pausing(*pauses(evaluate=False, save=False, epoch_end=True)))
    now_at(1006.0, lambda: beat.step_ended(11, 40))
    assert seen == [
        (10, EVAL, 1001.0),
        (10, EVAL, 1001.0),
        (10, SAVE, 1003.0),
        (10, STEP, 1004.0),
        (10, EPOCH, 1005.0),
        (11, STEP, 1006.0),
    ]
    assert read_beat(path) == Beat(11, 40, STEP, 1006.0)


def test_a_heartbeat_that_cannot_be_written_never_stops_training(tmp_path: Path) -> None:
    beat = StepBeat(tmp_path / "missing" / "progress.json")
    beat.step_ended(1, 40)
    beat.step_ended(2, 40)  # reported once, tried again each time
    assert beat._warned and read_beat(tmp_path / "missing" / "progress.json") is None
    StepBeat(None).step_ended(1, 40)  # not global rank 0: nothing written


def test_a_beat_from_before_the_trainer_started_is_an_earlier_trainers(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    StepBeat(path, Clock(500.0)).step_ended(30, 30)  # a finished run of an earlier job with the same id
    watch = ProgressWatch(path, started=1000.0)
    assert watch.poll() is None and watch.step is None and watch.stalled_for(1010.0) == 10.0
    StepBeat(path, Clock(1100.0)).step_ended(7, 30)
    assert watch.poll() == Beat(7, 30, STEP, 1100.0) and watch.poll() is None  # new once
    assert (watch.step, watch.max_steps, watch.first_step_at) == (7, 30, 1100.0)


# --- the watchdog as node 0's wrapper runs it: a trainer emulated at its two outputs, the clock given ----------


class FakeTrainer:
    """What _Watcher asks of the trainer; `kill` records instead of killing."""

    pid = 2**22 + 1  # above pid_max's default: no such process (stacks.dump_ranks signals nobody)
    command_exit: int | None = None  # its command runs until killed
    tree_exit_s = 60.0
    leftovers: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.killed = False

    def poll(self) -> int | None:
        return -9 if self.killed else None

    def kill(self) -> int:
        self.killed = True
        return -9

    def forward(self, sig: int, recipients: object) -> list[int]:
        return []


@dataclass
class Run:
    """A trainer emulated at what the wrapper reads: global rank 0's heartbeat (the plugin's StepBeat), and
    ms-swift's progress line every ``logging_steps`` in node 0's log (what the watchdog read before)."""

    watcher: _Watcher
    beat: StepBeat
    clock: Clock
    log: Path
    logging_steps: int = 5
    last: int = 100

    def step(self, step: int, at: float, follows: tuple[str, ...] = ()) -> None:
        self.clock.now = at
        self.beat.step_ended(step, self.last, follows)
        if step % self.logging_steps == 0:
            with open(self.log, "a") as out:
                out.write(f"{{'loss': '1.0', 'global_step/max_steps': '{step}/{self.last}'}}\n")

    def hung_between(self, begin: float, end: float, every: float = 10.0) -> bool:
        """Tick the watcher from ``begin`` to ``end``; whether it found the run hung."""
        at = begin
        while at <= end and not self.watcher.hung:
            self.watcher.tick(at)
            at += every
        return self.watcher.hung


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    monkeypatch.setattr(stacks, "SETTLE_S", 0.0)
    plan = replace(plan_for(f"run_dir={tmp_path / 'run'}"), tiny_cache=None)  # defaults: floor 300 s, ceiling 1800 s
    attempt = tmp_path / "run" / "logs" / "7"
    attempt.mkdir(parents=True)
    where = SlurmEnv(job_id=None, hosts=(), node_id=0, num_nodes=1, proc_id=0, num_tasks=1)
    watch = ProgressWatch(progress_file(attempt), started=1000.0)
    trainer = FakeTrainer()
    watcher = _Watcher(plan, where, trainer, lambda _pid: [], SignalLog(), watch, None, attempt)  # type: ignore[arg-type]
    clock = Clock()
    return Run(watcher, StepBeat(progress_file(attempt), clock), clock, node_log(attempt, 0))


def test_steps_of_400_s_logged_every_5_are_not_hung_at_the_second_logged_step(run: Run) -> None:
    """72B GRPO: steps of 400 s, `logging_steps=5`. The logged steps come 2000 s apart, more than the 1800 s
    ceiling: the watchdog that followed them killed every such run at its second logged step."""
    start = 1100.0
    for step in range(1, 13):
        at = start + 400.0 * step
        assert not run.hung_between(at - 400.0, at - 1.0), f"called hung before step {step}: {run.watcher.hang}"
        run.step(step, at)
    run.watcher.tick(run.clock.now)
    window = run.watcher.gaps.window(hang_limits(run.watcher.plan.resilience))
    assert run.watcher.watch.step == 12 and list(run.watcher.gaps.steps) == [400.0] * 11
    assert window.seconds == 1800.0 and "5 × p95 of 11 step gaps (400.0 s) (the ceiling)" in window.basis


def test_a_step_that_never_ends_is_still_found_after_the_runs_own_window(run: Run) -> None:
    for step in range(1, 11):
        run.step(step, 1100.0 + 20.0 * step)  # 20 s steps: 5 × 20 s = 100 s, raised to the 300 s floor
        run.watcher.tick(1100.0 + 20.0 * step)
    assert not run.hung_between(1300.0, 1599.0)
    assert run.hung_between(1600.0, 1700.0, every=1.0)
    assert run.watcher.hang is not None and run.watcher.hang["step"] == 10 and run.watcher.hang["phase"] == STEP
    assert run.watcher.hang["window_s"] == 300.0 and "step gaps" in run.watcher.hang["basis"]
    assert run.watcher.trainer.killed  # type: ignore[attr-defined]


def test_a_first_save_of_40_minutes_is_not_a_hang_nor_a_step(run: Run) -> None:
    """The first save of an attempt had the 1800 s ceiling: a 72B checkpoint written for 40 minutes was
    killed as hung. The save is no step either: the steps' window after it is still their own."""
    for step in range(1, 21):
        run.step(step, 1100.0 + 10.0 * step, follows=pauses(evaluate=False, save=step == 20))
        run.watcher.tick(1100.0 + 10.0 * step)
    saved_at = 1300.0 + 2400.0
    assert not run.hung_between(1300.0, saved_at - 1.0, every=30.0), run.watcher.hang
    run.clock.now = saved_at
    run.beat.pause_ended(SAVE)
    run.watcher.tick(saved_at)
    assert run.watcher.gaps.paused == {SAVE: [2400.0]} and max(run.watcher.gaps.steps) == 10.0
    assert not run.hung_between(saved_at, saved_at + 299.0)  # the steps' own window: the 300 s floor
    assert run.hung_between(saved_at + 300.0, saved_at + 310.0, every=1.0)
    assert run.watcher.hang is not None and run.watcher.hang["step"] == 20


def test_a_save_that_never_ends_is_found_after_the_pause_timeout(run: Run) -> None:
    for step in range(1, 6):
        run.step(step, 1100.0 + 10.0 * step, follows=pauses(evaluate=False, save=step == 5))
        run.watcher.tick(1100.0 + 10.0 * step)
    assert not run.hung_between(1150.0, 1150.0 + 7199.0, every=60.0)
    assert run.hung_between(1150.0 + 7200.0, 1150.0 + 7210.0, every=1.0)
    hang = run.watcher.hang
    assert hang is not None and (hang["phase"], hang["window_s"]) == (SAVE, 7200.0)
    assert "the first save of this attempt" in hang["basis"]


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
