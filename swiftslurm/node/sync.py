"""Committed checkpoints in an object store: uploaded in the background, pulled back when the store is ahead.

Layout: every file a local manifest lists goes to `<prefix>/checkpoint-N/<path>`, and then, last and only
once (`If-None-Match: *`), the manifest to `<prefix>/checkpoint-N/swiftslurm_manifest.json`. As on local
disk, a remote checkpoint exists only if its manifest does: listing, download and resume look at manifests,
never at folders. Deleting runs the other way round, manifest first, so a half-deleted checkpoint is never
visible as complete.

Credentials come only from boto3's standard chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an
instance role): nothing here stores, logs or passes them on. boto3 is imported when a store is made.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any

from swiftslurm.errors import SwiftSlurmError, one_of
from swiftslurm.node.checkpoint import (
    MANIFEST,
    QUARANTINE,
    checkpoint_step,
    fsync_dir,
    is_committed,
    problems,
    read_manifest,
    sha256_and_fsync,
    write_json_atomic,
)

log = logging.getLogger("swiftslurm.sync")
MiB = 1 << 20
_MANIFEST_KEY = re.compile(r"checkpoint-(\d+)/" + re.escape(MANIFEST))
_FOLDER_KEY = re.compile(r"checkpoint-(\d+)/")
_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}
_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_CREDENTIALS_HINT = (
    "HINT: credentials come only from boto3's standard chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in "
    "the environment, AWS_PROFILE (~/.aws/credentials), or an instance role. Check they are set where this runs "
    "and may read and write the bucket."
)


class StorageError(SwiftSlurmError):
    """The object store refused or failed an operation; the message says what to change."""


@dataclass(frozen=True)
class StorageSpec:
    """Where a run's checkpoints live remotely and how they travel. Holds no credentials (see the module doc)."""

    bucket: str
    prefix: str  # the run's remote folder, e.g. "runs/<run_name>"; "" is the bucket's root
    endpoint_url: str | None = None  # None: AWS S3; else an S3-compatible endpoint, e.g. "http://10.0.0.5:8333"
    region: str | None = None  # None: boto3's default (AWS_REGION, the profile)
    addressing_style: str = "auto"  # "auto" | "path" | "virtual"; most self-hosted stores want "path"
    keep: int = 0  # newest K committed checkpoints kept remotely; 0 keeps all; the newest is never deleted
    part_size_mb: int = 16  # multipart part size, MiB: 8-16 MiB parts survive a proxy resetting 20% of requests
    max_attempts: int = 10  # attempts per request, the first included (boto3 retries)
    retry_mode: str = "standard"  # boto3 retry mode: "standard" | "adaptive" (adds client-side rate limiting)
    max_concurrency: int = 8  # parts and files in flight at once
    wait_at_exit_s: float = 300.0  # how long the end of an attempt waits for pending uploads, s
    timeout_s: float = 60.0  # connect and read timeout of one request, s: a stalled request is retried after it

    def __post_init__(self) -> None:
        if not self.bucket:
            raise StorageError("storage.bucket is empty. HINT: set `storage.bucket=<bucket name>`.")
        choices = {"addressing_style": ("auto", "path", "virtual"), "retry_mode": ("standard", "adaptive")}
        for name, valid in choices.items():
            if getattr(self, name) not in valid:
                raise StorageError(f"storage.{name}={getattr(self, name)!r} is not valid. {one_of(valid)}")
        if self.part_size_mb < 5:
            raise StorageError(f"storage.part_size_mb={self.part_size_mb}: S3 parts are at least 5 MiB; use 8-16.")
        for name in ("keep", "max_attempts", "max_concurrency"):
            if getattr(self, name) < (0 if name == "keep" else 1):
                raise StorageError(f"storage.{name}={getattr(self, name)} is out of range.")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StorageSpec:
        """From plan.json's `storage` section. Keys this version does not know are ignored (a newer plan)."""
        known = {f.name for f in fields(cls)}
        missing = {"bucket", "prefix"} - {name for name, value in data.items() if value is not None}
        if missing:
            raise StorageError(f"storage is missing {', '.join(sorted(missing))}. HINT: set storage.bucket/prefix.")
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def root(self) -> str:
        """The prefix as a key folder: '' or 'runs/x/'."""
        stripped = self.prefix.strip("/")
        return f"{stripped}/" if stripped else ""

    @property
    def url(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"s3://{self.bucket}/{self.root}{where}"


@dataclass(frozen=True)
class UploadResult:
    step: int
    files: int  # files sent now
    size: int  # bytes sent now
    seconds: float
    already_remote: bool = False  # the remote manifest existed: nothing was sent


def make_client(spec: StorageSpec) -> Any:
    """A boto3 S3 client for the spec; its credentials come from boto3's chain, never from the spec."""
    import boto3
    from botocore.config import Config
    from botocore.handlers import add_expect_header

    config = Config(
        region_name=spec.region,
        retries={"max_attempts": spec.max_attempts, "mode": spec.retry_mode},
        s3={"addressing_style": spec.addressing_style},
        connect_timeout=spec.timeout_s,
        read_timeout=spec.timeout_s,
        max_pool_connections=spec.max_concurrency + 4,  # transfers, plus listing and manifest calls beside them
    )
    # A session per client: boto3's default session is not safe to create clients from in several threads.
    client = boto3.session.Session().client("s3", endpoint_url=spec.endpoint_url, config=config)
    # No `Expect: 100-continue`: when a connection closes cleanly right after the `100 Continue` line, botocore
    # 1.44 reads empty lines forever (AWSConnection._consume_headers), past every timeout. Without it, a refused
    # request costs one part's body at most.
    client.meta.events.unregister("before-call.s3", add_expect_header)
    return client


def _error_code(err: Any) -> str:
    return str(
        err.response.get("Error", {}).get("Code") or err.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    )


def _as_storage_error(spec: StorageSpec, action: str, err: Exception) -> StorageError:
    """What went wrong and how to fix it, naming the bucket and endpoint but never a credential."""
    from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

    if isinstance(err, NoCredentialsError):
        return StorageError(f"{action}: no credentials found. {_CREDENTIALS_HINT}")
    if isinstance(err, EndpointConnectionError):
        return StorageError(f"{action}: cannot reach {spec.url}. HINT: check storage.endpoint_url and the network.")
    if not isinstance(err, ClientError):
        return StorageError(f"{action} failed ({spec.url}): {err}")
    code = _error_code(err)
    if code == "NoSuchBucket":
        return StorageError(
            f"{action}: bucket `{spec.bucket}` does not exist ({spec.url}). HINT: create it "
            f"(e.g. `aws s3 mb s3://{spec.bucket}`) or fix `storage.bucket`."
        )
    if code in _AUTH_CODES or code == "403":
        return StorageError(f"{action}: the store refused the credentials ({code}, {spec.url}). {_CREDENTIALS_HINT}")
    return StorageError(f"{action} failed ({spec.url}): {code}: {err.response.get('Error', {}).get('Message', err)}")


@contextmanager
def _explained(spec: StorageSpec, action: str) -> Iterator[None]:
    """Raise botocore's and s3transfer's errors as StorageError messages that say what to change."""
    from botocore.exceptions import BotoCoreError, ClientError
    from s3transfer.exceptions import RetriesExceededError

    try:
        yield
    except (BotoCoreError, ClientError, RetriesExceededError) as err:
        raise _as_storage_error(spec, action, err) from err


def _safe_path(path: str) -> PurePosixPath:
    """A manifest path that stays inside its checkpoint (a remote manifest is not trusted blindly)."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or str(pure) != path:
        raise StorageError(f"the remote manifest lists an unsafe path {path!r}; refusing to download it.")
    return pure


def _well_formed(manifest: Any, step: int) -> bool:
    """Whether a remote manifest has the shape `commit` writes (format 1), for this step."""
    entry_types = {"path": str, "size": int, "sha256": str}
    files = manifest.get("files") if isinstance(manifest, dict) else None
    return (
        isinstance(files, list)
        and manifest.get("step") == step
        and all(isinstance(e, dict) and all(isinstance(e.get(k), t) for k, t in entry_types.items()) for e in files)
    )


def _progress_bar(label: str, total: int) -> Any | None:
    """A tqdm bar when someone is watching (stderr is a terminal) and tqdm is installed; else None."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024, leave=False)


def _subscribers(bar: Any | None) -> list[Any]:
    if bar is None:
        return []
    from s3transfer.subscribers import BaseSubscriber

    advance = bar.update  # s3transfer reports progress from its worker threads; tqdm locks

    class _Advance(BaseSubscriber):
        def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
            advance(bytes_transferred)

    return [_Advance()]


def summary(verb: str, step: int, files: int, size: int, seconds: float) -> str:
    """'[swiftslurm] uploaded checkpoint-40: 12 files, 48.3 MiB in 1.2 s (40.1 MiB/s)'."""
    rate = size / MiB / seconds if seconds > 0 else 0.0
    return (
        f"[swiftslurm] {verb} checkpoint-{step}: {files} files, {size / MiB:.1f} MiB in {seconds:.1f} s "
        f"({rate:.1f} MiB/s)"
    )


class CheckpointStore:
    """One run's checkpoints under `s3://bucket/prefix/`: upload, list, download, prune. Thread-safe."""

    def __init__(self, spec: StorageSpec, client: Any | None = None) -> None:
        self.spec = spec
        self.client = client if client is not None else make_client(spec)
        self._lock = threading.Lock()
        self._in_flight: set[Any] = set()

    def __repr__(self) -> str:
        return f"CheckpointStore({self.spec.url})"

    def key(self, step: int, path: str = "") -> str:
        return f"{self.spec.root}checkpoint-{step}/{path}"

    # -- reading -------------------------------------------------------------------------------------------

    def _objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under ``prefix``, page by page."""
        with _explained(self.spec, f"listing {self.spec.url}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.spec.bucket, Prefix=prefix)
            for page in pages:
                yield from ((item["Key"], item["Size"]) for item in page.get("Contents", []))

    def _folders(self) -> dict[int, list[str]]:
        """Remote keys grouped by the checkpoint-N folder they are in (committed or not)."""
        found: dict[int, list[str]] = {}
        for key, _ in self._objects(self.spec.root):
            if match := _FOLDER_KEY.match(key[len(self.spec.root) :]):
                found.setdefault(int(match.group(1)), []).append(key)
        return found

    def committed_steps(self) -> list[int]:
        """Steps with a remote manifest, oldest first. A folder without one (an upload cut short) does not count."""
        root = self.spec.root
        return sorted(
            int(match.group(1))
            for key, _ in self._objects(root)
            if (match := _MANIFEST_KEY.fullmatch(key[len(root) :]))
        )

    def _get_bytes(self, key: str) -> bytes | None:
        """A small object's bytes, or None if absent. Reading a body is retried by nothing else, hence the loop."""
        from botocore.exceptions import BotoCoreError, ClientError

        for attempt in range(1, self.spec.max_attempts + 1):
            try:
                return bytes(self.client.get_object(Bucket=self.spec.bucket, Key=key)["Body"].read())
            except ClientError as err:
                if _error_code(err) in _MISSING_CODES:
                    return None
                raise _as_storage_error(self.spec, f"reading {key}", err) from err
            except BotoCoreError as err:  # connection lost mid-body; botocore's retries have already run
                if attempt == self.spec.max_attempts:
                    raise _as_storage_error(self.spec, f"reading {key}", err) from err
                time.sleep(min(0.5 * attempt, 5.0))
        return None

    def manifest(self, step: int) -> dict[str, Any] | None:
        """The remote manifest of checkpoint-N, or None when that checkpoint is not committed remotely."""
        body = self._get_bytes(self.key(step, MANIFEST))
        if body is None:
            return None
        try:
            data = json.loads(body)
        except json.JSONDecodeError as err:
            raise StorageError(f"{self.key(step, MANIFEST)} is not valid JSON: {err}") from err
        if not _well_formed(data, step):
            raise StorageError(f"{self.key(step, MANIFEST)} is not a swiftslurm manifest for step {step}.")
        return data

    # -- transfers -----------------------------------------------------------------------------------------

    def _transfer_manager(self) -> Any:
        from boto3.s3.transfer import TransferConfig
        from s3transfer.manager import TransferManager

        part = self.spec.part_size_mb * MiB
        config = TransferConfig(
            multipart_threshold=part,
            multipart_chunksize=part,
            max_concurrency=self.spec.max_concurrency,
            num_download_attempts=self.spec.max_attempts,
        )
        return TransferManager(self.client, config)

    def _run_transfers(self, action: str, start_all: Callable[[Any], list[Any]]) -> None:
        """Start transfers on one manager (files and parts share `max_concurrency`) and wait for all of them;
        the first failure cancels the rest and is raised."""
        try:
            with _explained(self.spec, action), self._transfer_manager() as manager:
                futures = start_all(manager)
                with self._lock:
                    self._in_flight.update(futures)
                try:
                    for future in futures:
                        future.result()
                finally:
                    with self._lock:
                        self._in_flight.difference_update(futures)
        except StorageError:
            raise
        except Exception as err:  # e.g. a reply cut mid-headers parses into a KeyError or ValueError, unretried
            raise StorageError(f"{action} failed: {type(err).__name__}: {err}") from err

    def cancel(self) -> None:
        """Cancel the transfers in flight (from another thread); the call running them raises."""
        with self._lock:
            for future in self._in_flight:
                future.cancel()

    # -- upload --------------------------------------------------------------------------------------------

    def upload(self, local_checkpoint: Path) -> UploadResult:
        """Publish a committed local checkpoint: its files (checksummed by the server), their sizes checked,
        then the manifest. Idempotent: a checkpoint whose remote manifest exists is left alone."""
        started = time.monotonic()
        manifest = self._local_manifest(local_checkpoint)
        step = manifest["step"]
        if self.manifest(step) is not None:
            log.info(f"[swiftslurm] checkpoint-{step} is already in {self.spec.url}")
            return UploadResult(step, 0, 0, time.monotonic() - started, already_remote=True)
        remote_sizes = dict(self._objects(self.key(step)))
        todo = [e for e in manifest["files"] if not self._already_sent(step, e, remote_sizes)]
        self._send(local_checkpoint, step, todo)
        self._check_sizes(step, manifest["files"])
        self._publish(step, manifest)
        result = UploadResult(step, len(todo), sum(e["size"] for e in todo), time.monotonic() - started)
        log.info(summary("uploaded", step, result.files, result.size, result.seconds))
        return result

    def _local_manifest(self, checkpoint: Path) -> dict[str, Any]:
        manifest = read_manifest(checkpoint)
        if manifest is None:
            raise StorageError(f"{checkpoint} is not committed (no {MANIFEST}); only committed checkpoints upload.")
        if issues := problems(checkpoint):
            raise StorageError(f"{checkpoint} no longer matches its manifest, not uploaded: {'; '.join(issues)}")
        return manifest

    def _already_sent(self, step: int, entry: dict[str, Any], remote_sizes: dict[str, int]) -> bool:
        """Whether an earlier, cut-short attempt already stored these very bytes (same size and SHA-256)."""
        key = self.key(step, entry["path"])
        if remote_sizes.get(key) != entry["size"]:
            return False
        with _explained(self.spec, f"checking {key}"):
            head = self.client.head_object(Bucket=self.spec.bucket, Key=key)
        return bool(head.get("Metadata", {}).get("sha256") == entry["sha256"])

    def _send(self, checkpoint: Path, step: int, entries: list[dict[str, Any]]) -> None:
        bar = _progress_bar(f"upload checkpoint-{step}", sum(e["size"] for e in entries))
        subscribers = _subscribers(bar)

        def start_all(manager: Any) -> list[Any]:
            return [
                manager.upload(
                    str(checkpoint / entry["path"]),
                    self.spec.bucket,
                    self.key(step, entry["path"]),
                    # The server checks each part's SHA-256; the metadata lets a retry skip files already there.
                    extra_args={"ChecksumAlgorithm": "SHA256", "Metadata": {"sha256": entry["sha256"]}},
                    subscribers=subscribers,
                )
                for entry in entries
            ]

        try:
            self._run_transfers(f"uploading checkpoint-{step} to {self.spec.url}", start_all)
        finally:
            if bar is not None:
                bar.close()

    def _check_sizes(self, step: int, entries: list[dict[str, Any]]) -> None:
        remote = dict(self._objects(self.key(step)))
        for entry in entries:
            found = remote.get(self.key(step, entry["path"]))
            if found != entry["size"]:
                raise StorageError(
                    f"after upload, {self.key(step, entry['path'])} has {found} bytes in the store, the manifest "
                    f"says {entry['size']}; checkpoint-{step} is not published."
                )

    def _publish(self, step: int, manifest: dict[str, Any]) -> None:
        """Put the manifest once (If-None-Match: *). One already there and equal to ours is our own put whose
        reply was lost and retried: success. A different one means two writers share this prefix."""
        from botocore.exceptions import ClientError

        key = self.key(step, MANIFEST)
        body = json.dumps(manifest, indent=1).encode()
        put = {"Bucket": self.spec.bucket, "Key": key, "Body": body, "ContentType": "application/json"}
        try:
            self.client.put_object(**put, IfNoneMatch="*", ChecksumAlgorithm="SHA256")
            return
        except ClientError as err:
            code = _error_code(err)
            if code == "NotImplemented":  # a store without conditional writes: we checked for a manifest above
                with _explained(self.spec, f"publishing {key}"):
                    self.client.put_object(**put, ChecksumAlgorithm="SHA256")
                return
            if code not in _CONFLICT_CODES:
                raise _as_storage_error(self.spec, f"publishing {key}", err) from err
        except Exception as err:
            raise _as_storage_error(self.spec, f"publishing {key}", err) from err
        if self.manifest(step) != manifest:
            raise StorageError(
                f"{key} was published meanwhile by another writer, with different contents. HINT: give every run "
                "its own storage.prefix; only one job may upload to it at a time."
            )

    # -- download ------------------------------------------------------------------------------------------

    def download(self, step: int, output_dir: Path) -> Path:
        """Fetch remote checkpoint-N into ``output_dir``: into a temp folder, verified (sizes, SHA-256), the
        manifest written last, then renamed to `checkpoint-N`. On any failure nothing is left behind."""
        started = time.monotonic()
        manifest = self.manifest(step)
        if manifest is None:
            raise StorageError(
                f"checkpoint-{step} is not committed in {self.spec.url}; committed: {self.committed_steps()}."
            )
        target = output_dir / f"checkpoint-{step}"
        self._clear_the_way(target)
        output_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=output_dir, prefix=f".{target.name}.download-"))
        try:
            self._fetch(step, manifest["files"], staging)
            self._verify(step, manifest["files"], staging)
            write_json_atomic(staging / MANIFEST, manifest)
            os.rename(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        fsync_dir(output_dir)
        size = sum(e["size"] for e in manifest["files"])
        log.info(summary("downloaded", step, len(manifest["files"]), size, time.monotonic() - started))
        return target

    def _clear_the_way(self, target: Path) -> None:
        """Refuse to replace a committed local checkpoint; set an uncommitted leftover aside, never delete it."""
        if is_committed(target):
            raise StorageError(
                f"{target} is already committed locally; not overwritten. HINT: resume from it, or move it away "
                "to download the remote copy."
            )
        if target.exists() or target.is_symlink():
            aside = target.parent / QUARANTINE / f"{target.name}.before-download-{int(time.time())}"
            aside.parent.mkdir(exist_ok=True)
            os.replace(target, aside)
            log.warning(f"[swiftslurm] moved uncommitted {target.name} to {aside} before downloading it")

    def _fetch(self, step: int, entries: list[dict[str, Any]], staging: Path) -> None:
        paths = [staging / _safe_path(entry["path"]) for entry in entries]
        for path in paths:
            path.parent.mkdir(parents=True, exist_ok=True)
        bar = _progress_bar(f"download checkpoint-{step}", sum(e["size"] for e in entries))
        subscribers = _subscribers(bar)

        def start_all(manager: Any) -> list[Any]:
            return [
                # Ranged, parallel, and retried per range (unlike a plain get_object().read()).
                manager.download(self.spec.bucket, self.key(step, e["path"]), str(p), subscribers=subscribers)
                for e, p in zip(entries, paths, strict=True)
            ]

        try:
            self._run_transfers(f"downloading checkpoint-{step} from {self.spec.url}", start_all)
        finally:
            if bar is not None:
                bar.close()

    def _verify(self, step: int, entries: list[dict[str, Any]], staging: Path) -> None:
        for entry in entries:
            path = staging / entry["path"]
            size = path.stat().st_size
            if size != entry["size"] or sha256_and_fsync(path) != entry["sha256"]:
                what = f"{size} bytes, manifest says {entry['size']}" if size != entry["size"] else "SHA-256 differs"
                raise StorageError(
                    f"{self.key(step, entry['path'])} does not match its remote manifest ({what}): the remote "
                    f"checkpoint-{step} is damaged and was not restored. HINT: resume from an older one "
                    "(`python -m swiftslurm.storage_cli list`), or delete this one from the store."
                )

    # -- retention -----------------------------------------------------------------------------------------

    def prune(self, keep: int) -> list[int]:
        """Delete remote checkpoints older than the newest ``keep`` committed ones (0 keeps all; the newest always
        stays), and uncommitted leftovers older than those. Manifest first: a half-deleted checkpoint is never
        visible as complete. Returns the deleted committed steps."""
        if keep <= 0:
            return []
        folders = self._folders()
        committed = sorted(step for step, keys in folders.items() if self.key(step, MANIFEST) in keys)
        kept = committed[-keep:]
        doomed = committed[:-keep]
        for step in doomed:
            self._delete([self.key(step, MANIFEST)])
            self._delete([key for key in folders[step] if key != self.key(step, MANIFEST)])
        for step in (s for s in folders if s not in committed and kept and s < kept[0]):
            self._delete(folders[step])  # an upload or a prune cut short long ago; never visible
        return doomed

    def _delete(self, keys: list[str]) -> None:
        for start in range(0, len(keys), 1000):  # the most DeleteObjects takes at once
            batch = [{"Key": key} for key in keys[start : start + 1000]]
            with _explained(self.spec, f"deleting from {self.spec.url}"):
                reply = self.client.delete_objects(Bucket=self.spec.bucket, Delete={"Objects": batch, "Quiet": True})
            if errors := reply.get("Errors"):
                raise StorageError(f"deleting from {self.spec.url} failed for {len(errors)} keys, e.g. {errors[0]}")


def newest_remote_step(store: CheckpointStore) -> int | None:
    steps = store.committed_steps()
    return steps[-1] if steps else None


def restore_if_newer(store: CheckpointStore, output_dir: Path, local_step: int) -> Path | None:
    """Download the newest remote checkpoint when it is newer than ``local_step`` (the newest committed local
    one; 0 when there is none). Returns its local path, or None when the node is already up to date."""
    remote = newest_remote_step(store)
    if remote is None or remote <= local_step:
        return None
    log.info(f"[swiftslurm] {store.spec.url} has checkpoint-{remote}, newer than local step {local_step}")
    return store.download(remote, output_dir)


@dataclass
class _Pending:
    checkpoint: Path
    attempts: int = 0
    not_before: float = 0.0  # monotonic time of the next try (back-off after a failure)

    @property
    def step(self) -> int:
        return checkpoint_step(self.checkpoint) or 0


class Uploader:
    """Uploads committed checkpoints in one background thread, one at a time, oldest first; training never waits.

    A failed upload is logged and stays pending for a retry with back-off. After each upload the remote
    retention (`keep`) is applied. `drain` ends it: it waits (bounded) and returns what is still not uploaded.
    The thread is not a daemon, and an interpreter exiting without `drain` drains for `wait_at_exit_s` first."""

    BACKOFF_S = (2.0, 60.0)  # first retry after 2 s, doubling up to 60 s
    DRAIN_BACKOFF_S = 1.0  # while draining, retry at once (botocore has backed off per request already)

    def __init__(self, store: CheckpointStore, keep: int | None = None) -> None:
        self.store = store
        self.keep = store.spec.keep if keep is None else keep
        self._pending: list[_Pending] = []
        self._failures: list[str] = []
        self._draining = False
        self._stopping = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="swiftslurm-uploader")
        self._thread.start()
        self._register_exit_drain()

    def submit(self, checkpoint: Path) -> None:
        """Queue a committed checkpoint for upload; returns at once."""
        with self._changed:
            if self._stopping:
                raise RuntimeError("Uploader.submit after drain: the uploader has stopped")
            if all(p.checkpoint != checkpoint for p in self._pending):
                self._pending.append(_Pending(checkpoint))
            self._changed.notify_all()

    def pending(self) -> list[Path]:
        """Submitted checkpoints not uploaded yet (the one uploading now included), oldest first."""
        with self._changed:
            return [p.checkpoint for p in sorted(self._pending, key=lambda p: p.step)]

    def failures(self) -> list[str]:
        """Every failed attempt so far, as logged."""
        with self._changed:
            return list(self._failures)

    def drain(self, timeout_s: float) -> list[Path]:
        """Wait up to ``timeout_s`` for every submitted checkpoint to be uploaded, then stop (an upload still
        running is cancelled). Returns what is not uploaded, oldest first, for the final report."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            self._draining = True
            for item in self._pending:
                item.not_before = min(item.not_before, time.monotonic())
            self._changed.notify_all()
            while self._pending and (left := deadline - time.monotonic()) > 0:
                self._changed.wait(left)
            self._stopping = True
            self._changed.notify_all()
        self.store.cancel()
        self._thread.join(timeout=self.store.spec.timeout_s + 5)
        if self._thread.is_alive():
            log.warning("[swiftslurm] the uploader is still finishing a request; it stops when that ends")
        return self.pending()

    def _run(self) -> None:
        while (item := self._next_due()) is not None:
            self._attempt(item)

    def _next_due(self) -> _Pending | None:
        """The oldest pending checkpoint whose back-off is over (waiting for one), or None: time to stop."""
        with self._changed:
            while not self._stopping:
                now = time.monotonic()
                due = [p for p in self._pending if p.not_before <= now]
                if due:
                    return min(due, key=lambda p: p.step)
                soonest = min((p.not_before - now for p in self._pending), default=1.0)
                self._changed.wait(timeout=min(max(soonest, 0.05), 1.0))
            return None

    def _register_exit_drain(self) -> None:
        """If the interpreter exits without `drain`, drain first. atexit would be too late: Python's exit first
        stops concurrent.futures' threads (no transfer can start after that) and then joins ours. threading's
        own exit hooks run before both, newest first, so registering after concurrent.futures' puts ours first."""
        import concurrent.futures.thread  # noqa: F401 - registers its exit hook, which must run after ours

        def at_exit() -> None:
            if not self._stopping and (left := self.drain(self.store.spec.wait_at_exit_s)):
                log.warning(f"[swiftslurm] exiting with {len(left)} checkpoint(s) not uploaded: {left}")

        getattr(threading, "_register_atexit")(at_exit)  # noqa: B009 - private, CPython >= 3.9, untyped

    def _attempt(self, item: _Pending) -> None:
        try:
            if not self._outranked(item):
                self.store.upload(item.checkpoint)
        except Exception as err:  # background work: log it, keep the checkpoint pending, carry on
            self._failed(item, err)
            return
        with self._changed:
            self._pending.remove(item)
            self._changed.notify_all()
        self._apply_retention()

    def _outranked(self, item: _Pending) -> bool:
        """Whether `keep` newer checkpoints are already remote, so retention would delete this one at once."""
        if self.keep <= 0:
            return False
        newer = [step for step in self.store.committed_steps() if step > item.step]
        if len(newer) >= self.keep:
            log.info(f"[swiftslurm] not uploading {item.checkpoint.name}: {len(newer)} newer ones are remote")
            return True
        return False

    def _failed(self, item: _Pending, err: Exception) -> None:
        with self._changed:
            item.attempts += 1
            if not is_committed(item.checkpoint):  # deleted locally (retention) meanwhile: nothing left to send
                self._pending.remove(item)
                message = f"{item.checkpoint} is not (or no longer) committed locally; dropped: {err}"
            else:
                first, cap = self.BACKOFF_S
                wait = self.DRAIN_BACKOFF_S if self._draining else min(first * 2 ** (item.attempts - 1), cap)
                item.not_before = time.monotonic() + wait
                message = f"upload of {item.checkpoint.name} failed (attempt {item.attempts}, retry in {wait:.0f} s)"
                message += f": {err}"
            self._failures.append(message)
            self._changed.notify_all()
        log.warning(f"[swiftslurm] {message}")

    def _apply_retention(self) -> None:
        if self.keep <= 0:
            return
        try:
            for step in self.store.prune(self.keep):
                log.info(f"[swiftslurm] pruned remote checkpoint-{step} (keep={self.keep})")
        except Exception as err:  # retention is housekeeping: the next upload tries again
            with self._changed:
                self._failures.append(f"remote retention failed: {err}")
            log.warning(f"[swiftslurm] remote retention failed: {err}")
