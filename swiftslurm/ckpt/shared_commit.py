"""The ranks hash a checkpoint together; rank 0 writes the manifest, last.

A full fine-tune's checkpoint is ~14 bytes per parameter (a 7B model: ~100 GB). SHA-256 runs at about one
GB/s per core, so one process hashing it all cannot finish within the minutes between SLURM's signal and
the end of the job (bench/save_budget.py measures it). Every rank has a core and its node's disk, and has
just written part of the files (still in its node's page cache), so the file list is split: each file goes to
the rank that wrote it where the name says so (shards.py: ZeRO's `zero_pp_rank_R_*`, torch.distributed.
checkpoint's `__R_*.distcp`, the Trainer's `rng_state_R.pth`), the rest (weights saved by rank 0, configs) to
the least loaded ranks that see them, by size.

Every rank lists the folder and sends its listing to rank 0, which splits their union: a shared file system's
client may list another node's new files only tens of seconds later (shards.py), but every rank sees its
own. Rank 0 refuses a checkpoint that lacks a rank's part (shards.missing) before anyone hashes; the digests
come back to it. It all travels on a CPU gloo group of its own, off the training loop's NCCL and the stop
vote's group, since it runs in a background thread while training goes on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swiftslurm.ckpt import checkpoint, shards

_SHOWN = 5  # missing files named in the refusal; the rest are counted


def union(listings: list[dict[str, int]]) -> tuple[dict[str, int], dict[str, set[int]]]:
    """The files any rank lists, with their size (the largest listed: a cached size may be stale), and the
    ranks that list each."""
    sizes: dict[str, int] = {}
    seen_by: dict[str, set[int]] = {}
    for rank, listing in enumerate(listings):
        for path, size in listing.items():
            sizes[path] = max(size, sizes.get(path, 0))
            seen_by.setdefault(path, set()).add(rank)
    return sizes, seen_by


def split(sizes: dict[str, int], world_size: int, seen_by: dict[str, set[int]] | None = None) -> list[list[str]]:
    """Which files each rank hashes: its own shards, then the others largest first to the least loaded rank
    (lowest rank on ties) of those that list them (``seen_by``; all when None). Pure and deterministic."""
    shares: list[list[str]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    unowned = []
    for path, size in sorted(sizes.items()):
        rank = shards.writer_rank(path, world_size)
        if rank is None or (seen_by is not None and rank not in seen_by[path]):
            unowned.append((path, size))
            continue
        shares[rank].append(path)
        loads[rank] += size
    for path, size in sorted(unowned, key=lambda item: (-item[1], item[0])):
        ranks = sorted(seen_by[path]) if seen_by is not None else range(world_size)
        rank = min(ranks, key=lambda r: (loads[r], r))
        shares[rank].append(path)
        loads[rank] += size
    return shares


def hash_together(folder: Path, group: Any) -> list[dict[str, Any]] | None:
    """Every rank of ``group`` calls this for the same checkpoint; rank 0 gets every file's manifest entry,
    the others None. Rank 0 raises when the checkpoint cannot be committed: a rank could not list or hash
    its share, or a rank's part is missing. A rank that fails still answers (with its error), so none is left
    waiting."""
    import torch.distributed as dist

    rank, world_size = dist.get_rank(group), dist.get_world_size(group)
    root = dist.get_global_rank(group, 0)
    listings: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(_listing(folder), listings, dst=root, group=group)
    share: list[Any] = [None]
    dist.scatter_object_list(share, _shares(folder, listings) if listings is not None else None, src=root, group=group)
    if isinstance(share[0], str):  # refused: rank 0 says why, once
        if rank == 0:
            raise OSError(share[0])
        return None
    mine: list[dict[str, Any]] | str
    try:
        mine = checkpoint.file_entries(folder, share[0])
    except Exception as err:  # any failure is answered, never raised here: rank 0 would wait in the gather
        mine = f"rank {rank}: {type(err).__name__}: {err}"
    gathered: list[Any] | None = [None] * world_size if rank == 0 else None
    dist.gather_object(mine, gathered, dst=root, group=group)
    if gathered is None:
        return None
    if errors := [answer for answer in gathered if isinstance(answer, str)]:
        raise OSError(f"could not hash {folder.name}: {'; '.join(errors)}")
    return [entry for answer in gathered for entry in answer]


def _shares(folder: Path, listings: list[Any]) -> list[list[str]] | list[str]:
    """Rank 0: each rank's share of the union of the listings, or for every rank why nobody hashes."""
    world_size = len(listings)
    try:
        if errors := [f"rank {rank}: {answer}" for rank, answer in enumerate(listings) if isinstance(answer, str)]:
            return [f"could not list {folder.name}: {'; '.join(errors)}"] * world_size
        sizes, seen_by = union(listings)
        if gaps := shards.missing(sizes, world_size, folder):
            more = f" and {len(gaps) - _SHOWN} more" if len(gaps) > _SHOWN else ""
            why = (
                f"not committing {folder.name}: no rank lists {'; '.join(gaps[:_SHOWN])}{more}. HINT: a rank did "
                "not write its part (its log says why); resume takes the newest committed checkpoint instead."
            )
            return [why] * world_size
        return split(sizes, world_size, seen_by)
    except Exception as err:  # sent instead of the shares: the other ranks wait for them
        return [f"could not split {folder.name}: {type(err).__name__}: {err}"] * world_size


def _listing(folder: Path) -> dict[str, int] | str:
    """The files this rank sees in ``folder``, or why it could not list them (sent instead, so none waits)."""
    try:
        return checkpoint.file_sizes(folder)
    except Exception as err:  # sent instead of the listing: rank 0 waits for it
        return f"{type(err).__name__}: {err}"
