"""The commit flow (hooks.Committer, shared_commit): the ranks that wrote a checkpoint hash it together over
a real two-process gloo group, rank 0 writes the manifest, and a save waits for the previous commit."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.ckpt import shared_commit
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
