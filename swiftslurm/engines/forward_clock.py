"""How long a rank's training forwards take, for its node's pace (rundir/pace.py, node/stragglers.py).

A forward pre-hook and hook on the unwrapped model (inside DDP's wrapper, so DDP's own work before the forward
is not in it) time each forward while the model trains; evaluations (``model.training`` False) are not timed.
With data parallelism (DDP, LoRA on DDP, ZeRO-1/2) that forward holds no collective: its duration is this rank's
own compute. On a GPU the forward's kernels run after the call returns (the CPU's own time of the call says
nothing), so CUDA events recorded on the stream at its start and end time it, read once they are done
(``Event.query``: never a synchronisation); on CPU, the wall clock.

Not covered: ZeRO-3 and FSDP, whose forward gathers each layer's parameters from the other ranks (a wait for
the slowest of them, not this rank's compute); `not_covered` says so, and nothing is timed there. Nor is
Megatron (its plugin publishes no pace).

Beside the forwards, each rank's wait for its data loader (`FetchClock`): the Trainer fetches a step's
micro-batches in `get_batch_samples` before the step begins, and only its `next` calls are timed, on the CPU's
wall clock (the loop blocks on them). The same method then counts the batch's tokens across ranks: a collective,
a wait for the slowest rank's fetch, which is left out. Shown, not judged (docs/resilience.md, 'Stragglers').
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from swiftslurm.rundir.pace import PaceWriter


def planned_coverage(engine: str, deepspeed: str | None, fsdp: str | None) -> str | None:
    """The dry run's line when the plan's slow nodes go undetected (None: they are detected); why is the
    engine adapter's to say (Engine.straggler_gap)."""
    from swiftslurm.engines.registry import engine_for_strategy  # login side only: the ranks never ask

    why = engine_for_strategy(engine).straggler_gap(engine, deepspeed, fsdp)
    return f"stragglers  not detected: {why} (docs/resilience.md, 'Stragglers')" if why else None


def not_covered(args: Any) -> str | None:
    """Why this run's forwards do not time its own compute (None: they do)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        return "ZeRO-3 gathers parameters inside the forward"
    if getattr(args, "fsdp", None):
        return "FSDP gathers parameters inside the forward"
    return None


class ForwardClock:
    """Times ``model``'s training forwards, step by step: ``step_ended`` closes a step, ``done_steps`` returns
    the closed steps whose forwards are all timed. On a GPU the CPU runs ahead of the kernels, so a step's
    events are often not done at its own end: each forward is kept with the step it belongs to and read later,
    never added to another step's (which would make one step look twice as slow and the next one free)."""

    def __init__(self, model: Any) -> None:
        first = next(model.parameters(), None)
        self.cuda = first is not None and first.is_cuda
        self.started: Any = None  # the running forward's start: a perf_counter value, or a CUDA event
        self.forwards: list[tuple[Any, Any]] = []  # the current step's (start, end) marks
        self.closed: deque[tuple[int, list[tuple[Any, Any]]]] = deque()  # (step, its marks), oldest first
        model.register_forward_pre_hook(self.begin)
        model.register_forward_hook(self.end)

    def begin(self, module: Any, args: Any) -> None:
        self.started = self.mark() if module.training else None

    def end(self, module: Any, args: Any, output: Any) -> None:
        if self.started is not None:
            self.forwards.append((self.started, self.mark()))
            self.started = None

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def step_ended(self, step: int) -> None:
        if self.forwards:
            self.closed.append((step, self.forwards))
            self.forwards = []

    def done_steps(self) -> list[tuple[int, float]]:
        """(step, its forward seconds) of the closed steps whose forwards are done, in order; each once."""
        done = []
        while self.closed and all(_done(end) for _, end in self.closed[0][1]):
            step, forwards = self.closed.popleft()
            done.append((step, sum(_elapsed_s(start, end) for start, end in forwards)))
        return done


def _done(mark: Any) -> bool:
    return isinstance(mark, float) or bool(mark.query())  # Event.query: never a synchronisation


def _elapsed_s(start: Any, end: Any) -> float:
    return end - start if isinstance(start, float) else float(start.elapsed_time(end)) / 1000


class FetchClock:
    """Times this rank's waits for its data loader: every `next` that the Trainer's ``get_batch_samples`` makes on
    the epoch's iterator (wrapped on the trainer instance, so a subclass's override is wrapped too). Nothing else
    of that method is timed: its count of the batch's tokens across ranks is a collective."""

    def __init__(self, trainer: Any) -> None:
        self.waited = 0.0  # seconds waited since the last step's end
        fetch = trainer.get_batch_samples

        def timed(epoch_iterator: Any, *args: Any, **kwargs: Any) -> Any:
            return fetch(_TimedIterator(epoch_iterator, self), *args, **kwargs)

        trainer.get_batch_samples = timed

    @classmethod
    def attach(cls, trainer: Any) -> FetchClock | None:
        """None where the trainer fetches no other way than transformers' (no ``get_batch_samples``)."""
        return cls(trainer) if callable(getattr(trainer, "get_batch_samples", None)) else None

    def step_ended(self) -> float:
        """The seconds waited for data since the last step's end: the fetch of this step's micro-batches."""
        waited, self.waited = self.waited, 0.0
        return waited


class _TimedIterator:
    def __init__(self, inner: Any, clock: FetchClock) -> None:
        self.inner, self.clock = inner, clock

    def __iter__(self) -> _TimedIterator:
        return self

    def __next__(self) -> Any:
        start = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.clock.waited += time.perf_counter() - start


@dataclass
class NodePace:
    """A rank: times its training forwards and its data waits, and writes its pace (rundir/pace.py) at each
    step's end."""

    writer: PaceWriter
    clock: ForwardClock
    fetch: FetchClock | None = None

    @classmethod
    def attach(cls, model: Any, args: Any, trainer: Any = None) -> NodePace | None:
        """On every rank under the wrapper; None without it, and where forwards do not time a node's own
        compute (said once in each node's log, by its local rank 0)."""
        writer = PaceWriter.from_environ()
        if not writer.active or model is None:
            return None
        if (why := not_covered(args)) is not None:
            if writer.local_rank == 0:
                print(f"[swiftslurm] slow nodes are not detected in this run: {why} (docs/resilience.md)", flush=True)
            return None
        return cls(writer, ForwardClock(model), FetchClock.attach(trainer) if trainer is not None else None)

    def step_ended(self, step: int) -> None:
        if self.fetch is not None:
            self.writer.data_waited(self.fetch.step_ended())
        self.clock.step_ended(step)
        for done, seconds in self.clock.done_steps():
            self.writer.step_ended(done, seconds)
