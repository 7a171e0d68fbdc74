"""Download a checkpoint's files from S3 in parallel byte ranges, each file verified against its manifest.

Why not s3transfer's download: it moves every byte in 256 KiB pieces through queues to a writer thread, with
a callback per piece, and that costs CPython ~4 CPU-seconds per GB here, more than the network, the disk and
the SHA-256 together (docs/storage.md#benchmark). Here each worker thread takes the next (file, byte range)
part, sends one ranged GET, reads the body in 1 MiB pieces and `pwrite`s them (256 KiB at a time) where
they belong; the socket reads, the writes and the hashing all release the GIL, so the threads really run side
by side.

What a restore must guarantee, and where it is done:

- Every byte checked: each file is hashed (SHA-256) as its parts land, in order, from the page cache
  (mapped, not copied); the size and digest must match the manifest. `FileMismatch` names the file otherwise.
- Durable before the manifest: each file is fsynced once it is complete, before `fetch` returns; the caller
  writes the manifest after that, and renames the folder into place. Large files are also written back while
  they download (`_write_back_early`), so the disk works alongside the network instead of after it.
- Retried: botocore retries a request that fails before its body (connection errors, 5xx, throttling), but
  nothing retries a body cut short (a plain `get_object()['Body'].read()`). A part whose body breaks or
  stalls is asked for again from the byte where it stopped, with backoff, up to `max_attempts` times.
- Pinned: every GET carries the listed ETag (`If-Match`), so an object replaced mid-restore fails the
  restore instead of mixing two versions.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import random
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swiftslurm.errors import StorageError
from swiftslurm.storage.parallel import Cancelled, Transfer, each_in_parallel

MiB = 1 << 20
# Bytes asked of a body at once. Measured here (8 threads, read + pwrite): 1 MiB costs the least CPU; 64-256 KiB
# spend more in Python per byte, and 2 MiB or more ~3x the kernel's (each read is then a fresh mmap'd buffer).
READ_SIZE = MiB
# Bytes written to the file at once. The kernel gives a write a page-cache folio as large as the write (ext4,
# Linux 6.16 on): 1 MiB writes get 1 MiB folios, which here (a VM whose free memory goes back to the host) come
# from memory the host has taken back, and copying into them cost 2 kernel CPU-s per GB against 0.35 for 256 KiB
# writes (s5cmd's writes cost as little): the largest restore cost perf showed. Smaller pieces add syscalls (4 per
# MiB read), nothing else.
WRITE_SIZE = 256 * 1024
_HASH_READ_SIZE = 4 * MiB  # read back for hashing where the file cannot be mapped
_MAX_OPEN = 64  # files open at once (each early write-back holds one more descriptor while it runs)
_FSYNC_THREADS = 2  # files fsynced at once, off the download threads (fsync waits for the disk)


@dataclass(frozen=True)
class RemoteFile:
    """One file to fetch: the object, where it goes, and what the manifest says it is."""

    key: str
    path: Path
    size: int
    sha256: str
    etag: str | None = None  # the listed ETag: every GET is pinned to it (If-Match)


@dataclass(frozen=True)
class Part:
    """Bytes [start, start + length) of file number ``file``."""

    file: int
    start: int
    length: int

    @property
    def http_range(self) -> str:
        return f"bytes={self.start}-{self.start + self.length - 1}"


@dataclass(frozen=True)
class FetchOptions:
    # Larger than upload parts (8-16 MiB, which restart whole after a reset): a range cut short resumes where
    # it stopped, so its size no longer decides whether it gets through, and fewer requests cost the client
    # and the server less (a SeaweedFS restore here: 0.4 CPU-s less on each side per GB than 16 MiB ranges).
    part_size: int = 64 * MiB
    max_concurrency: int = 8  # parts in flight at once (the client's connection pool must be at least this)
    max_attempts: int = 10  # tries per part, the first included, before the fetch fails


class FileMismatch(StorageError):
    """A downloaded file differs from its manifest entry (``what``: sizes, or "SHA-256 differs")."""

    def __init__(self, index: int, what: str) -> None:
        super().__init__(f"file {index} does not match its manifest ({what})")
        self.index = index
        self.what = what


def split_ranges(sizes: list[int], part_size: int) -> list[Part]:
    """The parts of every file, in file order and, within a file, byte order (so files complete one after
    another and can be checked while the next download). A file of at most ``part_size`` bytes is one part;
    an empty file has none (there is nothing to ask the store for)."""
    if part_size < 1:
        raise ValueError(f"part_size must be positive, got {part_size}")
    return [
        Part(index, start, min(part_size, size - start))
        for index, size in enumerate(sizes)
        for start in range(0, size, part_size)
    ]


def backoff_s(attempt: int) -> float:
    """Seconds to wait after failed try number ``attempt`` (1, 2, ...): doubling from 0.25 s up to 5 s,
    jittered so parts cut by the same hiccup do not come back all at once."""
    return min(0.25 * 2 ** (attempt - 1), 5.0) * random.uniform(0.5, 1.0)


def _transient_errors() -> tuple[type[BaseException], ...]:
    """Failures worth asking again: the connection or the body broke, stalled or ended early. A ClientError
    (403, 404, 412: the object changed) is not: botocore has already retried the 5xx and throttling ones."""
    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError, IncompleteReadError

    # Socket errors reach here wrapped by urllib3 and botocore; the bare ones are for safety. Not OSError as a
    # whole: a full local disk is no reason to ask the store again (see _write_at).
    network = (ConnectionError, TimeoutError)
    return (HTTPClientError, BotoConnectionError, IncompleteReadError, *network, _ShortBody)


class _ShortBody(Exception):
    """A body ended before the bytes its range asked for, without an error of its own."""


@dataclass
class _FileState:
    """One file on its way: its descriptor, which of its parts have landed, and how far it is hashed."""

    index: int  # in the fetch's list of files
    remote: RemoteFile
    parts_left: int
    fd: int = -1  # open from its first part until it is fsynced: a checkpoint may have more files than fds
    landed: dict[int, int] = field(default_factory=dict)  # start -> length, landed but not hashed yet
    hashed_to: int = 0
    digest: Any = field(default_factory=hashlib.sha256)
    hashing: bool = False  # one thread hashes a file at a time; the others only record what landed
    flush_queued: bool = False  # an early write-back of this file is waiting for an fsync thread
    lock: threading.Lock = field(default_factory=threading.Lock)
    # Writes to one file one at a time: the kernel serializes them anyway (the inode's lock), and its waiters
    # spin on the CPU, while this lock's sleep (perf: 7% of a restore's CPU spinning on 2 cores).
    write_lock: threading.Lock = field(default_factory=threading.Lock)


class Fetch(Transfer[RemoteFile, FetchOptions]):
    """Fetch ``files`` from ``bucket``: `run` does it (see Transfer)."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        files: list[RemoteFile],
        options: FetchOptions,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(client, bucket, files, options, progress)
        self._states: list[_FileState] = []
        self._fsyncs = ThreadPoolExecutor(_FSYNC_THREADS, thread_name_prefix="swiftslurm-fsync")
        self._durable: list[Future[None]] = []
        self._open_slots = threading.Semaphore(_MAX_OPEN)

    def run(self) -> None:
        """Download, verify and fsync every file; raise the first failure (`FileMismatch`, `Cancelled`, a
        `StorageError` once a part's attempts are spent, or botocore's error when a request is refused).
        The files stay where they are, whole or not: the caller owns the folder."""
        try:
            parts = split_ranges([f.size for f in self.files], self.options.part_size)
            self._plan_all(parts)
            for state in self._states:
                if state.parts_left == 0:  # empty files: no part will create or finish them
                    self._open(state)
                    self._finish(state)
            self._download(parts)
            for future in self._durable:
                future.result()
        finally:
            self._stop.set()
            self._fsyncs.shutdown(wait=True)
            for state in self._states:
                if state.fd >= 0:
                    os.close(state.fd)

    def _plan_all(self, parts: list[Part]) -> None:
        counts = [0] * len(self.files)
        for part in parts:
            counts[part.file] += 1
        for remote, count in zip(self.files, counts, strict=True):
            self._states.append(_FileState(len(self._states), remote, count))

    def _open(self, state: _FileState) -> int:
        """The file's descriptor, the file created at its full size on first use. Waits while `_MAX_OPEN`
        files are open: small files arrive faster than they are fsynced, and each waits open until it is."""
        with state.lock:
            if state.fd >= 0:
                return state.fd
        while not self._open_slots.acquire(timeout=0.5):
            if self._stop.is_set():  # failed elsewhere: the files holding the slots may never finish
                raise Cancelled("the download was stopped")
        with state.lock:
            if state.fd >= 0:  # another part of this file opened it meanwhile
                self._open_slots.release()
            else:
                state.fd = os.open(state.remote.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
                os.ftruncate(state.fd, state.remote.size)  # sparse: posix_fallocate writes zeros on NFS/Lustre
            return state.fd

    def _fsync_and_close(self, state: _FileState) -> None:
        os.fsync(state.fd)
        with state.lock:
            os.close(state.fd)
            state.fd = -1
        self._open_slots.release()

    def _download(self, parts: list[Part]) -> None:
        """The parts over `max_concurrency` threads, each taking the next part in order as it frees up. The
        first failure stops the others (at their next read) and is raised."""
        each_in_parallel(parts, lambda: self._fetch_part, self.options.max_concurrency, self._stop, "swiftslurm-fetch")

    def _fetch_part(self, part: Part) -> None:
        """One part, asked again from where it broke off until it is whole or the attempts are spent."""
        state = self._states[part.file]
        got = 0
        for attempt in range(1, self.options.max_attempts + 1):
            try:
                got += self._receive(state, Part(part.file, part.start + got, part.length - got))
                break
            except _transient_errors() as err:
                got += getattr(err, "received", 0)
                if attempt == self.options.max_attempts:
                    raise _gave_up(state.remote, part, attempt, err) from err
                if self._stop.wait(backoff_s(attempt)):
                    raise Cancelled("the download was stopped") from err
        self._landed(state, part)

    def _receive(self, state: _FileState, part: Part) -> int:
        """One ranged GET for ``part``, written in place. A failure mid-body carries the bytes written so far
        (``err.received``), so the retry asks only for the rest."""
        if self._stop.is_set():
            raise Cancelled("the download was stopped")
        request = {"Bucket": self.bucket, "Key": state.remote.key, "Range": part.http_range}
        if state.remote.etag:
            request["IfMatch"] = state.remote.etag
        fd = self._open(state)
        body = self.client.get_object(**request)["Body"]
        received = 0
        try:
            while received < part.length:
                if self._stop.is_set():
                    raise Cancelled("the download was stopped")
                chunk = body.read(min(READ_SIZE, part.length - received))
                if not chunk:
                    raise _ShortBody(f"the body ended after {received} of {part.length} bytes")
                with state.write_lock:
                    _write_at(fd, chunk, part.start + received)
                received += len(chunk)
                if self.progress is not None:
                    self.progress(len(chunk))
        except BaseException as err:
            body.close()  # a half-read connection must not go back to the pool
            err.received = received  # type: ignore[attr-defined]
            raise
        return received

    def _landed(self, state: _FileState, part: Part) -> None:
        """Record a whole part; hash whatever is now contiguous from where hashing stopped (one thread at a
        time per file, reading back from the page cache); once the file is whole, verify and fsync it."""
        with state.lock:
            state.landed[part.start] = part.length
            state.parts_left -= 1
            if state.hashing:
                return  # the thread hashing this file picks the part up
            state.hashing = True
        while True:
            with state.lock:
                length = state.landed.pop(state.hashed_to, None)
                if length is None:
                    state.hashing = False
                    complete = state.parts_left == 0 and not state.landed
                    break
            _hash_range(state, state.hashed_to, length)
            state.hashed_to += length
        if complete:
            self._finish(state)
        else:
            self._write_back_early(state)

    def _write_back_early(self, state: _FileState) -> None:
        """Have the disk write what has landed of a large file now, not all at its final fsync: the kernel
        would otherwise hold it in the page cache for up to 30 s, and a restore would end with the disk
        writing the last file while the network idles. At most one queued per file."""
        with state.lock:
            if state.flush_queued or state.fd < 0:
                return
            state.flush_queued = True
            fd = os.dup(state.fd)  # a descriptor of its own: the file's is closed once it is complete

        def flush() -> None:
            with state.lock:
                state.flush_queued = False
            try:
                os.fdatasync(fd)
            finally:
                os.close(fd)

        self._durable.append(self._fsyncs.submit(flush))

    def _finish(self, state: _FileState) -> None:
        """Every byte of a file is hashed: compare with the manifest, then fsync it off this thread."""
        remote = state.remote
        size = os.fstat(state.fd).st_size
        if size != remote.size or state.hashed_to != remote.size:
            raise FileMismatch(state.index, f"{size} bytes, manifest says {remote.size}")
        if state.digest.hexdigest() != remote.sha256:
            raise FileMismatch(state.index, "SHA-256 differs")
        self._durable.append(self._fsyncs.submit(self._fsync_and_close, state))


def _write_at(fd: int, data: bytes, offset: int) -> None:
    """Write ``data`` at ``offset`` in `WRITE_SIZE` pieces (see there: one 1 MiB write cost several times the
    kernel CPU of four)."""
    view = memoryview(data)
    try:
        for start in range(0, len(view), WRITE_SIZE):
            os.pwrite(fd, view[start : start + WRITE_SIZE], offset + start)
    except OSError as err:
        raise StorageError(
            f"writing a downloaded file failed: {err}. HINT: check the free space and quota of the output folder."
        ) from err


def _hash_range(state: _FileState, start: int, length: int) -> None:
    """Feed bytes [start, start + length) of the file to its digest, from the page cache. Mapped rather than
    read: a read copies every byte once more, and that copy cost a restore more CPU than receiving them
    (perf, docs/storage.md#benchmark). Where mapping fails (an odd filesystem), read in pieces instead."""
    if length == 0:
        return
    try:  # the file is ours, already at its full size: the mapping never reaches past its end
        mapped = mmap.mmap(state.fd, length, prot=mmap.PROT_READ, offset=start)
    except (OSError, ValueError):  # ValueError: an offset not a multiple of the page size
        _hash_read(state, start, length)
        return
    with mapped:
        state.digest.update(mapped)


def _hash_read(state: _FileState, start: int, length: int) -> None:
    end = start + length
    while start < end:
        chunk = os.pread(state.fd, min(_HASH_READ_SIZE, end - start), start)
        if not chunk:
            raise _ShortBody(f"{state.remote.path} is shorter than {end} bytes on disk")
        state.digest.update(chunk)
        start += len(chunk)


def _gave_up(remote: RemoteFile, part: Part, attempts: int, err: BaseException) -> StorageError:
    return StorageError(
        f"downloading {remote.key} (bytes {part.start}-{part.start + part.length - 1}) failed {attempts} times; "
        f"last: {type(err).__name__}: {err}. HINT: check the network to the store, or raise storage.max_attempts "
        "/ storage.timeout_s."
    )
