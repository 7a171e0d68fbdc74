"""When is a run hung: a window learned from the run's own step times (pure; no clock, no files).

The leader follows global rank 0's heartbeat (rundir/beat.py): a beat at every step's end, and at each save's,
evaluation's and epoch boundary's begin and end. The time from one beat to the next belongs to what rank 0 was
doing meanwhile, its phase: the steps' times are the run's own pace (a run whose steps take 10 s is hung long
before one whose steps take 20 minutes), and a pause's time is that pause's, never a step's. The window the
next beat must come within is, for a step,

    clamp(factor × p95(the last RECENT step times), floor_s, ceiling_s)

with these exceptions, each given the allowance it needs rather than the steps' pace:
- before the first beat (model load, dataset preprocessing, data loader warm-up): ``startup_s``;
- until MIN_GAPS step times are known (the first steps are slow: warm-up, lazy communicator set-up):
  ``ceiling_s``;
- a save, an evaluation or an epoch boundary: factor × the longest pause of that kind seen so far, clamped to
  [ceiling_s, pause_s]: a save's time is set by a shared file system more than by the run, so never less than
  a step may take; ``pause_s`` while none of its kind has been seen (never below ``ceiling_s``);
- after the last step (the engine's end of training, the processes' exit: nothing this run has done before,
  and a kill then loses nothing committed): ``ceiling_s``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from swiftslurm.rundir.beat import STEP, Beat

RECENT = 50  # step times the window is learned from: the pace of the run now, not of its first hour
MIN_GAPS = 3  # step times needed before the learned window replaces the ceiling
PERCENTILE = 95.0  # one unusually slow step in RECENT does not widen the window; two in a row do


@dataclass(frozen=True)
class HangLimits:
    """The watchdog's settings (resilience.* in the configuration), in seconds except ``factor``."""

    startup_s: float  # no first step within this long = hung
    factor: float  # the window is this many times the run's own pace
    floor_s: float  # never shorter: a run with 1-second steps still gets GC pauses, slow batches
    ceiling_s: float  # a step's window is never longer; and the window until the run's pace is known
    pause_s: float  # a pause's window is never longer (nor below ceiling_s); and that of the first of its kind


@dataclass(frozen=True)
class Window:
    """How long the next beat may take, and why that long (for the record and the log)."""

    seconds: float
    basis: str


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` by the nearest-rank method (a value that was seen)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class Gap(str, Enum):
    """What the gap in progress holds."""

    STARTUP = "startup"  # no beat yet
    STEPS = "steps"  # a training step
    PAUSE = "pause"  # a save, an evaluation or an epoch boundary
    END = "end"  # the last step is done: what follows is the end of training


def window(gap: Gap, steps: Sequence[float], paused: Sequence[float], limits: HangLimits, kind: str = "") -> Window:
    """The window of the gap in progress. ``steps``: past step times (s); ``paused``: past pauses of the
    ``kind`` in progress (s)."""
    if gap is Gap.STARTUP:
        return Window(limits.startup_s, "before the first step (resilience.startup_timeout_s)")
    if gap is Gap.END:
        return Window(limits.ceiling_s, "after the last step (resilience.hang_timeout_s)")
    if gap is Gap.PAUSE:
        if not paused:
            first = max(limits.pause_s, limits.ceiling_s)
            return Window(first, f"the first {kind} of this attempt (resilience.pause_timeout_s)")
        longest = max(paused)
        seconds = min(max(limits.pause_s, limits.ceiling_s), max(limits.ceiling_s, limits.factor * longest))
        bound = " (resilience.hang_timeout_s)" if seconds == limits.ceiling_s else ""
        bound = " (resilience.pause_timeout_s)" if seconds == limits.pause_s else bound
        return Window(seconds, f"{limits.factor:g} × the longest {kind} ({longest:.1f} s){bound}")
    if len(steps) < MIN_GAPS:
        return Window(limits.ceiling_s, f"fewer than {MIN_GAPS} step gaps seen (resilience.hang_timeout_s)")
    pace = percentile(steps, PERCENTILE)
    seconds = min(limits.ceiling_s, max(limits.floor_s, limits.factor * pace))
    bound = " (the floor)" if seconds == limits.floor_s else " (the ceiling)" if seconds == limits.ceiling_s else ""
    return Window(seconds, f"{limits.factor:g} × p{PERCENTILE:g} of {len(steps)} step gaps ({pace:.1f} s){bound}")


@dataclass
class StepGaps:
    """The run's pace as the leader sees it: each new beat, and how long the phase of the one before took."""

    steps: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    paused: dict[str, list[float]] = field(default_factory=dict)  # pause kind -> how long each one took
    beat: Beat | None = None  # the newest beat seen

    def observe(self, beat: Beat) -> None:
        """A new beat: the time since the previous one joins that one's phase. Between two step beats of the
        same step there was no step (an epoch's end right after a save's): nothing to learn from."""
        previous, self.beat = self.beat, beat
        if previous is None or beat.t <= previous.t:
            return
        took = beat.t - previous.t
        if previous.phase != STEP:
            self.paused.setdefault(previous.phase, []).append(took)
        elif beat.step > previous.step:
            self.steps.append(took)

    def gap(self) -> Gap:
        """What the gap in progress holds."""
        if self.beat is None:
            return Gap.STARTUP
        if self.beat.phase != STEP:
            return Gap.PAUSE
        if self.beat.max_steps is not None and self.beat.step >= self.beat.max_steps:
            return Gap.END
        return Gap.STEPS

    def window(self, limits: HangLimits) -> Window:
        kind = self.beat.phase if self.beat is not None else STEP
        return window(self.gap(), list(self.steps), self.paused.get(kind, []), limits, kind)
