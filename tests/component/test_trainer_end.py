"""watch.py ends the trainer as soon as there is nothing left to wait for: once the checkpoint a stop signal
asked for (of the step the ranks agreed on) is committed (not after ms-swift's and torchrun's shutdown), and once
another node's trainer of the same attempt has failed (not after a collective time-out)."""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import commit
from swiftslurm.engines.hooks import STOP_FILE_ENV, publish_stop_step
from swiftslurm.node.launch import Trainer
from swiftslurm.node.watch import PEER_FAILED, _Watcher
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.layout import output_dir, stop_step_file
from swiftslurm.signals import SignalLog
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

SHUTTING_DOWN = "import time; time.sleep(600)"  # a trainer whose shutdown never ends on its own


@pytest.fixture
def watcher(tmp_path: Path) -> Iterator[Callable[[SignalLog, Callable[[], bool]], _Watcher]]:
    started: list[Trainer] = []

    def make(signals: SignalLog, peer_failed: Callable[[], bool]) -> _Watcher:
        plan = plan_for(f"run_dir={tmp_path}")
        trainer = Trainer([sys.executable, "-c", SHUTTING_DOWN], {}, tmp_path / "node0.log", cwd=tmp_path)
        started.append(trainer)
        watch = ProgressWatch(tmp_path / "progress.json", time.time())
        where = SlurmEnv.from_environ({})
        return _Watcher(plan, where, trainer, lambda _pid: [], signals, watch, None, tmp_path, peer_failed)

    yield make
    for trainer in started:
        trainer.kill()


def committed_now(run_dir: Path, step: int) -> None:
    folder = output_dir(run_dir) / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    commit(folder, world_size=2, swift_version="test")


def agreed(run_dir: Path, step: int) -> None:
    """Global rank 0 publishes the step every rank agreed to save."""
    publish_stop_step(step, {STOP_FILE_ENV: str(stop_step_file(run_dir))})


def stop_signal() -> SignalLog:
    signals = SignalLog()
    signals.record(signal.SIGUSR2)
    return signals


def test_the_trainer_ends_once_the_stop_checkpoint_is_committed(tmp_path: Path, watcher) -> None:  # type: ignore[no-untyped-def]
    running = watcher(stop_signal(), lambda: False)
    running.tick(time.time())
    assert running.trainer.poll() is None  # saving: nothing committed since the signal yet
    agreed(tmp_path, 10)
    committed_now(tmp_path, 10)
    running.tick(time.time())
    assert running.trainer.poll() == -signal.SIGKILL


def test_an_earlier_checkpoint_committed_after_the_signal_does_not_end_the_trainer(tmp_path: Path, watcher) -> None:  # type: ignore[no-untyped-def]
    """The previous save's commit runs in the background and can land after the signal: killing the trainer
    then would lose the stop checkpoint its ranks are still writing."""
    running = watcher(stop_signal(), lambda: False)
    agreed(tmp_path, 12)
    committed_now(tmp_path, 10)
    running.tick(time.time())
    assert running.trainer.poll() is None
    committed_now(tmp_path, 12)
    running.tick(time.time())
    assert running.trainer.poll() == -signal.SIGKILL


def test_a_checkpoint_committed_before_the_signal_does_not_end_the_trainer(tmp_path: Path, watcher) -> None:  # type: ignore[no-untyped-def]
    committed_now(tmp_path, 10)
    time.sleep(0.01)  # the signal comes after that commit
    running = watcher(stop_signal(), lambda: False)
    running.tick(time.time())
    assert running.trainer.poll() is None


def test_a_failed_peer_ends_this_nodes_trainer(watcher) -> None:  # type: ignore[no-untyped-def]
    running = watcher(SignalLog(), lambda: True)
    running.tick(time.time())
    assert running.trainer.poll() == -signal.SIGKILL and running.ended_by == PEER_FAILED


def test_after_a_stop_signal_a_peer_that_ended_does_not_end_this_trainer(watcher) -> None:  # type: ignore[no-untyped-def]
    """Peers end after their part of the save; this node's rank 0 may still be committing it."""
    running = watcher(stop_signal(), lambda: True)
    running.tick(time.time())
    assert running.trainer.poll() is None
