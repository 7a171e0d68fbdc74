"""The commit flow (hooks.Committer, shared_commit): the ranks that wrote a checkpoint hash it together over
a real two-process gloo group, rank 0 writes the manifest, and a save waits for the previous commit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.engines.hooks import Committer
from swiftslurm.errors import CommitFailed
from tests.conftest import file_rendezvous
from tests.unit.test_shared_commit import zero3_checkpoint

torch = pytest.importorskip("torch")


dist = pytest.importorskip("torch.distributed")


mp = pytest.importorskip("torch.multiprocessing")


def _rank(rank: int, rendezvous: str, folder: Path, hashed: dict[int, Any], rank1_done: Any) -> None:
    os.environ["WORLD_SIZE"] = "2"
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    mine: list[str] = []
    real_hash, real_write = ck.sha256_and_fsync, ck.write_json_atomic

    def recording(path: Path) -> str:
        mine.append(str(path.relative_to(folder)))
        return real_hash(path)

    def late_manifest(path: Path, data: dict[str, Any], **options: Any) -> None:
        rank1_done.wait(timeout=2)  # rank 0 writes the manifest after rank 1 ended its commit (if it can)
        real_write(path, data, **options)

    ck.sha256_and_fsync = recording  # type: ignore[assignment]  # which rank read which file
    ck.write_json_atomic = late_manifest  # type: ignore[assignment]
    committer = Committer(engine="swift")
    committer.after_save(folder, last_step=10)
    committer.finish()
    if rank == 1:
        rank1_done.set()
    hashed[rank] = (mine, ck.is_committed(folder))  # committed when this rank's commit ended?
    dist.destroy_process_group()


def test_two_ranks_commit_a_zero3_checkpoint_together(tmp_path: Path) -> None:
    folder = zero3_checkpoint(tmp_path, 5, 2)
    with mp.Manager() as manager:
        answers = manager.dict()
        mp.spawn(_rank, args=(file_rendezvous(folder.parent), folder, answers, manager.Event()), nprocs=2, join=True)
        hashed = {rank: answers[rank][0] for rank in (0, 1)}
        assert answers[0][1] and answers[1][1]  # no rank's commit ends before the manifest is written
    assert {p for p in hashed[1] if "zero_pp_rank" in p} == {
        f"global_step5/zero_pp_rank_1_mp_rank_00_{kind}.pt" for kind in ("optim_states", "model_states")
    }
    assert not set(hashed[0]) & set(hashed[1])  # each file read once
    manifest = ck.read_manifest(folder)
    assert manifest is not None and (manifest["world_size"], manifest["last_step"]) == (2, 10)
    expected = ck.file_entries(folder, list(ck.file_sizes(folder)))
    assert manifest["files"] == expected  # the same entries, in the same order, as one process hashing all
    assert ck.problems(folder, deep=True) == []


def _failing_rank(rank: int, rendezvous: str, folder: Path, done: dict[int, str]) -> None:
    os.environ["WORLD_SIZE"] = "2"
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    if rank == 1:

        def unreadable(path: Path) -> str:
            raise PermissionError(13, "Permission denied", str(path))

        ck.sha256_and_fsync = unreadable  # type: ignore[assignment]
    committer = Committer(engine="swift")
    committer.after_save(folder, last_step=10)
    try:
        committer.finish()
        done[rank] = "ended"
    except CommitFailed:  # the last commit failed: the trainer must not exit as if it were committed
        done[rank] = "failed"
    dist.destroy_process_group()


def test_a_rank_that_cannot_hash_leaves_the_checkpoint_uncommitted_and_no_rank_waiting(tmp_path: Path) -> None:
    folder = zero3_checkpoint(tmp_path, 5, 2)
    with mp.Manager() as manager:
        done = manager.dict()
        mp.spawn(_failing_rank, args=(file_rendezvous(folder.parent), folder, done), nprocs=2, join=True)
        # Both ranks' commits ended; rank 0, which writes the manifest, knows it failed and fails its trainer.
        assert dict(done) == {0: "failed", 1: "ended"}
    assert not ck.is_committed(folder)  # resume falls back to an older checkpoint


# --- issue 25, item 7: a shared file system's cached listings ------------------------------------------------


def _stale_rank(rank: int, rendezvous: str, folder: Path, hidden: str, dcp: bool) -> None:
    """A rank of a two-rank commit; rank 0's listing lacks the files whose names contain ``hidden``, as an NFS
    or Lustre client's cached listing lacks the files another node has just written. With ``dcp`` both
    ranks first save a torch.distributed.checkpoint into the checkpoint's `iter_0000006/`."""
    from swiftslurm.ckpt import shared_commit

    os.environ["WORLD_SIZE"] = "2"
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=2)
    if dcp:
        import torch.distributed.checkpoint as dcp_api

        dcp_api.save({f"layer{rank}": torch.full((64,), float(rank))}, checkpoint_id=str(folder / "iter_0000006"))
        dist.barrier()
    real = shared_commit._listing

    def cached(path: Path) -> dict[str, int] | str:
        listing = real(path)
        if rank != 0 or isinstance(listing, str):
            return listing
        return {name: size for name, size in listing.items() if hidden not in name}

    shared_commit._listing = cached  # type: ignore[assignment]
    committer = Committer(engine="swift")
    committer.after_save(folder, last_step=10)
    try:
        committer.finish()
    except CommitFailed:  # the last checkpoint: the trainer fails rather than end as if it were committed
        print(f"rank {rank}: the final commit failed", flush=True)
    dist.destroy_process_group()


def _commit_with_stale_listing(folder: Path, hidden: str, dcp: bool = False) -> None:
    mp.spawn(_stale_rank, args=(file_rendezvous(folder.parent), folder, hidden, dcp), nprocs=2, join=True)


def test_shards_missing_from_rank_zeros_cached_listing_are_still_in_the_manifest(tmp_path: Path) -> None:
    folder = zero3_checkpoint(tmp_path, 5, 2)
    _commit_with_stale_listing(folder, hidden="zero_pp_rank_1_")
    manifest = ck.read_manifest(folder)
    assert manifest is not None
    listed = {entry["path"] for entry in manifest["files"]}
    assert {f"global_step5/zero_pp_rank_1_mp_rank_00_{kind}_states.pt" for kind in ("optim", "model")} <= listed
    assert listed == set(ck.file_sizes(folder))
    assert ck.problems(folder, deep=True) == []


def test_a_dcp_shard_missing_from_rank_zeros_cached_listing_is_still_in_the_manifest(tmp_path: Path) -> None:
    folder = tmp_path / "checkpoint-6"
    folder.mkdir()
    (folder / "latest_checkpointed_iteration.txt").write_text("6")
    _commit_with_stale_listing(folder, hidden="__1_", dcp=True)
    manifest = ck.read_manifest(folder)
    assert manifest is not None
    assert "iter_0000006/__1_0.distcp" in {entry["path"] for entry in manifest["files"]}
    assert ck.problems(folder, deep=True) == []


def test_a_checkpoint_without_one_ranks_shards_is_not_committed(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    folder = zero3_checkpoint(tmp_path, 5, 2)
    (folder / "global_step5" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()  # rank 1 wrote no optimizer
    _commit_with_stale_listing(folder, hidden="nothing hidden")
    assert not ck.is_committed(folder)  # resume falls back to an older checkpoint
    said = capfd.readouterr().out
    assert said.count("could not commit checkpoint-5") == 1  # rank 0 says it, once
    assert "rank 0: the final commit failed" in said
    assert "no rank lists global_step5/zero_pp_rank_1_mp_rank_00_optim_states.pt (rank 1's" in said


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process, on purpose
def test_a_dcp_shard_its_index_names_is_expected(tmp_path: Path) -> None:
    """torch.distributed.checkpoint's `.metadata` (written by rank 0) names every `.distcp` file: a rank with
    nothing to store writes none, so the index, not the world size, says what must be there."""
    import torch.distributed.checkpoint as dcp_api

    from swiftslurm.ckpt import shards

    dcp_api.save({"layer": torch.zeros(8)}, checkpoint_id=str(tmp_path / "iter_0000006"), no_dist=True)
    listed = set(ck.file_sizes(tmp_path))
    assert listed == {"iter_0000006/.metadata", "iter_0000006/__0_0.distcp"}
    assert shards.missing(listed, 4, tmp_path) == []  # ranks 1 to 3 had nothing to write
    assert shards.missing(listed - {"iter_0000006/__0_0.distcp"}, 1, tmp_path) == [
        "iter_0000006/__0_0.distcp (named in iter_0000006/.metadata)"
    ]
