"""Checkpoint commit, verification, quarantine and retention on real files."""

from __future__ import annotations

import json
from pathlib import Path

from swiftslurm.ckpt import checkpoint as ck


def make_checkpoint(output: Path, step: int, commit: bool = True, size: int = 100) -> Path:
    folder = output / f"checkpoint-{step}"
    (folder / "global_step1").mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(bytes(size))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    (folder / "global_step1" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 10)
    if commit:
        ck.commit(folder, world_size=2, swift_version="4.6.0")
    return folder


def test_manifest_lists_every_file_with_size_and_checksum(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 10)
    manifest = ck.read_manifest(folder)
    assert manifest is not None and manifest["step"] == 10 and manifest["world_size"] == 2
    paths = {f["path"]: f for f in manifest["files"]}
    assert set(paths) == {
        "adapter_model.safetensors",
        "trainer_state.json",
        "global_step1/zero_pp_rank_0_mp_rank_00_optim_states.pt",
    }
    assert paths["adapter_model.safetensors"]["size"] == 100
    assert len(paths["trainer_state.json"]["sha256"]) == 64
    assert not list(folder.glob(".swiftslurm_manifest.json.*")), "temp file left behind"


def test_a_checkpoint_without_manifest_is_never_the_resume_point(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20, commit=False)  # killed mid-save: looks complete, is not committed
    assert ck.newest_checkpoint(tmp_path) == tmp_path / "checkpoint-10"


def test_truncated_file_makes_a_committed_checkpoint_invalid(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    newer = make_checkpoint(tmp_path, 20)
    (newer / "adapter_model.safetensors").write_bytes(bytes(50))
    found, rejected = ck.newest_committed(tmp_path)
    assert found == tmp_path / "checkpoint-10"
    assert any("50 bytes" in r for r in rejected)


def test_deep_check_catches_changed_contents(tmp_path: Path) -> None:
    folder = make_checkpoint(tmp_path, 10)
    (folder / "adapter_model.safetensors").write_bytes(b"\x01" * 100)
    assert ck.problems(folder) == []
    assert "checksum" in ck.problems(folder, deep=True)[0]


def test_prepare_resume_quarantines_newer_uncommitted_checkpoints(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    make_checkpoint(tmp_path, 20, commit=False)
    point = ck.prepare_resume(tmp_path, tag="77.r1", move=True)
    assert point.checkpoint == tmp_path / "checkpoint-10" and point.step == 10
    assert point.quarantined == (tmp_path / "quarantine" / "checkpoint-20.77.r1",)
    assert (tmp_path / "quarantine" / "checkpoint-20.77.r1" / "adapter_model.safetensors").is_file()
    assert not (tmp_path / "checkpoint-20").exists()


def test_followers_do_not_move_anything(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 20, commit=False)
    point = ck.prepare_resume(tmp_path, tag="x", move=False)
    assert point.checkpoint is None and point.step == 0 and (tmp_path / "checkpoint-20").exists()


def test_retention_keeps_the_newest_committed_and_never_touches_uncommitted(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        make_checkpoint(tmp_path, step)
    make_checkpoint(tmp_path, 40, commit=False)
    gone = ck.prune_committed(tmp_path, keep=1)
    assert gone == [tmp_path / "checkpoint-10", tmp_path / "checkpoint-20"]
    assert ck.newest_checkpoint(tmp_path) == tmp_path / "checkpoint-30"
    assert (tmp_path / "checkpoint-40").exists()
    assert ck.prune_committed(tmp_path, keep=0) == []  # 0 still keeps the newest


def test_symlinks_and_other_folders_are_not_checkpoints(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    (tmp_path / "last-checkpoint").symlink_to("checkpoint-10")
    (tmp_path / "checkpoint-x").mkdir()
    assert [step for step, _ in ck.checkpoint_dirs(tmp_path)] == [10]
