"""Each rank's wait for its data loader (engines/forward_clock.py, FetchClock), published in its node's pace beside
the forwards (rundir/pace.py) and shown by `status` (docs/resilience.md, 'Stragglers'): only the `next` calls of
the Trainer's get_batch_samples count, never its collective; the node's is its slowest rank's; shown, not judged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.engines import forward_clock
from swiftslurm.ops.runs import newest_paces
from swiftslurm.ops.status import data_wait_line
from swiftslurm.rundir.layout import attempt_dir, pace_file
from swiftslurm.rundir.pace import RECENT_STEPS, WARMUP_STEPS, Pace, PaceWriter, read_pace
from swiftslurm.rundir.records import AttemptRecord
from tests.unit.test_waiting import FACTS


class Trainer:
    """transformers' get_batch_samples as 5.x runs it: the step's micro-batches, then their tokens counted across
    ranks (a gather: here 5 s of waiting for the slowest rank)."""

    def __init__(self, now: list[float]) -> None:
        self.now = now

    def get_batch_samples(self, epoch_iterator: Iterator[Any], num_batches: int, device: str) -> tuple[list, None]:
        batches = [next(epoch_iterator) for _ in range(num_batches)]
        self.now[0] += 5.0
        return batches, None


class DpoTrainer(Trainer):
    """ms-swift's DPO trainer overrides the method and calls the Trainer's."""

    def get_batch_samples(self, *args: Any, **kwargs: Any) -> tuple[list, None]:
        return super().get_batch_samples(*args, **kwargs)


def loader(now: list[float], seconds: float) -> Iterator[dict[str, int]]:
    while True:
        now[0] += seconds  # the wait for the next batch
        yield {"input_ids": 1}


@pytest.mark.parametrize("kind", [Trainer, DpoTrainer])
def test_only_the_fetches_of_the_steps_batches_are_timed_not_the_token_count(
    monkeypatch: pytest.MonkeyPatch, kind: type[Trainer]
) -> None:
    now = [0.0]
    monkeypatch.setattr(forward_clock.time, "perf_counter", lambda: now[0])
    trainer = kind(now)
    fetch = forward_clock.FetchClock.attach(trainer)
    assert fetch is not None
    batches, _ = trainer.get_batch_samples(loader(now, 0.3), 2, "cpu")
    assert len(batches) == 2 and fetch.step_ended() == pytest.approx(0.6)
    assert fetch.step_ended() == 0.0  # each step's own


def test_a_trainer_that_fetches_another_way_is_not_timed() -> None:
    assert forward_clock.FetchClock.attach(object()) is None


def test_each_steps_data_wait_goes_to_the_writer_before_its_forwards() -> None:
    calls: list[tuple[str, float]] = []

    class Writer:
        def data_waited(self, seconds: float) -> None:
            calls.append(("data", seconds))

        def step_ended(self, step: int, seconds: float) -> None:
            calls.append(("forward", seconds))

    class Clock:
        def step_ended(self, step: int) -> None:
            pass

        def done_steps(self) -> list[tuple[int, float]]:
            return [(7, 0.2)]

    class Fetch:
        def step_ended(self) -> float:
            return 0.4

    forward_clock.NodePace(Writer(), Clock(), Fetch()).step_ended(7)  # type: ignore[arg-type]
    assert calls == [("data", 0.4), ("forward", 0.2)]


def test_the_node_publishes_the_median_data_wait_of_its_slowest_loader(tmp_path: Path) -> None:
    published, local = tmp_path / "run" / "pace" / "node1.json", tmp_path / "local"
    ranks = [PaceWriter(published if r == 0 else None, local, node=1, local_rank=r, clock=lambda: 0.0) for r in (0, 1)]
    for step in range(1, WARMUP_STEPS + RECENT_STEPS + 1):
        for rank in (1, 0):  # local rank 0 last: it reads what the other wrote
            warm = step <= WARMUP_STEPS
            ranks[rank].data_waited(9.0 if warm else 0.4 if rank == 1 else 0.01)  # the warm-up's waits never count
            ranks[rank].step_ended(step, 0.2)
    pace = read_pace(published)
    assert pace is not None and (pace.forward_s, pace.data_s) == (0.2, 0.4), pace


def test_a_pace_without_a_data_wait_reads_as_not_timed(tmp_path: Path) -> None:
    path = tmp_path / "node0.json"
    path.write_text('{"node": 0, "forward_s": 0.1, "steps": 3, "step": 9, "t": 1.0}')  # an engine that times none
    pace = read_pace(path)
    assert pace == Pace(0, 0.1, 3, 9, 1.0) and pace.data_s is None and "data_s" not in pace.as_dict()
    assert json.loads(json.dumps(replace(pace, data_s=0.25).as_dict()))["data_s"] == 0.25


def test_status_shows_each_nodes_data_wait_once_one_is_worth_a_line(tmp_path: Path) -> None:
    here = attempt_dir(tmp_path, "77")
    for node, waited in ((0, 0.002), (1, 0.31)):
        PaceWriter(None).write(pace_file(here, node), Pace(node, 0.2, RECENT_STEPS, 40, 1.0, 0, waited))
    paces = newest_paces(tmp_path, [AttemptRecord("77", "77")])
    assert [(p["node"], p["data_s"]) for p in paces] == [(0, 0.002), (1, 0.31)]
    assert data_wait_line(replace(FACTS, paces=paces)) == (
        "data-loader wait per step (median of recent steps; shown, not judged): node 0 0.002 s, node 1 0.310 s"
    )
    quick = tuple({**pace, "data_s": 0.004} for pace in paces)
    assert data_wait_line(replace(FACTS, paces=quick)) is None  # a prefetching loader's few ms say nothing
