"""Issue 29, part 1: global rank 0's heartbeat is written off the training thread. The training loop only hands
the newest beat over; one daemon thread writes the newest it has (rundir/beat.py's BeatWriter). Each write here
goes through a gate the test opens, so what the training thread waits for is forced, never timed."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.engines.hooks import Committer
from swiftslurm.rundir.beat import EVAL, PROGRESS_ENV, SAVE, STEP, Beat, StepBeat, read_beat
from swiftslurm.rundir.jsonio import write_json_atomic
from tests.unit.test_finished import checkpoint

WAIT_S = 30.0  # only a guard against a test that would hang: every wait below ends by the test's own doing


class Gate:
    """A beat file writer that holds each write until the test lets one through (`let`). It notes every beat
    whose write began (`began`) and every beat written (`written`), in order, and any beat written on the
    training thread itself (`on_caller`): that one is written at once, as the training thread must never wait."""

    def __init__(self) -> None:
        self.began: list[int] = []
        self.written: list[int] = []
        self.on_caller: list[int] = []
        self._changed = threading.Condition()
        self._let = 0

    def __call__(self, path: Path, beat: dict[str, Any]) -> None:
        with self._changed:
            self.began.append(beat["step"])
            self._changed.notify_all()
            if threading.current_thread() is threading.main_thread():
                self.on_caller.append(beat["step"])
            else:
                assert self._changed.wait_for(lambda: self._let > 0, WAIT_S), "the test never let the write through"
                self._let -= 1
        write_json_atomic(path, beat, durable=False)
        with self._changed:
            self.written.append(beat["step"])

    def let(self, writes: int = 1) -> None:
        with self._changed:
            self._let += writes
            self._changed.notify_all()

    def wait_began(self, count: int) -> None:
        """Until ``count`` writes have begun (the writer thread holds the newest of them)."""
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.began) >= count, WAIT_S), self.began


def gated(path: Path) -> tuple[StepBeat, Gate]:
    gate = Gate()
    return StepBeat(path, lambda: 1000.0, background=True, write_file=gate), gate


def test_a_write_that_blocks_does_not_block_the_training_thread(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    beat, gate = gated(path)
    beat.step_ended(1, 40, (EVAL,))
    gate.wait_began(1)  # the writer thread is inside the write of step 1, held
    beat.pausing(EVAL)  # foreseen: nothing to hand over
    beat.pause_ended(EVAL)
    beat.step_ended(2, 40)
    beat.pausing(SAVE)
    beat.pause_ended(SAVE)
    # Every call returned while the first write is still held: the training thread waited for none of them.
    assert gate.on_caller == [] and gate.written == [] and read_beat(path) is None
    gate.let(2)
    assert beat.flush(WAIT_S)
    assert read_beat(path) == Beat(2, 40, STEP, 1000.0)


def test_beats_handed_over_while_a_write_is_held_end_with_only_the_newest_written(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    beat, gate = gated(path)
    beat.step_ended(1, 40)
    gate.wait_began(1)
    for step in (2, 3, 4):  # each replaces the one before it: none of them is written but the last
        beat.step_ended(step, 40)
    gate.let(5)  # more than needed: a write that should not happen would go through
    assert beat.flush(WAIT_S)
    assert gate.written == [1, 4] and gate.began == [1, 4]  # step 1 was being written already; never 2 or 3
    assert read_beat(path) == Beat(4, 40, STEP, 1000.0)


def test_flush_returns_once_the_newest_beat_is_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    beat, gate = gated(path)
    beat.step_ended(1, 40)
    gate.wait_began(1)
    beat.step_ended(2, 40, (SAVE,))
    assert not beat.flush(timeout=0)  # neither is written
    gate.let()  # step 1 through; the thread takes step 2 next
    gate.wait_began(2)
    assert not beat.flush(timeout=0)  # step 1 is on disk, not the newest
    assert read_beat(path) == Beat(1, 40, STEP, 1000.0)
    gate.let()
    assert beat.flush(WAIT_S)
    assert read_beat(path) == Beat(2, 40, SAVE, 1000.0)
    assert beat.flush(timeout=0)  # nothing new handed over: nothing to wait for


def test_a_failing_write_is_reported_once_and_training_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "progress.json"
    on: list[threading.Thread] = []

    def full_twice(at: Path, beat: dict[str, Any]) -> None:
        on.append(threading.current_thread())
        if len(on) <= 2:
            raise OSError(28, "No space left on device")
        write_json_atomic(at, beat, durable=False)

    beat = StepBeat(path, lambda: 1000.0, background=True, write_file=full_twice)
    for step in (1, 2, 3):
        beat.step_ended(step, 40)
        assert beat.flush(WAIT_S)  # a failed write counts as done: flush does not wait for ever
    out = capsys.readouterr().out
    assert out.count("cannot be written") == 1 and "No space left on device" in out
    assert read_beat(path) == Beat(3, 40, STEP, 1000.0)  # tried again at the next beat
    assert threading.main_thread() not in on


def test_an_unexpected_error_in_the_write_does_not_end_the_writer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A writer thread that died would leave every later beat unwritten and every flush waiting."""
    path, calls = tmp_path / "progress.json", [0]

    def broken_once(at: Path, beat: dict[str, Any]) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise ValueError("not a file-system error")
        write_json_atomic(at, beat, durable=False)

    beat = StepBeat(path, lambda: 1000.0, background=True, write_file=broken_once)
    beat.step_ended(1, 40)
    assert beat.flush(WAIT_S)
    beat.step_ended(2, 40)
    assert beat.flush(WAIT_S)
    assert read_beat(path) == Beat(2, 40, STEP, 1000.0)
    assert capsys.readouterr().out.count("ValueError('not a file-system error')") == 1


def test_the_plugins_beat_writes_from_a_daemon_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """from_environ is what the plugins use: its writes leave the training thread, and the thread never keeps
    the process alive. The dataclass itself stays synchronous (the tests that read the file after each call)."""
    path = tmp_path / "progress.json"
    monkeypatch.setenv(PROGRESS_ENV, str(path))
    beat = StepBeat.from_environ(rank_zero=True)
    beat.write_file = gate = Gate()
    beat.step_ended(1, 40)
    gate.wait_began(1)
    assert gate.on_caller == []
    assert all(thread.daemon for thread in threading.enumerate() if thread.name == "swiftslurm-beat")
    gate.let()
    assert beat.flush(WAIT_S) and read_beat(path) is not None
    StepBeat(path, lambda: 1001.0).step_ended(2, 40)  # synchronous: on disk on return
    assert read_beat(path) == Beat(2, 40, STEP, 1001.0)
    assert StepBeat.from_environ(rank_zero=False).path is None


class FlushOpens(StepBeat):
    """Its held writes go through only once someone flushes: without a flush, nothing reaches the disk."""

    gate: Gate

    def flush(self, timeout: float | None = None) -> bool:
        self.gate.let(100)
        return super().flush(timeout)


def committer_with_held_beat(path: Path) -> tuple[Committer, Gate]:
    committer = Committer(engine="swift")
    beat = FlushOpens(path, lambda: 1000.0, background=True, write_file=(gate := Gate()))
    beat.gate = gate
    committer.beat = beat
    return committer, gate


def test_the_train_end_waits_for_the_last_beat(tmp_path: Path) -> None:
    """The writer thread is a daemon: the process may exit as soon as training ends, so the end flushes."""
    path = tmp_path / "progress.json"
    committer, gate = committer_with_held_beat(path)
    committer.step_ended(40, 40, ())
    gate.wait_began(1)
    committer.finish()
    assert read_beat(path) == Beat(40, 40, STEP, 1000.0)


def test_a_checkpoints_beat_is_on_disk_before_its_commit_begins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The wrapper ends a stopping trainer on the stop checkpoint's manifest and records the last step it read
    from the beat: that step's beat must not still be waiting for the writer thread."""
    path, seen = tmp_path / "progress.json", []
    real = ck.commit

    def commit_seeing_beat(folder: Path, *args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.append(read_beat(path))
        return real(folder, *args, **kwargs)

    monkeypatch.setattr(ck, "commit", commit_seeing_beat)
    committer, gate = committer_with_held_beat(path)
    committer.step_ended(20, 40, (SAVE,))
    gate.wait_began(1)
    committer.after_save(checkpoint(tmp_path, 20, committed=False), last_step=40)
    committer.wait()
    # Its save's beat, or the next one (the save ended: the commit runs beside the loop).
    assert len(seen) == 1 and seen[0] is not None and seen[0].step == 20
    committer.finish()
