"""JSON in a run directory, written and read one way: whole or absent on disk, a dict or None when read."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def sync_filesystems(paths: list[Path]) -> None:
    """Flush the filesystems holding these paths: one syncfs(2) each for the many files a sweep writes without
    an fsync apiece. Not os.sync(): that would also wait for every other writer on the machine (checkpoints).
    os.sync() only where libc has no syncfs."""
    import ctypes

    syncfs = getattr(ctypes.CDLL(None, use_errno=True), "syncfs", None)
    for device_path in {os.stat(path).st_dev: path for path in paths}.values():
        fd = os.open(device_path, os.O_RDONLY)
        try:
            if syncfs is None or syncfs(fd) != 0:
                os.sync()
        finally:
            os.close(fd)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def fsync_dir(path: Path) -> None:
    """fsync a folder, so a rename or new file in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Temp file in the same folder, fsync, rename, fsync the folder: the file is whole or absent."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        json.dump(data, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
