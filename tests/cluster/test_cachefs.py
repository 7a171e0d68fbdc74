"""swiftslurm.testing.cachefs, a shared filesystem whose clients cache as NFS clients do: two mounts of one
backing directory (two "nodes") disagree until a cached listing expires, while the mount that wrote a file,
and the backing store, see it at once; hard links work through it (the run dir's lease is taken by link(2)).
In the cluster tier: it needs FUSE and Debian's fuse3, which scripts/slurm-local.sh installs."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from swiftslurm.testing.cluster import wait_until

TTL_S = 20.0  # far longer than the few file operations between the cached listing and its check


@contextmanager
def cached_mount(backing: Path, where: Path) -> Iterator[Path]:
    where.mkdir()
    argv = [sys.executable, "-m", "swiftslurm.testing.cachefs", str(backing), str(where), f"--ttl={TTL_S}"]
    daemon = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_until(lambda: subprocess.run(["mountpoint", "-q", str(where)]).returncode == 0, 30, f"{where} mounted")
        yield where
    finally:
        subprocess.run(["fusermount3", "-u", "-z", str(where)], check=False)
        try:
            daemon.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.kill()


def test_another_mounts_listing_is_stale_until_its_cache_expires(tmp_path: Path) -> None:
    if shutil.which("fusermount3") is None or not Path("/dev/fuse").exists():
        pytest.fail("no FUSE here: bash scripts/slurm-local.sh up installs fuse3 (and /dev/fuse is needed)")
    backing = tmp_path / "backing"
    backing.mkdir()
    with cached_mount(backing, tmp_path / "a") as first, cached_mount(backing, tmp_path / "b") as second:
        assert sorted(p.name for p in second.iterdir()) == []  # the second mount has read the listing: cached
        cached_at = time.monotonic()
        (first / "shard-1").write_bytes(b"rank 1")
        assert [p.name for p in first.iterdir()] == ["shard-1"]  # the writer sees its own change
        assert (backing / "shard-1").read_bytes() == b"rank 1"  # so does the store
        assert [p.name for p in second.iterdir()] == []  # the other mount does not, yet
        assert time.monotonic() - cached_at < TTL_S, "too slow to tell a stale listing from an expired one"
        wait_until(lambda: [p.name for p in second.iterdir()] == ["shard-1"], 3 * TTL_S, "the listing to expire")
        (first / "linked").hardlink_to(first / "shard-1")
        with pytest.raises(FileExistsError):
            (second / "linked").hardlink_to(second / "shard-1")  # a name that exists is refused, as link(2) is
        assert (backing / "linked").stat().st_nlink == 2
