"""StopVote: every rank reads the same vote at the same step, over a real two-process gloo group."""

from __future__ import annotations

import os
import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

from swiftslurm.node.engines.stop_vote import LAG_STEPS, StopVote  # noqa: E402

STEPS = 8


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank(rank: int, port: int, signal_at: dict[int, int], results: dict[int, list[bool]]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    vote = StopVote()
    vote.join()
    requested = False
    decisions = []
    for step in range(1, STEPS + 1):
        requested = requested or step >= signal_at.get(rank, STEPS + 1)
        decisions.append(vote.step_end(requested))
    vote.finish()
    results[rank] = decisions
    dist.destroy_process_group()


def _run(signal_at: dict[int, int]) -> dict[int, list[bool]]:
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(_free_port(), signal_at, results), nprocs=2, join=True)
        return dict(results)


def test_a_signal_on_one_rank_stops_every_rank_at_the_same_later_step() -> None:
    results = _run({1: 3})  # only rank 1 got the signal, during step 3
    assert results[0] == results[1]
    assert results[0].index(True) + 1 == 3 + LAG_STEPS  # both decide LAG_STEPS steps after the signal


def test_no_signal_never_stops() -> None:
    results = _run({})
    assert results[0] == results[1] == [False] * STEPS


def test_one_process_decides_at_once() -> None:
    vote = StopVote()
    vote.join()  # torch.distributed not initialised: no group
    assert vote.step_end(False) is False
    assert vote.step_end(True) is True
    vote.finish()
