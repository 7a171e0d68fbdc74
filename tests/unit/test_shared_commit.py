"""The commit flow (hooks.Committer, shared_commit): the ranks that wrote a checkpoint hash it together over
a real two-process gloo group, rank 0 writes the manifest, and a save waits for the previous commit."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.ckpt import shards, shared_commit
from swiftslurm.engines.hooks import Committer


def zero3_checkpoint(output: Path, step: int, world_size: int) -> Path:
    """A checkpoint laid out as DeepSpeed ZeRO-3 writes it: per-rank shards, weights and configs by rank 0."""
    folder = output / f"checkpoint-{step}"
    (folder / f"global_step{step}").mkdir(parents=True)
    for rank in range(world_size):
        for kind, size in (("optim_states", 3000), ("model_states", 200)):
            path = folder / f"global_step{step}" / f"zero_pp_rank_{rank}_mp_rank_00_{kind}.pt"
            path.write_bytes(os.urandom(size))
    (folder / "model.safetensors").write_bytes(os.urandom(2500))
    (folder / "config.json").write_text("{}")
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return folder


def test_each_rank_hashes_the_shards_it_wrote_and_a_share_of_the_rest(tmp_path: Path) -> None:
    sizes = ck.file_sizes(zero3_checkpoint(tmp_path, 7, 4))
    shares = shared_commit.split(sizes, 4)
    assert sorted(p for share in shares for p in share) == sorted(sizes)  # every file exactly once
    for rank, share in enumerate(shares):
        assert {p for p in share if "zero_pp_rank" in p} == {
            f"global_step7/zero_pp_rank_{rank}_mp_rank_00_{kind}.pt" for kind in ("optim_states", "model_states")
        }
    assert "model.safetensors" in shares[0] + shares[1] + shares[2] + shares[3]
    loads = [sum(sizes[p] for p in share) for share in shares]
    assert max(loads) - min(loads) <= 2500  # the weights went to a rank that had least, not all to rank 0


def test_megatron_distcp_shards_go_to_their_writer_and_unknown_ranks_are_shared() -> None:
    sizes = {"iter_0000006/__0_0.distcp": 10, "iter_0000006/__1_0.distcp": 10, "iter_0000006/__5_0.distcp": 10}
    assert shared_commit.split(sizes, 2) == [
        ["iter_0000006/__0_0.distcp", "iter_0000006/__5_0.distcp"],
        ["iter_0000006/__1_0.distcp"],
    ]


def test_bf16_zero_shards_and_rng_states_are_their_writers() -> None:
    found = {
        path: shards.writer_rank(path, 4)
        for path in (
            "global_step3/bf16_zero_pp_rank_2_mp_rank_00_optim_states.pt",
            "global_step3/zero_pp_rank_3_mp_rank_00_model_states.pt",
            "rng_state_1.pth",
            "rng_state.pth",  # one process: no rank in the name
            "global_step3/zero_pp_rank_4_mp_rank_00_optim_states.pt",  # no rank 4 in a world of 4
            "iter_0000003/__2_0.distcp",
        )
    }
    assert list(found.values()) == [2, 3, 1, None, None, 2]


def test_a_file_no_shard_name_claims_goes_to_a_rank_that_lists_it() -> None:
    """A shared file system's listing on one node may lack another node's new files (NFS, Lustre): a file
    goes only to a rank that saw it, so no rank is asked to hash a file its node does not list yet."""
    listings = [
        {"model.safetensors": 900, "config.json": 10, "rng_state_0.pth": 5},
        {"rng_state_1.pth": 5, "config.json": 10, "extra.bin": 800},  # rank 1's node lists model.safetensors late
        {"rng_state_2.pth": 5, "config.json": 0, "model.safetensors": 900},  # a stale cached size of config.json
    ]
    sizes, seen_by = shared_commit.union(listings)
    assert sizes == {
        "model.safetensors": 900,
        "config.json": 10,
        "extra.bin": 800,
        **{f"rng_state_{rank}.pth": 5 for rank in range(3)},
    }
    assert seen_by["model.safetensors"] == {0, 2} and seen_by["extra.bin"] == {1}
    assert shared_commit.split(sizes, 3, seen_by) == [
        ["rng_state_0.pth", "model.safetensors"],
        ["rng_state_1.pth", "extra.bin"],
        ["rng_state_2.pth", "config.json"],
    ]


ZERO3 = [f"global_step7/zero_pp_rank_{r}_mp_rank_00_{k}_states.pt" for r in range(3) for k in ("optim", "model")]


@pytest.mark.parametrize(
    ("paths", "world_size", "lacking"),
    [
        (ZERO3, 3, []),
        (
            [p for p in ZERO3 if p != "global_step7/zero_pp_rank_1_mp_rank_00_optim_states.pt"],
            3,
            ["global_step7/zero_pp_rank_1_mp_rank_00_optim_states.pt (rank 1's: every rank writes one)"],
        ),
        (
            ["global_step7/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt"],
            2,
            ["global_step7/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt (rank 0's: every rank writes one)"],
        ),
        (["rng_state_0.pth", "rng_state_2.pth"], 3, ["rng_state_1.pth (rank 1's: every rank writes one)"]),
        (["rng_state.pth", "model.safetensors"], 1, []),
        (["global_step7/zero_pp_rank_0_mp_rank_00_optim_states.pt", "iter_7/__1_0.distcp"], 1, []),
    ],
    ids=["zero3-whole", "zero3-rank-1-optimizer", "bf16-zero", "rng-states", "one-process", "ranks-beyond-world"],
)
def test_a_checkpoint_lacks_what_every_rank_writes_and_one_rank_did_not(
    paths: list[str], world_size: int, lacking: list[str], tmp_path: Path
) -> None:
    assert shards.missing(paths, world_size, tmp_path) == lacking


def test_an_unreadable_dcp_index_vouches_for_nothing(tmp_path: Path) -> None:
    (tmp_path / "iter_0000003").mkdir()
    (tmp_path / "iter_0000003" / ".metadata").write_bytes(b"not a pickle")
    [why] = shards.missing(["iter_0000003/.metadata", "iter_0000003/__0_0.distcp"], 1, tmp_path)
    assert why.startswith("iter_0000003/.metadata unreadable")


def test_a_save_waits_for_the_previous_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = zero3_checkpoint(tmp_path, 1, 1), zero3_checkpoint(tmp_path, 2, 1)
    events: list[tuple[str, str]] = []
    second_started = threading.Event()
    real = ck.sha256_and_fsync

    def observed(path: Path) -> str:
        name = next(p.name for p in path.parents if p.name.startswith("checkpoint-"))
        events.append(("start", name))
        if name == second.name:
            second_started.set()
        elif len(events) == 1:  # the first commit stays in flight until the second begins (or 2 s: it never may)
            second_started.wait(timeout=2)
        digest = real(path)
        events.append(("end", name))
        return digest

    monkeypatch.setattr(ck, "sha256_and_fsync", observed)
    committer = Committer(engine="swift")
    committer.after_save(first, last_step=10)
    committer.after_save(second, last_step=10)
    assert ck.is_committed(first)  # committed before the second commit began
    committer.finish()
    assert ck.is_committed(second)
    last_of_first = max(i for i, (_, name) in enumerate(events) if name == first.name)
    first_of_second = min(i for i, (_, name) in enumerate(events) if name == second.name)
    assert last_of_first < first_of_second, events
