"""Committed checkpoints: a `checkpoint-N` counts only once its manifest has been written, last.

Transformers writes `checkpoint-N` in place, so a kill mid-save leaves a folder that looks complete
but is not. The manifest (files, sizes, SHA-256, step, world size, ms-swift version) is written after
every rank has finished writing, with temp file + fsync + rename, so it exists whole or not at all.
Resume takes the newest committed checkpoint whose files still match; anything newer and uncommitted
is moved aside into `quarantine/`, never loaded, and deleted at the start of the attempt after (`reclaim`).
Retention deletes a checkpoint by renaming it into `.pruning/` first, so a kill midway leaves nothing
half-deleted beside the committed ones.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swiftslurm.errors import NodeError, SwiftSlurmError
from swiftslurm.rundir.jsonio import fsync_dir, read_json, write_json_atomic
from swiftslurm.rundir.layout import PRUNING, QUARANTINE

# In each checkpoint-N folder and under its object-store prefix: part of the commit format, so named here.
MANIFEST = "swiftslurm_manifest.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_CHUNK = 8 << 20


def checkpoint_step(path: Path) -> int | None:
    """The step N of a `checkpoint-N` folder, or None for anything else."""
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else None


def checkpoint_dir(output_dir: Path, step: int) -> Path:
    """The `checkpoint-N` folder of step ``step``, as the engines name it."""
    return output_dir / f"checkpoint-{step}"


def checkpoint_dirs(output_dir: Path) -> list[tuple[int, Path]]:
    """All `checkpoint-N` folders, oldest first (a symlink like `last-checkpoint` is not one)."""
    if not output_dir.is_dir():
        return []
    found = [(step, p) for p in output_dir.iterdir() if (step := checkpoint_step(p)) is not None and not p.is_symlink()]
    return sorted(found)


def companions(checkpoint: Path) -> list[Path]:
    """Folders an engine writes beside `checkpoint-N` that belong to it (Megatron LoRA's `checkpoint-N-merged`,
    the merged weights; a ZeRO checkpoint's universal form): quarantined and pruned together with it."""
    found = (checkpoint.with_name(f"{checkpoint.name}-merged"), universal_companion(checkpoint))
    return [folder for folder in found if folder.is_dir()]


def universal_companion(checkpoint: Path) -> Path:
    """Where a DeepSpeed ZeRO checkpoint's universal form goes (engines/zero_reshard.py), so that a run
    resumes at another world size without changing the committed `checkpoint-N`."""
    return checkpoint.with_name(f"{checkpoint.name}-universal")


def sha256_and_fsync(path: Path) -> str:
    """SHA-256 of a file, fsynced on the way so the bytes are on disk before the manifest is."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
        os.fsync(f.fileno())
    return digest.hexdigest()


def _files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.rglob("*") if p.is_file() and not p.is_symlink() and p.name != MANIFEST)


def file_sizes(checkpoint: Path) -> dict[str, int]:
    """Every file a manifest covers, by path relative to the checkpoint: its size in bytes."""
    return {str(p.relative_to(checkpoint)): p.stat().st_size for p in _files(checkpoint)}


def file_entries(checkpoint: Path, paths: list[str]) -> list[dict[str, Any]]:
    """Manifest entries (path, size, SHA-256) of some of a checkpoint's files, fsynced on the way: the share
    of one rank when the ranks hash a checkpoint together, or all of them."""
    entries = []
    for rel in paths:
        path = checkpoint / rel
        digest = sha256_and_fsync(path)  # first: opening it refreshes a shared file system's cached size
        entries.append({"path": rel, "size": path.stat().st_size, "sha256": digest})
    return entries


def commit(
    checkpoint: Path,
    world_size: int,
    swift_version: str,
    last_step: int | None = None,
    engine: str = "swift",
    identity: str | None = None,
    files: list[dict[str, Any]] | None = None,
    lease_token: int | None = None,
    fence: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Write the manifest of a fully written checkpoint. Call once every rank has finished saving.

    ``last_step`` is the run's planned last step (max_steps / train_iters as the trainer computed it, epochs
    included): a checkpoint of that step means training is complete, and no attempt trains past it.
    ``identity`` is the plan's (JobPlan.identity): a checkpoint resumes only the plan that wrote it.

    ``files``: the entries the ranks hashed together (`file_entries`); without it this process hashes all.

    ``lease_token``: the fencing token of the run dir's leader that started this trainer (rundir/lease.py),
    recorded; ``fence`` runs right before the manifest is renamed into place, and raising refuses the commit
    (that leader lost the lease: the folder stays uncommitted)."""
    step = checkpoint_step(checkpoint)
    if step is None:
        raise ValueError(f"{checkpoint} is not a checkpoint-N folder")
    if files is None:
        files = file_entries(checkpoint, list(file_sizes(checkpoint)))
    files = sorted(files, key=lambda entry: Path(entry["path"]))  # the order the folder walk gives
    # The folders of the files listed, not of this process's walk: on a shared file system it may lack some.
    for folder in {(checkpoint / entry["path"]).parent for entry in files} | {checkpoint}:
        fsync_dir(folder)
    manifest = {
        "format": 1,
        "step": step,
        "last_step": last_step,
        "world_size": world_size,
        "engine": engine,
        "plan_identity": identity,
        "ms_swift_version": swift_version,
        "committed_at": time.time(),
        "lease_token": lease_token,
        "files": files,
    }
    write_json_atomic(checkpoint / MANIFEST, manifest, before_replace=fence)
    return manifest


def read_manifest(checkpoint: Path) -> dict[str, Any] | None:
    data = read_json(checkpoint / MANIFEST)
    return data if data is not None and data.get("step") == checkpoint_step(checkpoint) else None


def problems(checkpoint: Path, deep: bool = False) -> list[str]:
    """What is wrong with a committed checkpoint: missing manifest, missing or resized files; with
    ``deep``, changed contents too. Empty when it can be resumed from."""
    manifest = read_manifest(checkpoint)
    if manifest is None:
        return [f"{checkpoint.name}: no manifest (never committed)"]
    found = []
    for entry in manifest["files"]:
        path = checkpoint / entry["path"]
        if not path.is_file():
            found.append(f"{checkpoint.name}/{entry['path']}: missing")
        elif path.stat().st_size != entry["size"]:
            found.append(
                f"{checkpoint.name}/{entry['path']}: {path.stat().st_size} bytes, manifest says {entry['size']}"
            )
        elif deep and sha256_and_fsync(path) != entry["sha256"]:
            found.append(f"{checkpoint.name}/{entry['path']}: checksum differs from the manifest")
    return found


def check_identity(
    manifest: dict[str, Any] | None, identity: str | None, where: str, error: type[SwiftSlurmError] = NodeError
) -> None:
    """Refuse a checkpoint another plan committed: resuming it would continue that run with this run's
    settings (two runs with the same storage prefix or output dir). A manifest without an identity was
    committed by a swiftslurm older than identities, for this run dir as far as anyone knows: accepted."""
    theirs = (manifest or {}).get("plan_identity")
    if theirs and identity and theirs != identity:
        raise error(
            f"{where} was committed by another plan (identity {theirs}; this run's plan is {identity}), "
            "so it is not resumed. HINT: give this run its own place: a new run_name=NAME or "
            "storage.prefix=PREFIX (or remove the other run's checkpoints if that run is abandoned)."
        )


def is_last_step(manifest: dict[str, Any] | None) -> bool:
    """Whether a committed checkpoint's manifest says it is the run's planned last step."""
    if not manifest or not manifest.get("last_step"):
        return False
    return int(manifest["step"]) >= int(manifest["last_step"])


def is_committed(checkpoint: Path) -> bool:
    return read_manifest(checkpoint) is not None


@dataclass(frozen=True)
class ResumePoint:
    """Where the next attempt starts, and what was set aside to get there."""

    checkpoint: Path | None
    step: int
    quarantined: tuple[Path, ...] = ()
    rejected: tuple[str, ...] = ()  # committed checkpoints whose files no longer match
    complete: bool = False  # the checkpoint is the run's planned last step: nothing is left to train
    restore_error: str | None = None  # the object store could not be read: this is the newest local checkpoint
    removed: tuple[Path, ...] = ()  # deleted before anything was set aside (`reclaim`)
    restored: str | None = None  # where ``checkpoint`` was downloaded from (object storage), this attempt


def newest_manifest(output_dir: Path) -> Path | None:
    """The newest checkpoint with its manifest: committed, as far as a look at the run can tell. Its files are
    not checked against the manifest (`newest_committed` does that, where an attempt resumes): a ZeRO-3 or
    Megatron checkpoint of a large job has hundreds of files, and `status` over many runs on NFS would stat
    each of them at every call."""
    return next((path for _, path in reversed(checkpoint_dirs(output_dir)) if is_committed(path)), None)


def newest_committed(output_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint whose manifest exists and whose files match it, and why newer ones did not."""
    rejected: list[str] = []
    for _, path in reversed(checkpoint_dirs(output_dir)):
        if not is_committed(path):
            continue
        issues = problems(path)
        if not issues:
            return path, rejected
        rejected.extend(issues)
    return None, rejected


def quarantine_newer_than(output_dir: Path, step: int, tag: str) -> list[Path]:
    """Move every checkpoint newer than ``step`` into quarantine/<name>.<tag>: it was not committed (or no
    longer verifies), and training will write that step again."""
    moved = []
    for found_step, path in checkpoint_dirs(output_dir):
        if found_step > step:
            for folder in (path, *companions(path)):
                target = _unused(output_dir / QUARANTINE / f"{folder.name}.{tag}")
                target.parent.mkdir(exist_ok=True)
                os.replace(folder, target)
                moved.append(target)
    return moved


def _unused(path: Path) -> Path:
    """``path``, or ``path-1``, ``path-2``, ... if taken: one attempt may set aside the same step twice (the
    unfinished save it found at its start, then its own that did not fit on the disk)."""
    candidates = (path.with_name(f"{path.name}-{n}") if n else path for n in itertools.count())
    return next(candidate for candidate in candidates if not candidate.exists())


def prepare_resume(
    output_dir: Path, tag: str, move: bool, identity: str | None = None, reclaimed: tuple[Path, ...] | None = None
) -> ResumePoint:
    """Pick the resume point; with ``move`` (node 0 only) delete what no attempt can use (`reclaim`), then set
    aside what is newer than it. ``reclaimed``: what earlier attempts set aside and this one already deleted
    (`reclaim_set_aside`, before a restore that may set aside a damaged checkpoint of its own, which must
    stay). A resume point committed by another plan than ``identity`` is refused (check_identity) before
    anything is moved or deleted."""
    checkpoint, rejected = newest_committed(output_dir)
    if checkpoint is not None:
        check_identity(read_manifest(checkpoint), identity, str(checkpoint))
    step = (checkpoint_step(checkpoint) or 0) if checkpoint else 0
    removed = [*(reclaimed or ()), *reclaim(output_dir, step, set_aside=reclaimed is None)] if move else []
    moved = quarantine_newer_than(output_dir, step, tag) if move else []
    complete = checkpoint is not None and is_last_step(read_manifest(checkpoint))
    return ResumePoint(checkpoint, step, tuple(moved), tuple(rejected), complete, removed=tuple(removed))


def reclaim(output_dir: Path, resume_step: int, set_aside: bool = True) -> list[Path]:
    """Delete what no attempt can use again, at an attempt's start while nothing writes ``output_dir``: (with
    ``set_aside``) all that earlier attempts set aside in quarantine/ (never loaded; the attempt records list
    it) and what prunes cut short left in .pruning/, and uncommitted checkpoints older than the resume point
    with their companions (a commit that failed while training went on, a prune cut short by a swiftslurm
    before .pruning/). Returns what was deleted."""
    stale = reclaim_set_aside(output_dir) if set_aside else []
    for step, path in checkpoint_dirs(output_dir):
        if step < resume_step and not is_committed(path):
            stale.extend((path, *companions(path)))
    _delete(stale)
    return stale


def reclaim_set_aside(output_dir: Path) -> list[Path]:
    """Delete all that earlier attempts set aside in quarantine/ and what prunes cut short left in .pruning/;
    returns what was deleted."""
    stale = [entry for folder in (output_dir / QUARANTINE, output_dir / PRUNING) for entry in _entries(folder)]
    _delete(stale)
    with contextlib.suppress(OSError):
        (output_dir / PRUNING).rmdir()  # kept while an entry could not be deleted
    return stale


def _delete(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)  # a kill midway: the rest goes at the next start
        else:
            path.unlink(missing_ok=True)


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.is_dir() else []


def prune_committed(output_dir: Path, keep: int, only: Collection[int] | None = None) -> list[Path]:
    """Delete committed checkpoints beyond the newest ``keep`` (at least 1: never the newest one); with ``only``,
    just those of these steps (the ones already in the object store)."""
    committed = [path for _, path in checkpoint_dirs(output_dir) if is_committed(path)]
    doomed = [path for path in committed[: -max(keep, 1)] if only is None or checkpoint_step(path) in only]
    for path in doomed:
        _delete_whole(output_dir, path)
    return doomed


def _delete_whole(output_dir: Path, checkpoint: Path) -> None:
    """Delete a checkpoint so that a kill at any moment (the wrapper kills the trainer once the stop checkpoint
    is committed, and the trainer prunes right after a commit) leaves it whole in place or gone from there:
    each folder is renamed into .pruning/ first, its companions before it, then deleted. What a kill leaves
    in .pruning/ is deleted at the next attempt's start (`reclaim`)."""
    trash = output_dir / PRUNING
    trash.mkdir(exist_ok=True)
    doomed = Path(tempfile.mkdtemp(dir=trash, prefix=f"{checkpoint.name}."))
    for folder in (*companions(checkpoint), checkpoint):
        os.replace(folder, doomed / folder.name)
    shutil.rmtree(doomed, ignore_errors=True)
    with contextlib.suppress(OSError):
        trash.rmdir()  # left when it is not empty: an earlier prune was cut short


def unfinished_save(output_dir: Path) -> Path | None:
    """The newest checkpoint folder when it has no manifest: a save that did not finish (or not yet)."""
    found = checkpoint_dirs(output_dir)
    return found[-1][1] if found and not is_committed(found[-1][1]) else None


def committed_bytes(checkpoint: Path) -> int:
    """The size of a committed checkpoint, as its manifest lists its files (0 without one)."""
    return sum(entry["size"] for entry in (read_manifest(checkpoint) or {}).get("files", []))


def disk_policy(keep: int, storage: bool) -> list[str]:
    """What swiftslurm deletes from the output dir, and when, a line a rule (the dry run shows them)."""
    kept = f"the newest {keep} committed checkpoints" if keep > 0 else "every committed checkpoint"
    uploaded = ", older ones once uploaded" if storage and keep > 0 else ""
    return [
        f"keeps {kept} (keep_checkpoints={keep}{uploaded})",
        f"at each attempt's start, deletes what earlier attempts set aside ({QUARANTINE}/),",
        f"uncommitted checkpoints older than the resume point, and prunes cut short ({PRUNING}/)",
    ]


def newest_checkpoint(output_dir: Path) -> Path | None:
    """The newest committed checkpoint (what a resume would load), or None."""
    return newest_committed(output_dir)[0]
