"""When is a run hung: a window learned from the run's own step times (pure; no clock, no files).

The leader sees progress as "step K" lines (the engine adapter's ProgressSource). The gaps between two new
steps are the run's own pace: a run whose logged steps come every 10 s is hung long before one whose steps
take 20 minutes. The window the next step must come within is

    clamp(factor × p95(the last RECENT ordinary gaps), floor_s, ceiling_s)

with three exceptions, each given the allowance it needs rather than the ordinary pace:
- before the first step (model load, dataset preprocessing, data loader warm-up): ``startup_s``;
- until MIN_GAPS ordinary gaps are known (the first steps are slow: warm-up, lazy communicator set-up):
  ``ceiling_s``;
- a gap that holds a save, an evaluation or an epoch boundary (announced by the ranks: PAUSE_LINE):
  factor × the longest such gap seen so far, clamped the same way; ``ceiling_s`` while none has been seen;
- after the last step (the final save, the engine's end of training, the processes' exit: nothing this run
  has done before, and a kill then loses nothing committed): ``ceiling_s``.

Gaps that held a pause are kept apart, so one slow evaluation never widens the ordinary window, nor a run of
quick steps narrow the window of the next save.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

RECENT = 50  # ordinary gaps the window is learned from: the pace of the run now, not of its first hour
MIN_GAPS = 3  # ordinary gaps needed before the learned window replaces the ceiling
PERCENTILE = 95.0  # one unusually slow step in RECENT does not widen the window; two in a row do


@dataclass(frozen=True)
class HangLimits:
    """The watchdog's settings (resilience.* in the configuration), in seconds except ``factor``."""

    startup_s: float  # no first step within this long = hung
    factor: float  # the window is this many times the run's own pace
    floor_s: float  # never shorter: a run with 1-second steps still gets GC pauses, slow batches
    ceiling_s: float  # never longer; and the window until the run's pace is known


@dataclass(frozen=True)
class Window:
    """How long the next step may take, and why that long (for the record and the log)."""

    seconds: float
    basis: str


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` by the nearest-rank method (a value that was seen)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


class Gap(str, Enum):
    """What the gap in progress holds."""

    STARTUP = "startup"  # no step yet
    STEPS = "steps"  # training steps only
    PAUSE = "pause"  # a save, an evaluation or an epoch boundary
    END = "end"  # the last step is done: what follows is the end of training


def window(gap: Gap, ordinary: Sequence[float], paused: Sequence[float], limits: HangLimits) -> Window:
    """The window of the gap in progress. ``ordinary``, ``paused``: past gaps (s) without and with a pause."""
    if gap is Gap.STARTUP:
        return Window(limits.startup_s, "before the first step (resilience.startup_timeout_s)")
    if gap is Gap.END:
        return Window(limits.ceiling_s, "after the last step (resilience.hang_timeout_s)")
    if gap is Gap.PAUSE:
        if not paused:
            return Window(limits.ceiling_s, "first save/eval of this attempt (resilience.hang_timeout_s)")
        return _learned(max(paused), f"{limits.factor:g} × the longest save/eval gap ({max(paused):.1f} s)", limits)
    if len(ordinary) < MIN_GAPS:
        return Window(limits.ceiling_s, f"fewer than {MIN_GAPS} step gaps seen (resilience.hang_timeout_s)")
    pace = percentile(ordinary, PERCENTILE)
    return _learned(pace, f"{limits.factor:g} × p{PERCENTILE:g} of {len(ordinary)} step gaps ({pace:.1f} s)", limits)


def _learned(gap_s: float, basis: str, limits: HangLimits) -> Window:
    seconds = min(limits.ceiling_s, max(limits.floor_s, limits.factor * gap_s))
    bound = " (the floor)" if seconds == limits.floor_s else " (the ceiling)" if seconds == limits.ceiling_s else ""
    return Window(seconds, f"{basis}{bound}")


@dataclass
class StepGaps:
    """The run's pace as the leader sees it: each new step (and when it was seen), each announced pause."""

    ordinary: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT))
    paused: list[float] = field(default_factory=list)
    step: int | None = None
    at: float | None = None
    last_step: int | None = None  # the planned last step, once a progress line said it
    pauses: set[int] = field(default_factory=set)  # announced steps a pause follows, not yet behind us

    def announce(self, step: int) -> None:
        """A pause follows ``step`` (its end was announced by the ranks)."""
        if self.step is None or step >= self.step:
            self.pauses.add(step)

    def observe(self, step: int, at: float, last_step: int | None = None) -> None:
        """A new step was first seen at ``at``: the gap since the previous one joins its kind."""
        if self.step is not None and self.at is not None and step != self.step:
            (self.paused if self._holds_pause(self.step, step) else self.ordinary).append(at - self.at)
            self.pauses = {p for p in self.pauses if p >= step}
        self.step, self.at, self.last_step = step, at, last_step if last_step is not None else self.last_step

    def gap(self) -> Gap:
        """What the gap in progress holds."""
        if self.step is None:
            return Gap.STARTUP
        if self.last_step is not None and self.step >= self.last_step:
            return Gap.END
        return Gap.PAUSE if any(p >= self.step for p in self.pauses) else Gap.STEPS

    def window(self, limits: HangLimits) -> Window:
        return window(self.gap(), list(self.ordinary), self.paused, limits)

    def _holds_pause(self, begin: int, end: int) -> bool:
        # The ranks announce a pause at the end of step P, before step P's progress line: the pause falls in
        # the gap that begins at P's line, so in [begin, end) (a pause announced at `end` is the next gap's).
        return any(begin <= p < end for p in self.pauses)
