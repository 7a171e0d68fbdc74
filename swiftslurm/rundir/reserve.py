"""Room for an attempt's records when a save has filled the disk.

While its trainer runs, every node's wrapper holds RESERVE_BYTES in a file of the run dir (reserve/node<N>),
and deletes it as soon as the trainer has ended, before it writes anything: what follows (the node's result,
node 0's line in attempts.jsonl and status.json, the wrapper's log lines, submitit's result) then fits even
when a save took every free block. The next attempt's trainer starts with the reserve taken again.

A file in the run dir rather than a record written somewhere else: the run dir is where every reader looks,
and no other place can be promised to have space (or to be visible from the login node).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from swiftslurm.rundir.layout import reserve_file

# What the wrapper writes after a full disk is a handful of files of a few KB each: 1 MiB holds them at a
# block size of up to 64 KiB (large-block filesystems keep files this small in the inode or the metadata
# target), and costs nothing beside checkpoints, yet fits a test filesystem of a few MiB.
RESERVE_BYTES = 1 << 20


def hold(run_dir: Path, node: int, size: int = RESERVE_BYTES) -> str | None:
    """Take the reserve: ``size`` bytes on disk, random (a compressing filesystem cannot shrink them) and
    fsynced, so the blocks are allocated. None once held; else why not, and nothing is left behind."""
    path = reserve_file(run_dir, node)
    try:
        path.parent.mkdir(exist_ok=True)
        with open(path, "wb") as out:  # a reserve a killed wrapper left is replaced
            out.write(os.urandom(size))
            out.flush()
            os.fsync(out.fileno())
    except OSError as err:
        path.unlink(missing_ok=True)
        return (
            f"could not reserve {size >> 20} MiB in {path.parent} for the attempt's records "
            f"({err.strerror or err}): if a save fills the disk, this attempt may end without its record"
        )
    return None


def release(run_dir: Path, node: int) -> None:
    """Free the reserve (nothing when there is none)."""
    reserve_file(run_dir, node).unlink(missing_ok=True)


def free_bytes(path: Path) -> int | None:
    """Bytes free to this process on the filesystem of ``path`` (None when it cannot be asked)."""
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None
