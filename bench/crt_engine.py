"""awscrt as swiftslurm's transfer engine: the candidate bench/storage.py measures (client `awscrt`) against
swiftslurm's own sender and fetcher (swiftslurm/storage/send.py, fetch.py). Issue 15, item 6.

The CRT S3 client (awscrt, what `boto3[crt]` and s3transfer's `CRTTransferManager` run) moves the bytes:
multipart uploads and ranged downloads on its own native threads, files read and written by it directly
(`send_filepath`, `recv_filepath`). boto3's own switch to it (`boto3.crt`) cannot be used as it is: it
ignores `endpoint_url` and always uses TLS, so a store that is not AWS (SeaweedFS, MinIO, Ceph) needs the
pieces it is made of, wired here as boto3 wires them, with the spec's endpoint and addressing style.

What `CheckpointStore` guarantees stays the same, so the comparison is like with like:

- Upload: a file of one part carries the manifest's SHA-256 (`ChecksumSHA256`: the server refuses bytes
  that changed since their commit); a larger one goes in `part_size_mb` parts, each with a SHA-256 the CRT
  computes and sends as a trailer. Every file carries its manifest SHA-256 as metadata (a retry skips it).
  The size check and the manifest, last, are CheckpointStore's, unchanged.
- Restore: the CRT downloads each file (to a temporary name it renames on success), every GET pinned to the
  listed ETag; then each file is hashed against the manifest and fsynced, on two threads of ours while the
  CRT downloads the rest. The manifest, last, and the rename into place are CheckpointStore's, unchanged.

Retries and stalls are the CRT's own (its retry strategy; no read timeout is set): not what the fault-proxy
test (tests/integration/test_storage.py) checks of swiftslurm's engine. Not production code: a measured
candidate (docs/storage.md#awscrt).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from swiftslurm.errors import StorageError
from swiftslurm.plan import StorageSpec
from swiftslurm.storage.fetch import FileMismatch, RemoteFile
from swiftslurm.storage.parallel import Cancelled
from swiftslurm.storage.send import LocalFile
from swiftslurm.storage.store import CheckpointStore

MiB = 1 << 20
_VERIFY_THREADS = 2  # files hashed and fsynced at once, beside the CRT's downloads (as fetch.py's fsyncs)


def crt_manager(spec: StorageSpec, connections: int | None = None) -> Any:
    """s3transfer's CRTTransferManager on one CRT S3 client for ``spec``'s endpoint: what `boto3.crt` builds,
    with the endpoint, TLS and part size taken from the spec. ``connections`` None lets the CRT choose (from
    its throughput target, as boto3 does)."""
    import botocore.session
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config
    from s3transfer.crt import (
        BotocoreCRTCredentialsWrapper,
        BotocoreCRTRequestSerializer,
        CRTTransferManager,
        create_s3_crt_client,
    )

    session = botocore.session.get_session()
    credentials = session.get_credentials()
    if credentials is None:
        raise StorageError("no credentials for the CRT client. HINT: set AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY.")
    part_size = spec.part_size_mb * MiB
    crt_client = create_s3_crt_client(
        spec.region,
        BotocoreCRTCredentialsWrapper(credentials).to_crt_credentials_provider(),
        part_size=part_size,
        use_ssl=not (spec.endpoint_url or "https:").startswith("http:"),
    )
    serializer = BotocoreCRTRequestSerializer(
        session,
        {
            "region_name": spec.region,
            "endpoint_url": spec.endpoint_url,
            "config": Config(s3={"addressing_style": spec.addressing_style}),
        },
    )
    options: dict[str, Any] = {"multipart_chunksize": part_size, "multipart_threshold": part_size}
    if connections is not None:
        options["max_concurrency"] = connections
    manager = CRTTransferManager(crt_client, serializer, config=TransferConfig(**options))
    # Downloads carry `IfMatch` (the listed ETag), as fetch.py's GETs do; s3transfer's list of arguments lacks it.
    manager.ALLOWED_DOWNLOAD_ARGS = [*CRTTransferManager.ALLOWED_DOWNLOAD_ARGS, "IfMatch"]
    return manager


def _subscriber(on_done: Callable[[], None] | None, progress: Callable[[int], None] | None) -> Any:
    from s3transfer.subscribers import BaseSubscriber

    class Subscriber(BaseSubscriber):  # type: ignore[misc]
        def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
            if progress is not None:
                progress(bytes_transferred)

        def on_done(self, future: Any, **kwargs: Any) -> None:
            if on_done is not None:
                on_done()

    return Subscriber()


class _CrtTransfer:
    """The part of swiftslurm.storage.parallel.Transfer that CheckpointStore uses: `run`, `cancel`."""

    def __init__(self, manager: Any, bucket: str, progress: Callable[[int], None] | None) -> None:
        self.manager = manager
        self.bucket = bucket
        self.progress = progress
        self._futures: list[Any] = []
        self._cancelled = threading.Event()

    def cancel(self) -> None:
        self._cancelled.set()
        for future in list(self._futures):
            future.cancel()

    def _wait_all(self) -> None:
        """Every transfer's result; the first failure cancels the others and is raised."""
        try:
            for future in self._futures:
                future.result()
                # The CRT resolves a request before it calls its done callbacks (the rename of a download, our
                # queueing of its check): wait for those too, as s3transfer's own shutdown does.
                future._coordinator.wait_until_on_done_callbacks_complete()
        except BaseException:
            for future in self._futures:
                future.cancel()
            if self._cancelled.is_set():
                raise Cancelled("the transfer was stopped") from None
            raise


class CrtSend(_CrtTransfer):
    def __init__(
        self,
        manager: Any,
        bucket: str,
        files: list[LocalFile],
        part_size: int,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(manager, bucket, progress)
        self.files = files
        self.part_size = part_size

    def run(self) -> None:
        for file in self.files:
            extra: dict[str, Any] = {"Metadata": {"sha256": file.sha256}}
            if file.size <= self.part_size:  # one PutObject: the manifest's SHA-256, checked by the server
                extra["ChecksumSHA256"] = _b64(bytes.fromhex(file.sha256))
            else:  # multipart: each part's SHA-256, computed by the CRT, sent as a trailer
                extra["ChecksumAlgorithm"] = "SHA256"
            subscribers = [_subscriber(None, self.progress)] if self.progress is not None else []
            self._futures.append(self.manager.upload(str(file.path), self.bucket, file.key, extra, subscribers))
        self._wait_all()


class CrtFetch(_CrtTransfer):
    def __init__(
        self,
        manager: Any,
        bucket: str,
        files: list[RemoteFile],
        progress: Callable[[int], None] | None = None,
    ) -> None:
        super().__init__(manager, bucket, progress)
        self.files = files
        self._verify = ThreadPoolExecutor(_VERIFY_THREADS, thread_name_prefix="swiftslurm-crt-verify")
        self._verified: list[Future[None]] = []
        self._lock = threading.Lock()

    def run(self) -> None:
        try:
            for index, file in enumerate(self.files):
                extra = {"IfMatch": file.etag} if file.etag else {}
                future_box: list[Any] = []
                subscriber = _subscriber(self._then_verify(index, future_box), self.progress)
                future = self.manager.download(self.bucket, file.key, str(file.path), extra, [subscriber])
                future_box.append(future)
                self._futures.append(future)
            self._wait_all()
            with self._lock:
                verified = list(self._verified)
            for done in verified:
                done.result()
        finally:
            self._verify.shutdown(wait=True)

    def _then_verify(self, index: int, future_box: list[Any]) -> Callable[[], None]:
        """Called on the CRT's thread when a download ends: hash and fsync it on ours (failures are the
        download's own, raised by `_wait_all`)."""

        def queue() -> None:
            with self._lock:
                self._verified.append(self._verify.submit(self._check, index, future_box))

        return queue

    def _check(self, index: int, future_box: list[Any]) -> None:
        future_box[0].result()  # done: its rename has run (the CRT calls this just before it marks it done)
        remote = self.files[index]
        fd = os.open(remote.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size != remote.size:
                raise FileMismatch(index, f"{size} bytes, manifest says {remote.size}")
            if _sha256(fd, size) != remote.sha256:
                raise FileMismatch(index, "SHA-256 differs")
            os.fsync(fd)
        finally:
            os.close(fd)


def _sha256(fd: int, size: int) -> str:
    """Of the file's bytes, from the page cache (mapped, as fetch.py does, rather than copied by reads)."""
    digest = hashlib.sha256()
    if size:
        with mmap.mmap(fd, size, prot=mmap.PROT_READ) as mapped:
            digest.update(mapped)
    return digest.hexdigest()


def _b64(digest: bytes) -> str:
    import base64

    return base64.b64encode(digest).decode()


class CrtCheckpointStore(CheckpointStore):
    """CheckpointStore with the CRT moving the files' bytes; listing, manifests and checks unchanged (boto3)."""

    def __init__(self, spec: StorageSpec, connections: int | None = None) -> None:
        super().__init__(spec)
        self.manager = crt_manager(spec, connections)

    def _send(self, checkpoint: Path, step: int, entries: list[dict[str, Any]]) -> None:
        files = [LocalFile(checkpoint / e["path"], self.key(step, e["path"]), e["size"], e["sha256"]) for e in entries]
        send = CrtSend(self.manager, self.spec.bucket, files, self.spec.part_size_mb * MiB)
        self._run(send, f"uploading checkpoint-{step} to {self.spec.url}")  # type: ignore[arg-type]

    def _fetch(self, step: int, entries: list[dict[str, Any]], staging: Path, report: Any = None) -> None:
        paths = [staging / e["path"] for e in entries]
        listed = self._listed_as_manifest_says(step, entries)
        for folder in {path.parent for path in paths}:
            folder.mkdir(parents=True, exist_ok=True)
        files = [
            RemoteFile(item["Key"], path, e["size"], e["sha256"], item.get("ETag"))
            for e, path, item in zip(entries, paths, listed, strict=True)
        ]
        try:
            self._run(CrtFetch(self.manager, self.spec.bucket, files), f"downloading checkpoint-{step}")  # type: ignore[arg-type]
        except FileMismatch as err:
            raise self._damaged(step, entries[err.index], err.what) from err
        for below, _, _ in os.walk(staging):
            if below != str(staging):
                from swiftslurm.rundir.jsonio import fsync_dir

                fsync_dir(Path(below))
