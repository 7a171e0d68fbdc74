"""The goodput ledger from hand-made facts: every category of every allocation, and that they add up to it."""

from __future__ import annotations

from typing import Any

import pytest

from swiftslurm.ops.ledger import CATEGORIES, Allocation, AttemptMarks, Ledger, attempt_marks, compute
from swiftslurm.rundir.records import AttemptRecord
from swiftslurm.rundir.timeline import COMMITTED, SAVE, TRAIN_BEGIN, TRAIN_END

WIDTH = 8  # 2 nodes × 4 GPUs


def record(attempt: str, decision: str | None, end: float | None, **phases: float) -> dict[str, Any]:
    return {"attempt": attempt, "job_id": "7", "hosts": ["a", "b"], "decision": decision, "end": end, "phases": phases}


def marks(row: dict[str, Any], events: list[dict[str, Any]], running: bool = False) -> AttemptMarks:
    """attempt_marks of a row as attempts.jsonl holds it."""
    return attempt_marks(AttemptRecord.from_dict(row), events, running)


def begin(t: float) -> dict[str, Any]:
    return {"event": TRAIN_BEGIN, "t": t, "step": 0}


def save(step: int, started: float, t: float) -> dict[str, Any]:
    return {"event": SAVE, "step": step, "started": started, "t": t}


def committed(step: int, t: float) -> dict[str, Any]:
    return {"event": COMMITTED, "step": step, "t": t}


def train_end(started: float, t: float) -> dict[str, Any]:
    return {"event": TRAIN_END, "started": started, "t": t}


def seconds(ledger: Ledger) -> dict[str, float]:
    """Wall seconds per category (the ledger counts device-seconds), without the zeros."""
    return {c: pytest.approx(s / WIDTH) for c, s in ledger.spent_s.items() if s}


PREEMPTED = marks(
    record("7", "requeue", 104, prepare=13, agree_on_resume=15, train=16, conclude=102),
    [begin(30), save(10, 50, 55), committed(10, 57), save(20, 80, 84), committed(20, 86), train_end(84.5, 86.5)],
)
RESUMED = marks(
    record("7.r1", "done", 191, prepare=132, agree_on_resume=133, train=135, conclude=190),
    [begin(150), save(30, 170, 175), committed(30, 176), train_end(175.2, 176.5)],
)
FIRST_RUN = Allocation("7", start=10, end=110, width=WIDTH, submit=0)
SECOND_RUN = Allocation("7", start=130, end=200, width=WIDTH, submit=120)


def test_a_preempted_and_resumed_run_splits_each_job_run_into_categories_that_add_up() -> None:
    ledger = compute([FIRST_RUN, SECOND_RUN], [PREEMPTED, RESUMED], 4, "GPU", now=1000)
    assert seconds(ledger) == {
        "startup": 5 + 3,  # job start -> the wrapper's restore phase
        "restore": 1 + 2,
        "load": 14 + 15,  # the trainer's start -> its training loop
        "committed": 20 + 25 + 20,  # up to the start of each run's last committed save
        "save": (5 + 4 + 2) + (5 + 1.3),  # each save, and the wait for the last commit at the loop's end
        "lost": 0.5 + 0.2,  # steps after the last committed save (the stop vote's, then the last step's)
        "restart": 110 - 86.5,  # the last commit -> SLURM ended the job run for the requeue
        "finish": 200 - 176.5,
    }
    assert ledger.allocated_s == (100 + 70) * WIDTH
    assert ledger.unaccounted_s == pytest.approx(0)
    assert (ledger.queue_wait_s, ledger.requeue_hold_s) == (10 + 10, 120 - 110)
    assert ledger.goodput == pytest.approx(65 / 170)


def test_a_crashed_worker_loses_the_training_since_the_last_commit_and_the_rest_is_the_restart() -> None:
    crashed = marks(
        record("7", "requeue", 61, prepare=11, agree_on_resume=12, train=13, conclude=60) | {"last_step_at": 45},
        [begin(20), save(10, 30, 32), committed(10, 33)],  # a rank died after step 45: no train_end
    )
    ledger = compute([Allocation("7", 10, 70, WIDTH, 9)], [crashed], 4, "GPU", now=1000)
    assert seconds(ledger) == {
        "startup": 2,
        "restore": 1,
        "load": 7,
        "committed": 10,
        "save": 2,
        "lost": 45 - 32,  # the last commit's save -> the newest step node 0 saw
        "restart": 70 - 45,  # the failure noticed, the trainer torn down, the requeue
    }


def test_a_trainer_killed_with_no_step_seen_after_its_last_commit_lost_no_training() -> None:
    killed = marks(
        record("7", "requeue", 61, prepare=11, train=13, conclude=60) | {"last_step_at": 25},
        [begin(20), save(10, 30, 32), committed(10, 33)],
    )
    ledger = compute([Allocation("7", 10, 70, WIDTH)], [killed], 4, "GPU", now=1000)
    assert "lost" not in seconds(ledger) and seconds(ledger)["restart"] == pytest.approx(70 - 32)


def test_a_save_that_never_committed_loses_the_steps_before_it() -> None:
    killed_mid_save = marks(
        record("7", "requeue", 60, prepare=10, agree_on_resume=10, train=10, conclude=59),
        [begin(20), save(10, 30, 32), committed(10, 33), save(20, 40, 45)],  # step 20's commit never came
    )
    ledger = compute([Allocation("7", 10, 60, WIDTH)], [killed_mid_save], 4, "GPU", now=1000)
    assert seconds(ledger)["committed"] == pytest.approx(10)
    assert seconds(ledger)["lost"] == pytest.approx(40 - 32)  # up to the save that never committed
    assert seconds(ledger)["save"] == pytest.approx(2 + 5)
    assert seconds(ledger)["restart"] == pytest.approx(60 - 45)  # no step seen after that save


def test_a_later_commit_covers_the_steps_of_an_earlier_save_that_did_not_commit() -> None:
    attempt = marks(
        record("7", "done", 60, prepare=10, train=10, conclude=59),
        [begin(20), save(10, 30, 32), save(20, 40, 45), committed(20, 47), train_end(45, 47)],
    )
    ledger = compute([Allocation("7", 10, 60, WIDTH)], [attempt], 4, "GPU", now=1000)
    assert seconds(ledger)["committed"] == pytest.approx((30 - 20) + (40 - 32))
    assert "lost" not in seconds(ledger)


def test_a_second_attempt_in_the_same_allocation_prepares_as_part_of_the_restart() -> None:
    first = marks(record("7", "requeue", 31, prepare=11, train=12, conclude=30), [begin(15)])
    second = marks(
        record("7.restart1", "done", 60, prepare=35, train=37, conclude=58),
        [begin(40), save(5, 50, 52), committed(5, 53), train_end(52, 53)],
    )
    ledger = compute([Allocation("7", 10, 60, WIDTH)], [first, second], 4, "GPU", now=1000)
    spent = seconds(ledger)
    assert spent["startup"] == pytest.approx(2)  # only the job's own start
    assert spent["restart"] == pytest.approx(37 - 15)  # no step after the loop began; the next one's preparation
    assert "lost" not in spent
    assert ledger.unaccounted_s == pytest.approx(0)


def test_without_slurm_accounting_each_attempt_is_allocated_its_own_span() -> None:
    local = marks(
        record("local-1", "done", 50, prepare=10, agree_on_resume=11, train=12, conclude=49),
        [begin(20), save(5, 40, 41), committed(5, 42), train_end(41, 42)],
    )
    ledger = compute([], [local], 1, "CPU process", now=1000)
    assert ledger.allocated_s == pytest.approx((50 - 10) * 2)  # two hosts, one process each
    assert not ledger.from_slurm and ledger.allocated_from == "the attempts' own spans (no SLURM accounting)"
    assert ledger.unaccounted_s == pytest.approx(0)


def test_a_running_attempt_counts_its_training_since_the_last_commit_as_not_yet_committed() -> None:
    opened = {"attempt": "7", "job_id": "7", "start": 12}
    running = marks(opened, [begin(20), save(10, 30, 32), committed(10, 33)], running=True)
    ledger = compute([Allocation("7", 10, None, WIDTH)], [running], 4, "GPU", now=50)
    assert seconds(ledger) == {"startup": 10, "committed": 10, "save": 2, "uncommitted": 50 - 32}
    assert ledger.allocated_s == (50 - 10) * WIDTH


def test_an_attempt_lost_without_a_record_is_lost_from_when_it_began() -> None:
    lost = marks({"attempt": "7", "job_id": "7", "start": 12, "end": None, "decision": "requeue"}, [])
    ledger = compute([Allocation("7", 10, 40, WIDTH)], [lost], 4, "GPU", now=1000)
    assert seconds(ledger) == {"startup": 2, "lost": 40 - 12}


def test_records_from_before_the_timeline_split_training_by_the_share_of_steps_committed() -> None:
    old = {"attempt": "7", "job_id": "7", "hosts": ["a"], "start": 20, "end": 100, "first_step_at": 40}
    old |= {"resume_step": 0, "last_step": 40, "committed_step": 30, "decision": "requeue"}
    ledger = compute([Allocation("7", 10, 100, WIDTH)], [marks(old, [])], 4, "GPU", now=1000)
    assert seconds(ledger) == {"startup": 10, "load": 20, "committed": 45, "lost": 15}


def test_an_attempt_outside_its_job_runs_times_is_stated_as_outside_and_not_counted() -> None:
    late = marks(record("7", "done", 75, prepare=12, train=13, conclude=74), [])
    ledger = compute([Allocation("7", 10, 70, WIDTH)], [late], 4, "GPU", now=1000)
    assert ledger.outside_s == pytest.approx(4 * WIDTH)  # the trainer exited 4 s after SLURM's End: said, not counted
    assert ledger.accounted_s == pytest.approx(ledger.allocated_s) and ledger.unaccounted_s == 0


def test_a_sweeps_ledger_is_the_sum_of_its_runs() -> None:
    one = compute([FIRST_RUN], [PREEMPTED], 4, "GPU", now=1000)
    two = compute([SECOND_RUN], [RESUMED], 4, "GPU", now=1000)
    total = one.plus(two)
    assert total.allocated_s == one.allocated_s + two.allocated_s
    assert total.as_dict()["spent_s"].keys() == set(CATEGORIES)
    assert total.as_dict()["goodput"] == pytest.approx(65 / 170, abs=1e-4)
    assert one.plus(compute([], [], 1, "CPU process", 0)).unit == "device"


def test_marks_of_an_attempt_follow_its_phases_and_its_trainer() -> None:
    assert isinstance(PREEMPTED, AttemptMarks)
    assert [m.category for m in PREEMPTED.marks][:4] == ["startup", "restore", "load", "committed"]
    assert PREEMPTED.began == 13 and PREEMPTED.ended == 104


def test_records_past_slurms_whole_second_end_are_not_counted_twice_nor_shown_as_negative_time() -> None:
    # SLURM keeps End cut down to the whole second: the attempt concluded 0.7 s "after" it, and node 0's clock
    # put its prepare 0.4 s before Start. Every allocated second is in one category, and no more.
    edges = marks(record("7", "done", 70.7, prepare=9.6, train=12, conclude=70.6), [])
    ledger = compute([Allocation("7", 10, 70, WIDTH)], [edges], 4, "GPU", now=1000)
    assert ledger.accounted_s == pytest.approx(ledger.allocated_s)
    assert ledger.unaccounted_s >= 0 and ledger.as_dict()["unaccounted_s"] >= 0
    assert ledger.outside_s == pytest.approx((0.6 + 0.4) * WIDTH)  # conclude past End, prepare before Start
    assert seconds(ledger) == {"startup": 2, "load": 70 - 12}  # the trainer ran until SLURM's End


def test_a_run_preempted_twice_on_a_busy_machine_adds_up_to_slurms_allocation() -> None:
    # Each job run's records reach past SLURM's End (up to a second: whole seconds) and the next attempt's
    # prepare lands before the next run's Start by the same rounding: the sum never exceeds the allocation.
    first = marks(record("7", "requeue", 40.9, prepare=10.2, train=11, conclude=40.8), [begin(20)])
    second = marks(record("7.r1", "requeue", 80.95, prepare=49.5, train=52, conclude=80.9), [begin(60)])
    third = marks(record("7.r2", "done", 120.6, prepare=89.8, train=91, conclude=120.5), [begin(100)])
    runs = [Allocation("7", 10, 40, 2), Allocation("7", 50, 80, 2), Allocation("7", 90, 120, 2)]
    ledger = compute(runs, [first, second, third], 1, "CPU process", now=1000)
    assert ledger.allocated_s == 3 * 30 * 2
    assert ledger.accounted_s <= ledger.allocated_s + 1e-9
    assert ledger.unaccounted_s == pytest.approx(0, abs=1e-9) and ledger.unaccounted_s >= 0
