"""The ranks hash a checkpoint together; rank 0 writes the manifest, last.

A full fine-tune's checkpoint is ~14 bytes per parameter (a 7B model: ~100 GB). SHA-256 runs at about one
GB/s per core, so one process hashing it all cannot finish within the minutes between SLURM's signal and
the end of the job (bench/save_budget.py measures it). Every rank has a core and its node's disk, and has
just written part of the files (still in its node's page cache), so the file list is split: each file goes to
the rank that wrote it where the name says so (ZeRO's `zero_pp_rank_R_*`, torch.distributed.checkpoint's
`__R_*.distcp`), the rest (weights saved by rank 0, configs) to the least loaded ranks by size. Rank 0 lists
the files (one listing: a shared file system's listings may differ for a moment between nodes) and sends the
split; the digests come back to it. It all travels on a CPU gloo group of its own, off the training loop's
NCCL and the stop vote's group, since it runs in a background thread while training goes on.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from swiftslurm.ckpt import checkpoint

# A file written by global rank R, by its name: DeepSpeed ZeRO shards; torch.distributed.checkpoint (Megatron).
_WRITER = (re.compile(r"(?:^|/)zero_pp_rank_(\d+)_[^/]*$"), re.compile(r"(?:^|/)__(\d+)_\d+\.distcp$"))


def writer_rank(path: str, world_size: int) -> int | None:
    """The rank that wrote ``path``, where its name says so and the rank exists."""
    for pattern in _WRITER:
        if (match := pattern.search(path)) and int(match.group(1)) < world_size:
            return int(match.group(1))
    return None


def split(sizes: dict[str, int], world_size: int) -> list[list[str]]:
    """Which files each rank hashes: its own shards, then the others largest first to the least loaded rank
    (lowest rank on ties). Pure and deterministic."""
    shares: list[list[str]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    unowned = []
    for path, size in sorted(sizes.items()):
        rank = writer_rank(path, world_size)
        if rank is None:
            unowned.append((path, size))
            continue
        shares[rank].append(path)
        loads[rank] += size
    for path, size in sorted(unowned, key=lambda item: (-item[1], item[0])):
        rank = min(range(world_size), key=lambda r: (loads[r], r))
        shares[rank].append(path)
        loads[rank] += size
    return shares


def hash_together(folder: Path, group: Any) -> list[dict[str, Any]] | None:
    """Every rank of ``group`` calls this for the same checkpoint; rank 0 gets every file's manifest entry,
    the others None. A rank that fails still answers (with its error), so none is left waiting; rank 0 raises
    it."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    listing: list[Any] = [_listing(folder) if rank == 0 else None]
    dist.broadcast_object_list(listing, src=dist.get_global_rank(group, 0), group=group)
    if isinstance(listing[0], str):
        raise OSError(listing[0])
    mine: list[dict[str, Any]] | str
    try:
        mine = checkpoint.file_entries(folder, split(listing[0], world_size)[rank])
    except Exception as err:  # any failure is answered, never raised here: rank 0 would wait in the gather
        mine = f"rank {rank}: {type(err).__name__}: {err}"
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, gathered, dst=dist.get_global_rank(group, 0), group=group)
    if gathered is None:
        return None
    if errors := [answer for answer in gathered if isinstance(answer, str)]:
        raise OSError(f"could not hash {folder.name}: {'; '.join(errors)}")
    return [entry for answer in gathered for entry in answer]


def _listing(folder: Path) -> dict[str, int] | str:
    """The files to hash, or why they could not be listed (sent to every rank instead, so none waits)."""
    try:
        return checkpoint.file_sizes(folder)
    except Exception as err:  # sent instead of the listing: the other ranks would wait for it
        return f"could not list {folder}: {type(err).__name__}: {err}"
