"""A shared filesystem whose clients cache, as NFS and Lustre clients do: a FUSE passthrough of a backing
directory that serves each directory listing and each file's attributes (a missing file included) from its
own cache for ``ttl_s`` after it first read them. What this mount itself changes it sees at once (as an NFS
client sees its own writes); what another mount of the same backing directory changes it sees only once its
cache entry expires. File contents are never cached (close-to-open: an open reads what is there).

One mount per node of the local cluster, each in that node's mount namespace (scripts/slurm-local.sh exec),
is a run dir whose per-node views disagree for up to ``ttl_s`` seconds:

    python -m swiftslurm.testing.cachefs BACKING MOUNTPOINT [--ttl 20]

Runs in the foreground until unmounted (fusermount3 -u MOUNTPOINT) or signalled. Needs libfuse3 (Debian's
fuse3) and mfusepy.
"""

from __future__ import annotations

import argparse
import errno
import os
import threading
import time
from pathlib import Path
from typing import Any

from mfusepy import FUSE, FuseOSError, Operations

STAT_FIELDS = ("st_gid", "st_mode", "st_nlink", "st_size", "st_uid")
TIME_FIELDS = ("st_atime", "st_ctime", "st_mtime")  # in nanoseconds (use_ns)


class CachingPassthrough(Operations):
    use_ns = True

    def __init__(self, backing: Path, ttl_s: float) -> None:
        self.backing = backing
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._attrs: dict[str, tuple[float, dict[str, Any] | None]] = {}  # path -> (read at, attrs or missing)
        self._listings: dict[str, tuple[float, list[str]]] = {}

    def _real(self, path: str) -> str:
        return str(self.backing / path.lstrip("/"))

    def _fresh(self, entry: tuple[float, Any] | None) -> bool:
        return entry is not None and time.monotonic() - entry[0] < self.ttl_s

    def _changed(self, *paths: str) -> None:
        """This mount changed ``paths``: forget them and their directories' listings."""
        with self._lock:
            for path in paths:
                self._attrs.pop(path, None)
                self._listings.pop(os.path.dirname(path) or "/", None)
                self._listings.pop(path, None)

    # ------------------------------------------------------------ cached

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        with self._lock:
            entry = self._attrs.get(path)
        if not self._fresh(entry):
            try:
                st = os.lstat(self._real(path))
                times = {name: getattr(st, f"{name}_ns") for name in TIME_FIELDS}
                attrs: dict[str, Any] | None = {name: getattr(st, name) for name in STAT_FIELDS} | times
            except FileNotFoundError:
                attrs = None
            entry = (time.monotonic(), attrs)
            with self._lock:
                self._attrs[path] = entry
        assert entry is not None
        if entry[1] is None:
            raise FuseOSError(errno.ENOENT)
        return dict(entry[1])

    def readdir(self, path: str, fh: int) -> list[str]:
        with self._lock:
            entry = self._listings.get(path)
        if not self._fresh(entry):
            entry = (time.monotonic(), os.listdir(self._real(path)))
            with self._lock:
                self._listings[path] = entry
        assert entry is not None
        return [".", "..", *entry[1]]

    # ------------------------------------------------------------ passed through

    def access(self, path: str, amode: int) -> int:
        self.getattr(path)
        return 0

    def open(self, path: str, flags: int) -> int:
        self.getattr(path)  # a file this mount believes missing stays missing until its cache entry expires
        return os.open(self._real(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        fd = os.open(self._real(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        self._changed(path)
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        written = os.pwrite(fh, data, offset)
        self._changed(path)
        return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        os.truncate(self._real(path), length)
        self._changed(path)
        return 0

    def flush(self, path: str, fh: int) -> int:
        return 0

    def fsync(self, path: str, datasync: int, fh: int) -> int:
        os.fsync(fh)
        return 0

    def release(self, path: str, fh: int) -> int:
        os.close(fh)
        self._changed(path)
        return 0

    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self._real(path), mode)
        self._changed(path)
        return 0

    def rmdir(self, path: str) -> int:
        os.rmdir(self._real(path))
        self._changed(path)
        return 0

    def unlink(self, path: str) -> int:
        os.unlink(self._real(path))
        self._changed(path)
        return 0

    def rename(self, old: str, new: str) -> int:
        os.rename(self._real(old), self._real(new))
        self._changed(old, new)
        with self._lock:  # a renamed directory's subtree is stale under its old and new names
            for key in [k for k in self._attrs if k.startswith((old + "/", new + "/"))]:
                del self._attrs[key]
        return 0

    def link(self, target: str, source: str) -> int:
        os.link(self._real(source), self._real(target))  # the lease's generations are taken by link(2)
        self._changed(target, source)
        return 0

    def symlink(self, target: str, source: str) -> int:
        os.symlink(source, self._real(target))
        self._changed(target)
        return 0

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self._real(path), mode)
        self._changed(path)
        return 0

    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self._real(path), uid, gid)
        self._changed(path)
        return 0

    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        os.utime(self._real(path), ns=times) if times else os.utime(self._real(path))
        self._changed(path)
        return 0

    def statfs(self, path: str) -> dict[str, int]:
        st = os.statvfs(self._real(path))
        names = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_frsize")
        return {name: getattr(st, name) for name in (*names, "f_flag", "f_namemax")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("backing", type=Path)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("--ttl", type=float, default=20.0, help="seconds a listing or attributes are cached")
    args = parser.parse_args()
    # The kernel's own caches stay short (1 s): the staleness is this process's, so it is exactly ttl_s.
    FUSE(
        CachingPassthrough(args.backing.resolve(), args.ttl),
        str(args.mountpoint),
        foreground=True,
        allow_other=True,
        attr_timeout=1.0,
        entry_timeout=1.0,
        negative_timeout=1.0,
        use_ino=False,
    )


if __name__ == "__main__":
    main()
