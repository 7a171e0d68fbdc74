"""The disk: retention that a kill midway cannot leave half done, and what an attempt's start deletes."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.ckpt import checkpoint as ck


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
