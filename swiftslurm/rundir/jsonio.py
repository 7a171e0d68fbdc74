"""JSON in a run directory, written and read one way.

- ``write_json_atomic`` / ``write_text_atomic``: the file is whole or absent (temp file, rename).
- ``create_json_exclusive``: the file is written whole only if no file has its name yet (temp file, link).
- ``read_json``: a dict or None (missing, torn or not an object); ``peek_json`` also None while another node's
  replace makes it unreadable for a moment (a poll tries again); ``read_json_required``: a dict, or an
  ``UnreadableJson`` naming the file.
- ``append_jsonl`` / ``read_jsonl``: one line per record, appended in one write; a reader skips a torn last line.
  ``read_jsonl_backwards``: newest first, reading only as much of the file's end as the caller consumes.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from swiftslurm.errors import UnreadableJson


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


def fsync_dir(path: Path) -> None:
    """fsync a folder, so a rename or new file in it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- whole files


def write_text_atomic(
    path: Path, text: str, durable: bool = True, before_replace: Callable[[], None] | None = None
) -> None:
    """Temp file in the same folder, rename: readers see the old file or the new one, never a part. ``durable``:
    fsync the file and the folder; without, the caller syncs once for many files (sync_filesystems).
    ``before_replace`` runs once the temp file is written, just before the rename: raising refuses the write
    (nothing is replaced), as late as a check can come."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        if before_replace is not None:
            before_replace()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if durable:
        fsync_dir(path.parent)


def write_json_atomic(
    path: Path, data: Mapping[str, Any], durable: bool = True, before_replace: Callable[[], None] | None = None
) -> None:
    """``data`` as JSON, whole or absent on disk (write_text_atomic)."""
    write_text_atomic(path, json.dumps(data, indent=1), durable, before_replace)


def create_json_exclusive(path: Path, data: Mapping[str, Any]) -> bool:
    """Write ``data`` to ``path`` unless a file of that name exists; True if this call created it. The file
    appears whole: a durable temp file is hard-linked to the name, and link(2) fails when the name exists,
    decided by the filesystem itself (the server on NFS, the metadata server on Lustre), no lock involved. A
    link whose reply NFS lost reports EEXIST though it was made: the temp file's link count says (open(2))."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(data, indent=1))
            out.flush()
            os.fsync(out.fileno())
        try:
            os.link(tmp, path)
        except OSError:
            if os.stat(tmp).st_nlink != 2:
                raise
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def _parse_object(text: str) -> dict[str, Any] | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when there is no file, it is cut short, or it holds no object."""
    try:
        text = path.read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return None
    return _parse_object(text)


def peek_json(path: Path) -> dict[str, Any] | None:
    """read_json for a file a poll reads while another node may replace it: None also while it cannot be read
    just now (a network filesystem answers ESTALE mid-replace); the poll asks again."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    return _parse_object(text)


def read_json_required(path: Path, hint: str) -> dict[str, Any]:
    """The JSON object in ``path``, or UnreadableJson saying what is wrong with which file, and ``hint``."""
    try:
        text = path.read_text(errors="replace")
    except OSError as err:
        raise UnreadableJson(f"{path} cannot be read ({err.strerror or err}). HINT: {hint}") from err
    data = _parse_object(text)
    if data is None:
        raise UnreadableJson(f"{path} is not a whole JSON object (cut short or edited?). HINT: {hint}")
    return data


# ---------------------------------------------------------------- one record per line


def append_jsonl(path: Path, records: Iterable[Mapping[str, Any]], durable: bool = True) -> None:
    """Append one line per record in a single write (O_APPEND: appends of other writers never interleave with
    it); ``durable``: fsync before returning. Nothing is written for no records."""
    text = "".join(json.dumps(record) + "\n" for record in records)
    if not text:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
        if durable:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one a line, oldest first ([] without a file). A line that is not a whole
    object (the torn last line of a crash mid-append, or one being written now) is skipped."""
    try:
        text = path.read_text(errors="replace")
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [record for line in text.splitlines() if (record := _parse_object(line)) is not None]


TAIL_BLOCK = 16 * 1024  # read_jsonl_backwards reads this much of a file's end at a time: ~50 of ms-swift's lines


def read_jsonl_backwards(path: Path, block: int = TAIL_BLOCK) -> Iterator[dict[str, Any]]:
    """The JSON objects of ``path``, one a line, newest first ([] without a file), read block by block from its
    end: a caller that wants the newest records of a long log stops early and reads only its tail. A line that is
    not a whole object (one being written now) is skipped."""
    try:
        with open(path, "rb") as stream:
            yield from _lines_backwards(stream, block)
    except (FileNotFoundError, NotADirectoryError):
        return


def _lines_backwards(stream: BinaryIO, block: int) -> Iterator[dict[str, Any]]:
    end, cut = stream.seek(0, os.SEEK_END), b""
    while end > 0:
        start = max(0, end - block)
        stream.seek(start)
        lines = (stream.read(end - start) + cut).split(b"\n")
        cut, end = (lines.pop(0) if start > 0 else b""), start  # the block's first line may begin earlier
        for line in reversed(lines):
            if (record := _parse_object(line.decode(errors="replace"))) is not None:
                yield record
