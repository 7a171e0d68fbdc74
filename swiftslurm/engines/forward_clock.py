"""How long a rank's training forwards take, for its node's pace (rundir/pace.py, node/stragglers.py).

A forward pre-hook and hook on the unwrapped model (inside DDP's wrapper, so DDP's own work before the forward
is not in it) time each forward while the model trains; evaluations (``model.training`` False) are not timed.
With data parallelism (DDP, LoRA on DDP, ZeRO-1/2) that forward holds no collective: its duration is this rank's
own compute. On a GPU the forward's kernels run after the call returns, so CUDA events recorded on the stream at
its start and end time it, read once they are done (``Event.query``: never a synchronisation); on CPU, the
wall clock.

Not covered: ZeRO-3 and FSDP, whose forward gathers each layer's parameters from the other ranks (a wait for
the slowest of them, not this rank's compute); `not_covered` says so, and nothing is timed there. Nor is
Megatron (its plugin publishes no pace).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from swiftslurm.rundir.pace import PaceWriter


def not_covered(args: Any) -> str | None:
    """Why this run's forwards do not time its own compute (None: they do)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        return "ZeRO-3 gathers parameters inside the forward"
    if getattr(args, "fsdp", None):
        return "FSDP gathers parameters inside the forward"
    return None


class ForwardClock:
    """Times ``model``'s training forwards; ``take`` returns the seconds timed since the last call."""

    def __init__(self, model: Any) -> None:
        first = next(model.parameters(), None)
        self.cuda = first is not None and first.is_cuda
        self.started: Any = None  # the running forward's start: a perf_counter value, or a CUDA event
        self.pending: list[tuple[Any, Any]] = []  # CUDA: (start, end) events not yet read
        self.timed_s = 0.0
        model.register_forward_pre_hook(self.begin)
        model.register_forward_hook(self.end)

    def begin(self, module: Any, args: Any) -> None:
        self.started = self.mark() if module.training else None

    def end(self, module: Any, args: Any, output: Any) -> None:
        if self.started is None:
            return
        if self.cuda:
            self.pending.append((self.started, self.mark()))
        else:
            self.timed_s += time.perf_counter() - self.started
        self.started = None

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def take(self) -> float:
        """The forward seconds timed since the last call (on a GPU: of the forwards whose kernels are done)."""
        done = [(start, end) for start, end in self.pending if end.query()]
        self.pending = [pair for pair in self.pending if pair not in done]
        seconds, self.timed_s = self.timed_s + sum(start.elapsed_time(end) / 1000 for start, end in done), 0.0
        return seconds


@dataclass
class NodePace:
    """A rank: times its training forwards and writes its pace (rundir/pace.py) at each step's end."""

    writer: PaceWriter
    clock: ForwardClock

    @classmethod
    def attach(cls, model: Any, args: Any) -> NodePace | None:
        """On every rank under the wrapper; None without it, and where forwards do not time a node's own
        compute (said once in each node's log, by its local rank 0)."""
        writer = PaceWriter.from_environ()
        if not writer.active or model is None:
            return None
        if (why := not_covered(args)) is not None:
            if writer.local_rank == 0:
                print(f"[swiftslurm] slow nodes are not detected in this run: {why} (docs/resilience.md)", flush=True)
            return None
        return cls(writer, ForwardClock(model))

    def step_ended(self, step: int) -> None:
        self.writer.step_ended(step, self.clock.take())
