"""Which rank wrote which file of a checkpoint, and which files must be there before it is committed.

On a shared file system every node's client caches directory listings (NFS for up to `acdirmax`, 60 s by
default; Lustre clients too), so one rank's listing can lack what ranks on other nodes have just written,
while a rank always sees the files it wrote itself. The commit therefore takes the union of every rank's
listing (shared_commit.py) and refuses a checkpoint that lacks a rank's part. What a rank's part is depends
on the format, which the files' names tell:

- DeepSpeed ZeRO: `global_stepN/[bf16_]zero_pp_rank_R_mp_rank_MM_*_states.pt`, R the data-parallel rank (the
  global rank: the Hugging Face family runs DeepSpeed without model parallelism). Every rank writes each kind.
- The Hugging Face Trainer: `rng_state_R.pth`, from every rank of a run of more than one process.
- torch.distributed.checkpoint (Megatron's `iter_N/`, FSDP's `pytorch_model_fsdp_0/`): `__R_I.distcp` from
  rank R. A rank with nothing to store may write none (Megatron's writer skips empty buckets), so what must be
  there is what the folder's `.metadata`, written last by rank 0, points at.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path, PurePosixPath

# Files every rank writes one of, by name; group 1 is the rank.
_EVERY_RANK = (
    re.compile(r"(?:^|/)(?:bf16_)?zero_pp_rank_(\d+)_[^/]*$"),  # DeepSpeed ZeRO shards
    re.compile(r"(?:^|/)rng_state_(\d+)\.pth$"),  # the Hugging Face Trainer's RNG states
)
_DCP_SHARD = re.compile(r"(?:^|/)__(\d+)_\d+\.distcp$")  # torch.distributed.checkpoint: rank R's data
DCP_INDEX = ".metadata"  # torch.distributed.checkpoint's index of a folder's `.distcp` files


def writer_rank(path: str, world_size: int) -> int | None:
    """The rank that wrote ``path``, where its name says so and the rank exists."""
    for pattern in (*_EVERY_RANK, _DCP_SHARD):
        if (match := pattern.search(path)) and int(match.group(1)) < world_size:
            return int(match.group(1))
    return None


def missing(paths: Collection[str], world_size: int, folder: Path) -> list[str]:
    """What a checkpoint in ``folder`` whose files are ``paths`` lacks: each file, and why it should be there."""
    present = set(paths)
    found = []
    for before, after in sorted(_every_rank_forms(present, world_size)):
        for rank in range(world_size):
            if (path := f"{before}{rank}{after}") not in present:
                found.append(f"{path} (rank {rank}'s: every rank writes one)")
    for index in sorted(p for p in present if PurePosixPath(p).name == DCP_INDEX):
        where = PurePosixPath(index).parent
        try:
            named = dcp_files(folder / index)
        except Exception as err:  # an index that cannot be read cannot vouch for the shards
            found.append(f"{index} unreadable ({type(err).__name__}: {err})")
            continue
        found += [f"{path} (named in {index})" for name in sorted(named) if (path := str(where / name)) not in present]
    return found


def _every_rank_forms(paths: set[str], world_size: int) -> set[tuple[str, str]]:
    """The names of files every rank writes one of, as (before, after) the rank number."""
    forms = set()
    for path in paths:
        for pattern in _EVERY_RANK:
            if (match := pattern.search(path)) and int(match.group(1)) < world_size:
                forms.add((path[: match.start(1)], path[match.end(1) :]))
    return forms


def dcp_files(index: Path) -> set[str]:
    """The files, relative to its folder, that a torch.distributed.checkpoint `.metadata` points at. torch is
    imported here: only training ranks, which have it, read one."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(index.parent)).read_metadata()
    return {info.relative_path for info in (metadata.storage_data or {}).values()}
