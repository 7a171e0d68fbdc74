"""Issue 14 item 6: the wrapper's one SignalLog decides what a stop signal means in every phase, not only while
the trainer runs. A signal before the resume point is published starts no trainer and ends the attempt as
signalled (the leader concludes and requeues it), the nodes waiting for the resume point and a restore stop
promptly, a signal during the upload drain cuts it short, and a signal is acted on once.

Signals here are real (sent to this process); the trainer is replaced (tests/cluster/test_signals.py runs
the real one on the SLURM cluster)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import commit
from swiftslurm.errors import StorageError
from swiftslurm.node import attempt, resume
from swiftslurm.node.resume import Interrupted, agree_on_resume, publish_signalled
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.layout import RESUME, attempt_dir, output_dir, resume_file
from swiftslurm.rundir.records import read_attempts, read_status
from swiftslurm.signals import SignalLog
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

LOCAL = SlurmEnv.from_environ({})  # node 0, no SLURM: a requeue is a retry in this process


PROMPT_S = 5.0  # "promptly": far below the waits that a signal cuts short (900 s, a whole download)


def committed_checkpoint(run_dir: Path, step: int, last_step: int, mib: int = 0) -> Path:
    """A committed checkpoint-N in the run's output dir (``mib`` MiB of weights)."""
    folder = output_dir(run_dir) / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(os.urandom(mib << 20) if mib else b"weights")
    commit(folder, world_size=1, swift_version="test", last_step=last_step)
    return folder


class Trained(BaseException):
    """Raised by the fake trainer: the attempt went on to train."""


def local_plan(run_dir: Path) -> JobPlan:
    run_dir.mkdir(parents=True, exist_ok=True)  # written at submission
    plan = plan_for(f"run_dir={run_dir}", "swift.max_steps=20", "swift.save_steps=10")
    return replace(plan, tiny_cache=None)


@pytest.fixture
def trainer_starts(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, float]]]:
    """Replaces the trainer: records the signals the attempt still holds when it would start one, then raises."""
    starts: list[list[tuple[int, float]]] = []

    def fake_train(*args: object) -> None:
        signals = next(arg for arg in args if isinstance(arg, SignalLog))
        starts.append(list(signals.received))
        raise Trained

    monkeypatch.setattr(attempt, "train", fake_train)
    return starts


def signal_during_prepare(monkeypatch: pytest.MonkeyPatch, signum: int) -> None:
    """The signal arrives while PREPARE checks the allocation (a real signal to this process)."""
    check = attempt.check_allocation

    def check_then_signal(where: SlurmEnv, plan: JobPlan) -> None:
        check(where, plan)
        signal.raise_signal(signum)

    monkeypatch.setattr(attempt, "check_allocation", check_then_signal)


def test_usr2_during_prepare_starts_no_trainer_and_the_leader_requeues_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer_starts: list[list[tuple[int, float]]]
) -> None:
    run_dir = tmp_path / "run"
    signal_during_prepare(monkeypatch, signal.SIGUSR2)

    with pytest.raises(Trained):  # the retry (a requeue without SLURM) trains
        attempt.run(run_dir, local_plan(run_dir), LOCAL)

    [signalled] = read_attempts(run_dir)
    assert (signalled.reason, signalled.decision) == ("preempted", "requeue"), signalled
    assert [name for name, _ in signalled.signals] == ["SIGUSR2"], signalled
    assert signalled.first_step_at is None and signalled.last_step is None, signalled
    assert json.loads(resume_file(run_dir, signalled.attempt).read_text())["signalled"] is True
    assert trainer_starts == [[]]  # the retry started one, without the signal already acted on


def test_term_during_prepare_is_a_cancel_without_a_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trainer_starts: list[list[tuple[int, float]]]
) -> None:
    run_dir = tmp_path / "run"
    signal_during_prepare(monkeypatch, signal.SIGTERM)

    result = attempt.run(run_dir, local_plan(run_dir), LOCAL)

    assert (result.decision, trainer_starts) == ("stop", [])
    [record] = read_attempts(run_dir)
    assert (record.reason, record.decision) == ("cancelled", "stop"), record
    status = read_status(run_dir)
    assert status is not None and status["state"] == "cancelled", status


def test_a_signal_before_the_choice_is_published_leaves_the_checkpoints_alone(
    tmp_path: Path, trainer_starts: list[list[tuple[int, float]]]
) -> None:
    run_dir = tmp_path / "run"
    plan = local_plan(run_dir)
    committed = committed_checkpoint(run_dir, 10, last_step=20)
    log = SignalLog()
    with log.installed():
        signal.raise_signal(signal.SIGUSR2)
        with pytest.raises(Interrupted):
            agree_on_resume(plan, attempt_dir(run_dir, "a1"), True, stopped=lambda: bool(log.received))
    assert not (attempt_dir(run_dir, "a1") / RESUME).exists()  # the other nodes start nothing from it
    assert committed.is_dir()


def test_a_waiting_node_stops_at_its_own_signal_without_the_resume_point(tmp_path: Path) -> None:
    plan = local_plan(tmp_path / "run")
    log = SignalLog()
    started = time.monotonic()
    with log.installed(), pytest.raises(Interrupted, match="stop signal came while waiting"):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR2)).start()
        agree_on_resume(plan, tmp_path / "attempt", False, stopped=lambda: bool(log.received))
    assert time.monotonic() - started < PROMPT_S


def test_a_follower_signalled_while_waiting_ends_cleanly_with_its_result(
    tmp_path: Path, trainer_starts: list[list[tuple[int, float]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_word_awaited(*_: object) -> None:  # a signalled attempt is never restarted in place
        raise AssertionError("a signalled follower waits for node 0's outcome (up to its heartbeat's 180 s)")

    monkeypatch.setattr(attempt.outcome, "wait_for", no_word_awaited)
    run_dir = tmp_path / "run"
    plan = plan_for("+cluster=local-slurm", f"run_dir={run_dir}")  # two nodes
    run_dir.mkdir()
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2"}
    follower = SlurmEnv.from_environ({**env, "SLURM_NODEID": "1", "SLURM_PROCID": "1"})
    log = SignalLog()
    with log.installed():
        # Node 0 has published nothing, not even made the attempt's dir: the follower waits until its signal.
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR2)).start()
        result = attempt.run(run_dir, replace(plan, tiny_cache=None), follower, log)
    assert (result.exit_code, result.decision, trainer_starts) == (0, None, [])
    written = json.loads((attempt_dir(run_dir, "77") / "node1.json").read_text())
    assert written["exit_code"] == 0  # the leader sees a node that ended, not a silent one


def test_a_waiting_node_ends_when_the_leader_publishes_a_signal(tmp_path: Path) -> None:
    plan = local_plan(tmp_path / "run")
    publish_signalled(tmp_path / "attempt" / RESUME)
    with pytest.raises(Interrupted, match="node 0 ended the attempt"):
        agree_on_resume(plan, tmp_path / "attempt", False)


class BlockingStore:
    """Stands in for a CheckpointStore whose download would take very long: it ends only when cancelled."""

    def __init__(self) -> None:
        self.cancelled = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def download(self) -> None:
        if not self.cancelled.wait(60):
            raise AssertionError("the restore was not cancelled")
        raise StorageError("the transfer was stopped")


def cancelled_restore(stopped: Callable[[], bool]) -> BlockingStore:
    store = BlockingStore()
    restoring = getattr(resume, "_cancelled_when_stopped")  # noqa: B009 - the mechanism under test
    restoring(store.download, store, stopped)
    return store


def test_a_signal_cancels_the_restore_promptly() -> None:
    log = SignalLog()
    started = time.monotonic()
    with log.installed(), pytest.raises(Interrupted, match="during the restore"):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR2)).start()
        cancelled_restore(lambda: bool(log.received))
    assert time.monotonic() - started < PROMPT_S
