"""StopVote: every rank reads the same vote at the same step, over a real two-process gloo group.

Step lengths come from a clock the test advances, so the mode (asynchronous for short steps, synchronous for
long ones) does not depend on how fast this machine runs the loop."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

from swiftslurm.engines.stop_vote import LAG_STEPS, SLOW_STEP_S, StopVote  # noqa: E402
from tests.conftest import file_rendezvous  # noqa: E402

torch = pytest.importorskip("torch")


dist = pytest.importorskip("torch.distributed")


mp = pytest.importorskip("torch.multiprocessing")


STEPS = 10


SHORT, LONG = SLOW_STEP_S / 100, SLOW_STEP_S * 60  # a step of 10 ms; a GRPO step of a minute


class StepClock:
    """Time as the training loop would see it: each step lasts what the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _rank(
    rank: int,
    rendezvous: str,
    signal_at: dict[int, int],
    step_s: dict[int, list[float]],
    results: dict[int, list[bool]],
) -> None:
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    clock = StepClock()
    vote = StopVote(clock=clock)
    vote.join()
    requested = False
    decisions = []
    for step in range(1, STEPS + 1):
        clock.now += step_s.get(rank, [SHORT] * STEPS)[step - 1]
        requested = requested or step >= signal_at.get(rank, STEPS + 1)
        decisions.append(vote.step_end(requested))
    vote.finish()
    results[rank] = decisions
    dist.destroy_process_group()


def _run(signal_at: dict[int, int], step_s: dict[int, list[float]] | None = None) -> dict[int, list[bool]]:
    with mp.Manager() as manager, tempfile.TemporaryDirectory() as folder:
        results = manager.dict()
        mp.spawn(_rank, args=(file_rendezvous(Path(folder)), signal_at, step_s or {}, results), nprocs=2, join=True)
        return dict(results)


def _stop_step(decisions: list[bool]) -> int:
    return decisions.index(True) + 1


def test_short_steps_stop_every_rank_at_the_same_later_step() -> None:
    results = _run({1: 3})  # only rank 1 got the signal, during step 3
    assert results[0] == results[1]
    assert _stop_step(results[0]) == 3 + LAG_STEPS  # both decide LAG_STEPS steps after the signal


def test_long_steps_stop_every_rank_at_the_step_the_signal_came_in() -> None:
    results = _run({1: 3}, {0: [LONG] * STEPS, 1: [LONG] * STEPS})
    assert results[0] == results[1]
    assert _stop_step(results[0]) == 3  # the save starts at the next step boundary, not two steps later


def test_one_slow_rank_makes_every_rank_read_the_vote_at_once() -> None:
    # Rank 1's steps grow long from step 5 (rank 0's stay short); the signal reaches rank 0 only, in step 8.
    results = _run({0: 8}, {1: [SHORT] * 4 + [LONG] * (STEPS - 4)})
    assert results[0] == results[1]
    assert _stop_step(results[0]) == 8


def test_steps_that_grow_short_again_go_back_to_the_lag() -> None:
    results = _run({0: 8}, {0: [LONG] * 3 + [SHORT] * (STEPS - 3), 1: [LONG] * 3 + [SHORT] * (STEPS - 3)})
    assert results[0] == results[1]
    assert _stop_step(results[0]) == 8 + LAG_STEPS


def test_no_signal_never_stops() -> None:
    results = _run({}, {1: [LONG] * STEPS})
    assert results[0] == results[1] == [False] * STEPS
