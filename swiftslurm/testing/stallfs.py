"""A file system whose server holds a read until told to answer, as a Lustre or NFS server (or a FUSE daemon) does
when it is slow or gone: a FUSE mount with one file, `stalled`, whose read() does not return until CONTROL/release
exists. The process that reads it waits in the kernel, and once the request is in the server's hands, a SIGKILL does
not end that wait: the process exits only after the answer (the kernel's fuse request_wait_answer).

    python -m swiftslurm.testing.stallfs MOUNTPOINT CONTROL

CONTROL/reading appears once a read has reached the server. Runs in the foreground until unmounted. Needs /dev/fuse,
fusermount3 and libfuse (Debian's fuse3), and mfusepy; `stalled_mount` says why it cannot run (`unavailable`).
"""

from __future__ import annotations

import argparse
import ctypes.util
import errno
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

STALLED = "stalled"  # the file whose read waits
CONTENT = b"answered\n"
POLL_S = 0.02


def unavailable() -> str | None:
    """Why a FUSE mount cannot be made here, or None."""
    if not Path("/dev/fuse").exists():
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (Debian's fuse3)"
    if ctypes.util.find_library("fuse3") is None and ctypes.util.find_library("fuse") is None:
        return "no libfuse (Debian's fuse3)"
    return None


@contextmanager
def stalled_mount(mountpoint: Path, control: Path, timeout_s: float = 30.0) -> Iterator[Path]:
    """Mount the file system at ``mountpoint`` for the block; yields the stalled file. At the end the read is
    answered, whoever still waits for it, and the mount goes."""
    mountpoint.mkdir(parents=True, exist_ok=True)
    control.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-m", "swiftslurm.testing.stallfs", str(mountpoint), str(control)]
    # From the root of this copy of swiftslurm, whichever one another directory would import.
    root = Path(__file__).resolve().parents[2]
    server = subprocess.Popen(argv, cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        while not os.path.ismount(mountpoint):
            if server.poll() is not None or time.monotonic() > deadline:
                _, err = server.communicate(timeout=5) if server.poll() is not None else (b"", b"")
                raise RuntimeError(f"the FUSE mount at {mountpoint} did not come up: {err.decode(errors='replace')}")
            time.sleep(POLL_S)
        yield mountpoint / STALLED
    finally:
        release(control)
        subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False, capture_output=True)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def reading(control: Path) -> bool:
    """Whether a read of the stalled file has reached the server."""
    return (control / "reading").exists()


def release(control: Path) -> None:
    """Answer the read (and every later one)."""
    (control / "release").touch()


class StallingFile:
    """The file system's operations (mfusepy's Operations, imported where it is mounted)."""

    def __init__(self, control: Path) -> None:
        self.control = control

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        now = time.time()
        times = {"st_atime": now, "st_mtime": now, "st_ctime": now}
        if path == "/":
            return {"st_mode": stat.S_IFDIR | 0o755, "st_nlink": 2, **times}
        if path == f"/{STALLED}":
            return {"st_mode": stat.S_IFREG | 0o444, "st_nlink": 1, "st_size": len(CONTENT), **times}
        raise _fuse_error(errno.ENOENT)

    def readdir(self, path: str, fh: int) -> list[str]:
        return [".", "..", STALLED]

    def open(self, path: str, flags: int) -> int:
        return 0

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        (self.control / "reading").touch()
        while not (self.control / "release").exists():
            time.sleep(POLL_S)
        return CONTENT[offset : offset + size]


def _fuse_error(code: int) -> Exception:
    from mfusepy import FuseOSError

    return FuseOSError(code)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mountpoint", type=Path)
    parser.add_argument("control", type=Path)
    args = parser.parse_args()
    from mfusepy import FUSE, Operations

    class Mounted(StallingFile, Operations):
        pass

    # direct_io: every read goes to this server, none is answered from the page cache.
    FUSE(Mounted(args.control.resolve()), str(args.mountpoint), foreground=True, direct_io=True, attr_timeout=0.0)


if __name__ == "__main__":
    main()
