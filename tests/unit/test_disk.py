"""The disk: retention that a kill midway cannot leave half done, what an attempt's start deletes, and a save
that does not fit (the attempt stops as disk_full, its record written from the space the wrapper held back).
The real full filesystem is tests/component/test_disk_full.py."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.node import attempt, watch
from swiftslurm.rundir import reserve
from swiftslurm.rundir.layout import QUARANTINE, output_dir, reserve_file
from swiftslurm.rundir.records import read_attempts, read_status
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for


class Killed(BaseException):
    """The process was SIGKILLed here: nothing after this line of it runs."""


def checkpoint(output: Path, step: int, commit: bool = True, size: int = 1000) -> Path:
    folder = output / f"checkpoint-{step}"
    (folder / "global_step1").mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(bytes(size))
    (folder / "global_step1" / "optim_states.pt").write_bytes(b"x" * 10)
    if commit:
        ck.commit(folder, world_size=1, swift_version="test")
    return folder


def killed_after_one_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """shutil.rmtree deletes one file of the tree, then the process is killed."""

    def rmtree(path: str | Path, *args: Any, **kwargs: Any) -> None:
        next(p for p in Path(path).rglob("*") if p.is_file()).unlink()
        raise Killed(path)

    monkeypatch.setattr(shutil, "rmtree", rmtree)


def test_a_prune_killed_midway_leaves_no_half_deleted_checkpoint_and_the_next_start_deletes_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trainer prunes right after a commit, and the wrapper kills it as soon as it sees that commit."""
    for step in (10, 20):
        checkpoint(tmp_path, step)
    killed_after_one_file(monkeypatch)
    with pytest.raises(Killed):
        ck.prune_committed(tmp_path, keep=1)
    monkeypatch.undo()

    for _, folder in ck.checkpoint_dirs(tmp_path):  # in place: whole and committed, or gone
        assert ck.read_manifest(folder) is not None and ck.problems(folder, deep=True) == [], folder
    point = ck.prepare_resume(tmp_path, tag="next", move=True)
    assert point.checkpoint == tmp_path / "checkpoint-20"
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-20"], "the pruned checkpoint's leftovers are still there"


def test_an_attempt_start_deletes_earlier_quarantine_and_uncommitted_checkpoints_older_than_the_resume_point(
    tmp_path: Path,
) -> None:
    earlier = tmp_path / ck.QUARANTINE / "checkpoint-30.7"  # an overrun stop-save, set aside by attempt 7
    earlier.mkdir(parents=True)
    (earlier / "adapter_model.safetensors").write_bytes(bytes(1000))
    failed_commit = checkpoint(tmp_path, 5, commit=False)  # training went on after its commit failed
    merged = failed_commit.with_name("checkpoint-5-merged")
    merged.mkdir()
    checkpoint(tmp_path, 10)
    checkpoint(tmp_path, 20, commit=False)  # killed mid-save: newer than the resume point

    ck.prepare_resume(tmp_path, tag="8", move=False)  # a follower deletes nothing
    assert earlier.is_dir() and failed_commit.is_dir()
    point = ck.prepare_resume(tmp_path, tag="8", move=True)

    assert point.step == 10
    assert [p.name for p in (tmp_path / ck.QUARANTINE).iterdir()] == ["checkpoint-20.8"]  # this attempt's only
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-10", ck.QUARANTINE]
    assert set(point.removed) == {earlier, failed_commit, merged}  # the attempt's record lists them


def test_the_reserve_is_real_blocks_and_a_disk_too_full_for_it_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert reserve.hold(tmp_path, 1, size=1 << 20) is None
    assert reserve_file(tmp_path, 1).stat().st_size == 1 << 20
    assert reserve_file(tmp_path, 1).stat().st_blocks * 512 >= 1 << 20  # allocated, not a sparse file
    reserve.release(tmp_path, 1)
    assert not reserve_file(tmp_path, 1).exists()

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    why = reserve.hold(tmp_path, 1, size=1 << 20)
    assert why is not None and "could not reserve 1 MiB" in why and "No space left on device" in why
    assert not reserve_file(tmp_path, 1).exists()


# ---------------------------------------------------------------- a save that fills the disk, through attempt.run


class FillsTheDisk:
    """watch.py's Trainer, without a process: writes part of checkpoint-20 and exits 1 (a save that hit ENOSPC
    crashes the trainer, its traceback unwritten)."""

    runs: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("")
        checkpoint(Path(cwd) / "output", 20, commit=False, size=500)
        self.runs.append({"reserve": reserve_file(Path(cwd), 0).stat().st_size})

    pid = 0
    leftovers: tuple[str, ...] = ()

    def poll(self) -> int:
        return 1

    def kill(self) -> None:
        pass


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """The filesystem of the run dir reports ``free`` bytes available."""

    def install(free: int) -> None:
        real = shutil.disk_usage
        monkeypatch.setattr(shutil, "disk_usage", lambda path: real(path)._replace(free=free))

    return install


def test_a_save_that_fills_the_disk_is_set_aside_named_with_the_space_and_requeued_until_the_failures_are_spent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full_disk: Callable[[int], None]
) -> None:
    run_dir = tmp_path / "run"
    overrides = ("swift.max_steps=40", "swift.save_steps=10", "resilience.backoff_base_s=0")
    plan = replace(plan_for(f"run_dir={run_dir}", *overrides, "resilience.max_consecutive_failures=1"), tiny_cache=None)
    checkpoint(plan.output_dir, 10, size=3000)
    FillsTheDisk.runs = []
    monkeypatch.setattr(watch, "Trainer", FillsTheDisk)
    full_disk(100)

    result = attempt.run(run_dir, plan, SlurmEnv.from_environ({}))

    first, second = read_attempts(run_dir)  # retried outside SLURM: a requeue is a retry in this process
    assert [(r.reason, r.decision) for r in (first, second)] == [("disk_full", "requeue"), ("disk_full", "stop")]
    assert f"saving {output_dir(run_dir)}/checkpoint-20 did not fit: 100 B free" in first.why
    assert "a checkpoint needs about 3.0 kB (the size of checkpoint-10)" in first.why
    assert f"set aside as quarantine/checkpoint-20.{first.attempt}, checkpoint-10 is kept" in first.why
    assert "requeued in 0s (1 of 1 attempts in a row without progress" in first.why
    assert "stopped: full again after 2 attempt(s) in a row without progress" in second.why
    assert result.decision == "stop"
    assert [Path(p).name for p in first.quarantined] == [f"checkpoint-20.{first.attempt}"]
    assert first.quarantined[0] in second.removed  # the next start deleted it
    assert ck.newest_checkpoint(plan.output_dir) == plan.output_dir / "checkpoint-10"
    assert (read_status(run_dir) or {})["state"] == "failed"
    assert FillsTheDisk.runs == [{"reserve": reserve.RESERVE_BYTES}] * 2  # held while each trainer ran
    assert not reserve_file(run_dir, 0).exists()  # freed for the records


def test_a_step_set_aside_twice_in_one_attempt_keeps_both(tmp_path: Path) -> None:
    """An attempt sets aside the unfinished checkpoint-50 it found at its start, trains, and sets aside its own
    unfinished checkpoint-50 when the disk fills: the second must not collide with the first (it did, with
    `Directory not empty`, and the attempt ended without a record; seen in the soak, seed 20261209)."""
    output = tmp_path / "output"
    for _ in range(2):
        (output / "checkpoint-50").mkdir(parents=True)
        (output / "checkpoint-50" / "adapter_model.safetensors").write_bytes(b"half")
        [moved] = ck.quarantine_newer_than(output, 40, "93.i2")
        assert moved.is_dir() and (moved / "adapter_model.safetensors").read_bytes() == b"half"
    assert sorted(p.name for p in (output / QUARANTINE).iterdir()) == ["checkpoint-50.93.i2", "checkpoint-50.93.i2-1"]


def test_an_attempt_whose_concluding_fails_still_leaves_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, full_disk: Callable[[int], None]
) -> None:
    """Whatever breaks while node 0 concludes (a bug, a filesystem error), the run dir says how the attempt
    ended: before, the wrapper's exception left no row and status.json at the last phase it reached."""
    run_dir = tmp_path / "run"
    plan = replace(plan_for(f"run_dir={run_dir}", "swift.max_steps=40", "swift.save_steps=10"), tiny_cache=None)
    checkpoint(plan.output_dir, 10, size=3000)
    FillsTheDisk.runs = []
    monkeypatch.setattr(watch, "Trainer", FillsTheDisk)
    full_disk(100)

    def broken(*_: object) -> None:
        raise OSError(errno.ENOTEMPTY, "Directory not empty")

    monkeypatch.setattr(attempt, "conclude", broken)
    with pytest.raises(OSError, match="Directory not empty"):
        attempt.run(run_dir, plan, SlurmEnv.from_environ({}))
    [row] = read_attempts(run_dir)
    assert (row.reason, row.decision) == ("infra", "stop") and "Directory not empty" in row.why, row
    status = read_status(run_dir) or {}
    assert status["state"] == "failed" and "failed while concluding" in status["why"], status
