"""Signal forwarding targets, the training summary and run records."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from swiftslurm.engines.progress import finished_steps
from swiftslurm.rundir import records
from swiftslurm.rundir.records import AttemptRecord
from swiftslurm.signals import SignalLog


def test_signal_handler_only_records() -> None:
    log = SignalLog()
    with log.installed((signal.SIGUSR2,)):
        signal.raise_signal(signal.SIGUSR2)
    assert [s for s, _ in log.received] == [signal.SIGUSR2]
    assert log.first(signal.SIGUSR2) is not None


def test_finished_steps_come_from_the_training_summary(tmp_path: Path) -> None:
    lines = [
        {"loss": 6.6, "global_step/max_steps": "27/40"},
        {"train_runtime": 4.1, "train_loss": 6.5, "global_step/max_steps": "27/40"},
        {"loss": 6.4, "global_step/max_steps": "40/40"},
        {"train_runtime": 3.0, "train_loss": 6.3, "global_step/max_steps": "40/40"},
    ]
    (tmp_path / "logging.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert finished_steps(tmp_path) == (40, 40)
    assert finished_steps(tmp_path / "missing") is None


def test_an_attempt_that_died_without_a_record_is_reported_once(tmp_path: Path) -> None:
    assert records.open_attempt(tmp_path, AttemptRecord("5")) is None
    lost = records.open_attempt(tmp_path, AttemptRecord("5.r1"))  # attempt 5 never wrote its line
    assert lost == AttemptRecord("5")
    records.append_attempt(tmp_path, AttemptRecord("5.r1", reason="finished"))
    assert records.open_attempt(tmp_path, AttemptRecord("5.r2")) is None
    assert [r.attempt for r in records.read_attempts(tmp_path)] == ["5.r1"]


def test_torn_last_line_of_attempts_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "attempts.jsonl").write_text('{"attempt": "1"}\n{"attem')
    assert records.read_attempts(tmp_path) == [AttemptRecord("1")]


def test_silent_hosts_are_the_nodes_without_a_result(tmp_path: Path) -> None:
    records.write_node_result(tmp_path, 0, "node1", 1)
    records.write_node_result(tmp_path, 2, "node3", 1)
    assert records.silent_hosts(tmp_path, ("node1", "node2", "node3"), wait_s=0) == ["node2"]
