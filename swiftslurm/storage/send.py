"""Upload a checkpoint's files to S3 in parallel parts, each part checksummed (SHA-256) for the server to verify.

Why not s3transfer's upload: it streams every part through file-like wrappers that botocore and http.client
read in small pieces, each a few Python calls under the GIL, and it hashes small files the manifest has
hashed already. Here each worker thread takes the next (file, part): it reads the part whole (`pread`,
which releases the GIL), hashes it (hashlib releases the GIL too) and sends it as one `bytes` body, which
the socket writes without coming back to Python (docs/storage.md#benchmark).

What an upload must guarantee, and where it is done:

- Checked by the server: every request carries `x-amz-checksum-sha256`, and the server refuses a body that
  does not match it. A file of one part sends the manifest's SHA-256 (computed at commit), so a file that
  changed on disk since its commit is refused too; a multipart file sends each part's own, hashed here.
- Checked here: the parts of a multipart file are also folded, in byte order, into the whole file's SHA-256,
  and the upload is completed only if that is the manifest's. Without it a file changed after its commit
  (before or during its upload) would be stored under the manifest's SHA-256, which a later retry trusts.
  A file that no longer matches raises `ChangedSinceCommit`, and is not retried.
- Retried: botocore retries each request (connection errors, 5xx, throttling) with back-off; a `bytes` body
  is simply sent again. A part that still fails fails the upload, which the caller retries whole later
  (files already stored are skipped then: each carries its manifest SHA-256 as metadata).
- Nothing half-made is left to look complete: a multipart upload that fails is aborted (best-effort), and
  the caller publishes the manifest only after this returns and the sizes are checked.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swiftslurm.errors import StorageError
from swiftslurm.storage.parallel import Cancelled, Transfer, each_in_parallel


@dataclass(frozen=True)
class LocalFile:
    """One file to send: where it is, where it goes, and what its manifest says."""

    path: Path
    key: str
    size: int
    sha256: str  # hex, from the manifest


@dataclass(frozen=True)
class SendOptions:
    part_size: int  # a file larger than this goes in parts of this size (S3: at least 5 MiB but the last)
    max_concurrency: int = 8  # requests in flight at once (the client's connection pool must be at least this)


class ChangedSinceCommit(StorageError):
    """The bytes read to upload a file are fewer than, or other than, its manifest's: it changed after its
    commit, and sending it again cannot help."""


_TURN_POLL_S = 0.05  # how often a part waiting to be folded into its file's SHA-256 checks for a stop


@dataclass
class _Multipart:
    """A file sent in parts: its upload id once created, and each part's (number, ETag, checksum) as it lands;
    the whole file's SHA-256 of the parts folded in so far (``folded`` bytes, in byte order)."""

    file: LocalFile
    parts_left: int
    upload_id: str | None = None
    done: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    digest: Any = field(default_factory=hashlib.sha256)
    folded: int = 0
    turn: threading.Condition = field(default_factory=threading.Condition)


@dataclass(frozen=True)
class _Piece:
    """One request's worth: a whole file (``multipart`` None) or part ``number`` (1-based) of a multipart file."""

    file: LocalFile
    start: int
    length: int
    number: int = 0
    multipart: _Multipart | None = None


def pieces(files: list[LocalFile], part_size: int) -> list[_Piece]:
    """Every request to make, in file order and within a file in byte order. A file of at most ``part_size``
    bytes (empty ones too) is one PutObject; a larger one is a multipart upload of ``part_size`` parts."""
    found: list[_Piece] = []
    for file in files:
        if file.size <= part_size:
            found.append(_Piece(file, 0, file.size))
            continue
        starts = range(0, file.size, part_size)
        multipart = _Multipart(file, len(starts))
        found += [
            _Piece(file, start, min(part_size, file.size - start), number, multipart)
            for number, start in enumerate(starts, start=1)
        ]
    return found


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


class Send(Transfer[LocalFile, SendOptions]):
    """Send ``files`` to ``bucket``: `run` does it (see Transfer)."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        files: list[LocalFile],
        options: SendOptions,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(client, bucket, files, options, progress)
        self._multiparts: list[_Multipart] = []

    def run(self) -> None:
        """Send every file; raise the first failure (`Cancelled`, or botocore's error once its retries are
        spent). Multipart uploads left unfinished by a failure are aborted."""
        todo = pieces(self.files, self.options.part_size)
        self._multiparts = list({id(p.multipart): p.multipart for p in todo if p.multipart}.values())
        try:
            self._send_all(todo)
        except BaseException:
            self._abort_unfinished()
            raise

    def _send_all(self, todo: list[_Piece]) -> None:
        """The pieces over `max_concurrency` threads, each with its own part buffer; the first failure stops
        the others (before their next piece) and is raised."""

        def make_worker() -> Callable[[_Piece], None]:
            reader = _PartReader(self.options.part_size)
            return lambda piece: self._send(piece, reader)

        each_in_parallel(todo, make_worker, self.options.max_concurrency, self._stop, "swiftslurm-send")

    def _send(self, piece: _Piece, reader: _PartReader) -> None:
        if piece.multipart is None:
            self._put_whole(piece.file)
        else:
            self._put_part(piece, piece.multipart, reader)
        if self.progress is not None:
            self.progress(piece.length)

    def _put_whole(self, file: LocalFile) -> None:
        """A file in one PutObject, with the manifest's SHA-256: the server refuses bytes that differ from it.
        Refused, the bytes are hashed here to tell a file changed since its commit from damage on the way."""
        body = _read(file, 0, file.size)
        try:
            self.client.put_object(
                Bucket=self.bucket,
                Key=file.key,
                Body=body,
                ChecksumSHA256=_b64(bytes.fromhex(file.sha256)),
                Metadata={"sha256": file.sha256},  # lets a retry skip files already stored (CheckpointStore)
            )
        except Exception as err:
            if hashlib.sha256(body).hexdigest() != file.sha256:
                raise _changed_since_commit(file, "has other bytes than its manifest's SHA-256") from err
            raise

    def _put_part(self, piece: _Piece, multipart: _Multipart, reader: _PartReader) -> None:
        """One part, hashed here (a part's SHA-256 is not in the manifest); the last one completes the file."""
        upload_id = self._upload_id(multipart)
        body = reader.read(piece.file, piece.start, piece.length)
        self._fold(piece, multipart, body)
        checksum = _b64(hashlib.sha256(body).digest())
        reply = self.client.upload_part(
            Bucket=self.bucket,
            Key=piece.file.key,
            UploadId=upload_id,
            PartNumber=piece.number,
            Body=body,
            ChecksumSHA256=checksum,
        )
        with multipart.lock:
            multipart.done.append({"PartNumber": piece.number, "ETag": reply["ETag"], "ChecksumSHA256": checksum})
            multipart.parts_left -= 1
            last = multipart.parts_left == 0
        if last:
            self._complete(multipart, upload_id)

    def _upload_id(self, multipart: _Multipart) -> str:
        """The file's multipart upload, created by the first of its parts to be sent (the others wait for it)."""
        with multipart.lock:
            if multipart.upload_id is None:
                reply = self.client.create_multipart_upload(
                    Bucket=self.bucket,
                    Key=multipart.file.key,
                    ChecksumAlgorithm="SHA256",
                    Metadata={"sha256": multipart.file.sha256},
                )
                multipart.upload_id = reply["UploadId"]
            return multipart.upload_id

    def _fold(self, piece: _Piece, multipart: _Multipart, body: bytes | bytearray) -> None:
        """Fold a part into its file's SHA-256, after the parts before it. They were handed out before it
        (each_in_parallel goes in order), so each is being read by another worker, or folded already."""
        with multipart.turn:
            while multipart.folded != piece.start:
                if self._stop.is_set():  # the worker with an earlier part failed: it will never fold it
                    raise Cancelled("the transfer was stopped")
                multipart.turn.wait(_TURN_POLL_S)
        multipart.digest.update(body)  # alone: the next part waits until `folded` moves on
        with multipart.turn:
            multipart.folded += piece.length
            multipart.turn.notify_all()

    def _complete(self, multipart: _Multipart, upload_id: str) -> None:
        """Complete the file, once every part is in, if its bytes were the manifest's (every part was folded
        before it was sent); otherwise raise, and `run` aborts the upload."""
        if (found := multipart.digest.hexdigest()) != multipart.file.sha256:
            raise _changed_since_commit(multipart.file, f"was read for upload with SHA-256 {found}, not its manifest's")
        parts = sorted(multipart.done, key=lambda part: part["PartNumber"])
        self.client.complete_multipart_upload(
            Bucket=self.bucket, Key=multipart.file.key, UploadId=upload_id, MultipartUpload={"Parts": parts}
        )
        with multipart.lock:
            multipart.upload_id = None  # complete: nothing to abort

    def _abort_unfinished(self) -> None:
        """Abort the multipart uploads a failure left open, so the store does not keep their parts. Best-effort:
        a store that cannot be reached now drops them by its own lifecycle rules, if any."""
        for multipart in self._multiparts:
            with multipart.lock:
                upload_id, multipart.upload_id = multipart.upload_id, None
            if upload_id is None:
                continue
            with contextlib.suppress(Exception):  # best-effort cleanup; the upload's own error is raised
                self.client.abort_multipart_upload(Bucket=self.bucket, Key=multipart.file.key, UploadId=upload_id)


class _PartReader:
    """Reads one worker's parts into one buffer, reused part after part (botocore has sent a body, retries
    included, by the time `upload_part` returns). A fresh 16 MiB object per part cost the upload a fifth of
    its CPU in page faults and zeroing (docs/storage.md#benchmark). Made on the first full part: an upload of
    small files needs none."""

    def __init__(self, part_size: int) -> None:
        self.part_size = part_size
        self._buffer: bytearray | None = None

    def read(self, file: LocalFile, start: int, length: int) -> bytes | bytearray:
        if length != self.part_size:  # a file's last part: a body must be exactly its bytes
            return _read(file, start, length)
        if self._buffer is None:
            self._buffer = bytearray(self.part_size)
        fd = os.open(file.path, os.O_RDONLY)
        try:
            got = os.preadv(fd, [self._buffer], start)
        finally:
            os.close(fd)
        if got != length:
            raise _changed_since_commit(file, f"has fewer bytes than its manifest says ({file.size})")
        return self._buffer


def _read(file: LocalFile, start: int, length: int) -> bytes:
    """Bytes [start, start + length) of a local file, read whole; shorter means the file changed since commit."""
    fd = os.open(file.path, os.O_RDONLY)
    try:
        data = os.pread(fd, length, start)
    finally:
        os.close(fd)
    if len(data) != length:
        raise _changed_since_commit(file, f"has fewer bytes than its manifest says ({file.size})")
    return data


def _changed_since_commit(file: LocalFile, what: str) -> ChangedSinceCommit:
    return ChangedSinceCommit(
        f"{file.path} {what}; it changed after it was committed, so its checkpoint is not uploaded. "
        "HINT: a checkpoint's files must not be changed after its commit."
    )
