"""All ranks agree to stop at the same step, without synchronising the GPU at every step.

A save signal reaches each rank at its own moment, but a checkpoint needs every rank to save the same step.
ms-swift's `graceful_exit` callback agrees on it by all-reducing a flag on the GPU and calling `.item()` after
every step: one NCCL call and one device synchronisation per step, which stalls the CPU that would otherwise
be queueing the next step's kernels.

Here the vote travels on a CPU-only gloo group and carries two flags, MAX-reduced: "stop" and "my last step
took longer than SLOW_STEP_S". Nothing touches the GPU. How the vote is read depends on the step length that
all ranks last agreed on:

- Short steps (all ranks under SLOW_STEP_S): asynchronously, the vote posted at the end of step N is read at
  the end of step N+2. Every rank has posted it by then (they all ran step N+1's collectives), and gloo's
  thread has had a whole step to finish it even on a node whose CPUs are busy, so the read does not wait. The
  save starts two steps after the signal: under 2 x SLOW_STEP_S late.
- Long steps (any rank at or over SLOW_STEP_S, e.g. a GRPO step of minutes): synchronously, at the end of the
  step it was posted in, so the save starts at the next step boundary after the signal reached any rank. The
  wait is for the slowest rank's step end plus one small gloo all-reduce: milliseconds against a step of
  seconds.

The mode changes only when a vote is read, and every rank reads the same votes at the same steps, so every
rank is in the same mode at every step and all stop at the same step. The first vote is read synchronously
(no step length is known yet). Posting a vote costs microseconds on an idle CPU; a median of 0.6 ms a step
(2.3 ms at worst) over the test suite's multi-process runs on its 2-core machine, where four training
processes and three SLURM daemons share the cores (mostly waiting for a CPU). The trainer logs the figure for
every run. Without torch.distributed (one process) the local flag decides at once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

LAG_STEPS = 2  # with short steps, a vote is read this many steps after it was posted
# A step this long (or longer) on any rank makes the vote synchronous: the wait it adds (milliseconds) is
# under 1 % of such a step, while reading late would start the save 2 steps (2 s or more) after the signal.
SLOW_STEP_S = 1.0


class StopVote:
    """Collects the local "please stop" flag and answers whether all ranks agreed to stop at this step."""

    def __init__(self, slow_step_s: float = SLOW_STEP_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._group: Any = None
        self._pending: deque[tuple[Any, Any]] = deque()  # (async work, its CPU tensor), oldest first
        self._synchronous = True  # what the last vote read says: some rank's step took >= slow_step_s
        self._slow_step_s, self._clock = slow_step_s, clock
        self._step_began = clock()
        self._steps, self._spent_s, self._worst_s = 0, 0.0, 0.0  # what voting cost the training loop

    def join(self) -> None:
        """Create the CPU group; a collective call, so every rank calls it at the same point (train begin)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo")
        self._step_began = self._clock()

    def step_end(self, requested: bool) -> bool:
        """Post this step's flags; return whether the votes read now say stop (on every rank alike): this
        step's vote when steps are long, the one posted LAG_STEPS steps ago when they are short. Timed:
        `cost_line` says what it cost."""
        now = self._clock()
        slow, self._step_began = now - self._step_began >= self._slow_step_s, now
        started = time.perf_counter()
        agreed = self._vote(requested, slow)
        spent = time.perf_counter() - started
        self._steps, self._spent_s, self._worst_s = self._steps + 1, self._spent_s + spent, max(self._worst_s, spent)
        return agreed

    def cost_line(self) -> str:
        """What voting cost the training loop so far, as the log line bench/gpu_overhead.py reads ("" before
        the first step)."""
        return vote_cost_line(self._steps, self._spent_s, self._worst_s) if self._steps else ""

    def _vote(self, requested: bool, slow: bool) -> bool:
        if self._group is None:
            return requested
        import torch
        import torch.distributed as dist

        flags = torch.tensor([int(requested), int(slow)], dtype=torch.uint8)
        work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending.append((work, flags))
        stop = False
        # Synchronous mode drains every vote, this step's included; a vote saying "slow" switches to it
        # mid-drain, one saying "fast" switches back: the same votes in the same order on every rank.
        while self._pending and (self._synchronous or len(self._pending) > LAG_STEPS):
            said_stop, self._synchronous = self._collect()
            stop = stop or said_stop
        return stop

    def finish(self) -> None:
        """Wait for the votes still in flight, so no rank leaves a collective half done behind it."""
        while self._pending:
            self._collect()

    def _collect(self) -> tuple[bool, bool]:
        """The oldest vote's (stop, slow), waited for; a CPU tensor: no device synchronisation."""
        work, flags = self._pending.popleft()
        work.wait()
        return bool(flags[0].item()), bool(flags[1].item())


def vote_cost_line(steps: int, spent_s: float, worst_s: float) -> str:
    """The log line that says what the stop vote cost the training loop (bench/gpu_overhead.py reads it)."""
    return (
        f"[swiftslurm] stop vote: {steps} steps, {spent_s * 1e6 / steps:.0f} us per step on average, "
        f"{worst_s * 1e6:.0f} us at most"
    )
