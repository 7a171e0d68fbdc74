"""Checkpoints as the fault tests inspect them: a save in progress, the resume point an attempt chose (verified
the moment it starts), the quarantine."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from swiftslurm.ckpt.checkpoint import MANIFEST, checkpoint_dirs, problems, read_manifest
from swiftslurm.rundir.layout import QUARANTINE
from swiftslurm.testing.cluster import exec_line

RESUME_ARG = re.compile(r"--resume_from_checkpoint (\S+)")


def saving_checkpoint(output: Path, above: int) -> Path | None:
    """A checkpoint newer than step ``above`` and every committed one that has no manifest yet: a save in
    progress (an older folder without manifest is one being pruned, not saved)."""
    dirs = checkpoint_dirs(output)
    committed = max((step for step, path in dirs if (path / MANIFEST).is_file()), default=0)
    return next((path for step, path in dirs if step > max(above, committed) and not (path / MANIFEST).is_file()), None)


@dataclass(frozen=True)
class ResumeSeen:
    """The checkpoint an attempt resumed from, as found on disk when the attempt started."""

    attempt: str
    checkpoint: Path | None
    committed_at: float | None  # its manifest's, None if it had none
    problems: tuple[str, ...]  # problems(deep=True) at that moment
    inode: int | None


def inspect_resume_point(run_dir: Path, attempt: str) -> ResumeSeen:
    """Read the checkpoint both nodes pass to ms-swift, and verify it at once (before training can touch or
    prune anything)."""
    lines = [exec_line(run_dir, attempt, node) or "" for node in (0, 1)]
    chosen = [m.group(1) if (m := RESUME_ARG.search(line)) else None for line in lines]
    assert chosen[0] == chosen[1], f"attempt {attempt}: node 0 resumes from {chosen[0]}, node 1 from {chosen[1]}"
    if chosen[0] is None:
        return ResumeSeen(attempt, None, None, (), None)
    path = Path(chosen[0])
    manifest = read_manifest(path)
    inode = path.stat().st_ino if path.is_dir() else None
    committed_at = manifest["committed_at"] if manifest else None
    return ResumeSeen(attempt, path, committed_at, tuple(problems(path, deep=True)), inode)


def quarantined_folders(output: Path) -> list[Path]:
    folder = output / QUARANTINE
    return sorted(folder.iterdir()) if folder.is_dir() else []
