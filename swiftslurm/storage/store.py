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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Protocol

from swiftslurm.ckpt.checkpoint import MANIFEST, check_identity, is_committed, problems, read_manifest
from swiftslurm.errors import StorageError
from swiftslurm.plan import StorageSpec
from swiftslurm.rundir.jsonio import fsync_dir, write_json_atomic
from swiftslurm.rundir.layout import DOWNLOAD_STAGING, QUARANTINE
from swiftslurm.storage.fetch import Fetch, FetchOptions, FileMismatch, RemoteFile
from swiftslurm.storage.parallel import Transfer
from swiftslurm.storage.send import LocalFile, Send, SendOptions

log = logging.getLogger("swiftslurm.store")
MiB = 1 << 20
_MANIFEST_KEY = re.compile(r"checkpoint-(\d+)/" + re.escape(MANIFEST))
_FOLDER_KEY = re.compile(r"checkpoint-(\d+)/")
_AUTH_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"}
_EXPIRED_CODES = {"ExpiredToken", "ExpiredTokenException", "TokenRefreshRequired"}
_DIGEST_CODES = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch", "XAmzContentSHA256Mismatch"}
_CONFLICT_CODES = {"PreconditionFailed", "ConditionalRequestConflict"}
_MISSING_CODES = {"NoSuchKey", "404", "NotFound"}
_CREDENTIALS_HINT = (
    "HINT: credentials come only from boto3's standard chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in "
    "the environment, AWS_PROFILE (~/.aws/credentials), or an instance role. Check they are set where this runs "
    "and may read and write the bucket."
)

# Each attempt is a new process whose client reads boto3's chain afresh; but the environment comes first in that
# chain, and SLURM gives a requeued job the environment it was submitted with.
_EXPIRED_HINT = (
    "HINT: temporary credentials exported in the submitting shell (AWS_SESSION_TOKEN) are the same in every "
    "requeued attempt; give the job a source boto3 refreshes instead: AWS_PROFILE with role_arn, "
    "credential_process or sso_session, a credentials file you renew (AWS_SHARED_CREDENTIALS_FILE), or an "
    "instance role, then resubmit."
)


class DamagedCheckpoint(StorageError):
    """A remote checkpoint fails its check: its manifest is malformed, or a file is missing, resized, or differs
    from its SHA-256. A restore falls back to an older one (`restore_if_newer`)."""


class TransferReport(Protocol):
    """Who follows a long transfer (node 0's heartbeat while it restores: swiftslurm.node.heartbeat)."""

    def started(self, what: str, total: int) -> None: ...

    def moved(self, count: int) -> None: ...


@dataclass(frozen=True)
class UploadResult:
    step: int
    files: int  # files sent now
    size: int  # bytes sent now
    seconds: float
    already_remote: bool = False  # the remote manifest existed: nothing was sent


QUICK_ATTEMPTS = 3  # tries of a check someone waits on (CheckpointStore.quick)
QUICK_TIMEOUT_S = 5.0  # connect and read timeout of each


def quick_bound_s() -> float:
    """How long a quick check can take at most, roughly: every try's connect and read timeouts."""
    return QUICK_ATTEMPTS * 2 * QUICK_TIMEOUT_S


def tries(spec: StorageSpec) -> str:
    """How long one request of ``spec`` may be waited on, said before the wait: 'up to 3 tries, 5 s timeouts'."""
    return f"up to {spec.max_attempts} tries, {spec.timeout_s:g} s timeouts"


def checking(spec: StorageSpec) -> str:
    """What a check of the store says before it contacts it, with its bound (the spec of CheckpointStore.quick)."""
    return f"checking {spec.url} ({tries(spec)} each)..."


def make_client(spec: StorageSpec) -> Any:
    """A boto3 S3 client for the spec; its credentials come from boto3's chain, never from the spec."""
    import boto3
    from botocore.config import Config
    from botocore.handlers import add_expect_header

    config = Config(
        region_name=spec.region,
        retries={"max_attempts": spec.max_attempts, "mode": spec.retry_mode},
        # Unsigned payloads: every part already carries a SHA-256 checksum header, which the signature covers and
        # the server verifies. botocore would otherwise hash each body a second time to sign it (over http it
        # always does), a third of the upload's CPU (bench/storage.py; docs/storage.md#benchmark).
        s3={"addressing_style": spec.addressing_style, "payload_signing_enabled": False},
        connect_timeout=spec.timeout_s,
        read_timeout=spec.timeout_s,
        max_pool_connections=spec.max_concurrency + 4,  # transfers, plus listing and manifest calls beside them
    )
    # "Found credentials in environment variables" at INFO on every client: noise in job logs.
    logging.getLogger("botocore.credentials").setLevel(logging.WARNING)
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
    from botocore.exceptions import (
        ClientError,
        ConnectTimeoutError,
        EndpointConnectionError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    if isinstance(err, NoCredentialsError):
        return StorageError(f"{action}: no credentials found. {_CREDENTIALS_HINT}")
    if isinstance(err, EndpointConnectionError):
        return StorageError(f"{action}: cannot reach {spec.url}. HINT: check storage.endpoint_url and the network.")
    if isinstance(err, (ConnectTimeoutError, ReadTimeoutError)):
        return StorageError(
            f"{action}: no answer from {spec.url} ({tries(spec)}). HINT: check storage.endpoint_url and the network "
            "(a firewall that drops packets, or a store that hangs, looks like this)."
        )
    if not isinstance(err, ClientError):
        return StorageError(f"{action} failed ({spec.url}): {err}")
    code = _error_code(err)
    if code == "NoSuchBucket":
        return StorageError(
            f"{action}: bucket `{spec.bucket}` does not exist ({spec.url}). HINT: create it "
            f"(e.g. `aws s3 mb s3://{spec.bucket}`) or fix `storage.bucket`."
        )
    if code in _DIGEST_CODES:
        return StorageError(
            f"{action}: the store refused bytes that differ from their SHA-256 ({code}): a file changed after its "
            "commit, or bytes were damaged on the way. HINT: nothing may write into a committed checkpoint; "
            "damage on the way is retried with the next attempt."
        )
    if code in _EXPIRED_CODES:
        return StorageError(
            f"{action}: the store refused the credentials: they expired ({code}, {spec.url}). {_EXPIRED_HINT}"
        )
    if code in _AUTH_CODES or code == "403":
        return StorageError(f"{action}: the store refused the credentials ({code}, {spec.url}). {_CREDENTIALS_HINT}")
    return StorageError(f"{action} failed ({spec.url}): {code}: {err.response.get('Error', {}).get('Message', err)}")


@contextmanager
def _explained(spec: StorageSpec, action: str) -> Iterator[None]:
    """Raise botocore's errors as StorageError messages that say what to change."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as err:
        raise _as_storage_error(spec, action, err) from err


def _safe_path(path: str) -> PurePosixPath:
    """A manifest path that stays inside its checkpoint (a remote manifest is not trusted blindly)."""
    pure = PurePosixPath(path)
    if not path or pure.is_absolute() or ".." in pure.parts or str(pure) != path:
        raise DamagedCheckpoint(f"the remote manifest lists an unsafe path {path!r}; refusing to download it.")
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


@contextmanager
def _progress(label: str, total: int, report: TransferReport | None = None) -> Iterator[Callable[[int], None] | None]:
    """What a transfer calls with each count of bytes: ``report``'s `moved` when given (it says the progress its
    own way); else a tqdm bar's `update` when someone is watching (stderr is a terminal) and tqdm is installed;
    None when neither."""
    if report is not None:
        report.started(label, total)
        yield report.moved
        return
    if not sys.stderr.isatty():
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        yield None
        return
    bar = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024, leave=False)
    try:
        yield bar.update
    finally:
        bar.close()


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
        self._in_flight: set[Transfer[Any, Any]] = set()

    def __repr__(self) -> str:
        return f"CheckpointStore({self.spec.url})"

    def key(self, step: int, path: str = "") -> str:
        return f"{self.spec.root}checkpoint-{step}/{path}"

    @classmethod
    def quick(cls, spec: StorageSpec) -> CheckpointStore:
        """A store for a check that someone waits on: QUICK_ATTEMPTS tries, QUICK_TIMEOUT_S each, so an
        unreachable endpoint is said within a stated bound instead of after the full retry budget."""
        return cls(replace(spec, max_attempts=QUICK_ATTEMPTS, timeout_s=min(spec.timeout_s, QUICK_TIMEOUT_S)))

    def check_access(self) -> None:
        """Fail now, with the fix, when the bucket is missing or the credentials do not work: before a job is
        submitted rather than after hours in the queue. Lists at most one key: read access is the cheap proof."""
        with _explained(self.spec, f"checking access to {self.spec.url}"):
            self.client.list_objects_v2(Bucket=self.spec.bucket, Prefix=self.spec.root, MaxKeys=1)

    # -- reading -------------------------------------------------------------------------------------------

    def _listing(self, prefix: str) -> Iterator[dict[str, Any]]:
        """ListObjectsV2's entry (Key, Size, ETag, ...) of every object under ``prefix``, page by page."""
        with _explained(self.spec, f"listing {self.spec.url}"):
            pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=self.spec.bucket, Prefix=prefix)
            for page in pages:
                yield from page.get("Contents", [])

    def _objects(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under ``prefix``."""
        return ((item["Key"], item["Size"]) for item in self._listing(prefix))

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
            raise DamagedCheckpoint(f"{self.key(step, MANIFEST)} is not valid JSON: {err}") from err
        if not _well_formed(data, step):
            raise DamagedCheckpoint(f"{self.key(step, MANIFEST)} is not a swiftslurm manifest for step {step}.")
        return data

    # -- transfers -----------------------------------------------------------------------------------------

    def cancel(self) -> None:
        """Cancel the transfers in flight (from another thread); the call running them raises."""
        with self._lock:
            for transfer in self._in_flight:
                transfer.cancel()

    def _run(self, transfer: Transfer[Any, Any], action: str) -> None:
        """Run a send or fetch where `cancel` can reach it; botocore's errors, and any other surprise, are
        raised as StorageError saying what was being done."""
        with self._lock:
            self._in_flight.add(transfer)
        try:
            with _explained(self.spec, action):
                transfer.run()
        except StorageError:
            raise
        except Exception as err:  # e.g. a reply cut mid-headers parses into a KeyError or ValueError, unretried
            raise StorageError(f"{action} failed: {type(err).__name__}: {err}") from err
        finally:
            with self._lock:
                self._in_flight.discard(transfer)

    # -- upload --------------------------------------------------------------------------------------------

    def upload(self, local_checkpoint: Path, report: TransferReport | None = None) -> UploadResult:
        """Publish a committed local checkpoint: its files (checksummed by the server), their sizes checked,
        then the manifest. Idempotent: a checkpoint whose remote manifest exists is left alone. ``report``
        follows the sending of the files (the bytes of those not sent already)."""
        started = time.monotonic()
        manifest = self._local_manifest(local_checkpoint)
        step = manifest["step"]
        if self.manifest(step) is not None:
            log.info(f"[swiftslurm] checkpoint-{step} is already in {self.spec.url}")
            return UploadResult(step, 0, 0, time.monotonic() - started, already_remote=True)
        remote_sizes = dict(self._objects(self.key(step)))
        todo = [e for e in manifest["files"] if not self._already_sent(step, e, remote_sizes)]
        self._send(local_checkpoint, step, todo, report)
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

    def _send(
        self, checkpoint: Path, step: int, entries: list[dict[str, Any]], report: TransferReport | None = None
    ) -> None:
        """The files, in parallel parts (swiftslurm.storage.send), each request checked by the server (SHA-256)."""
        files = [
            LocalFile(checkpoint / entry["path"], self.key(step, entry["path"]), entry["size"], entry["sha256"])
            for entry in entries
        ]
        options = SendOptions(part_size=self.spec.part_size_mb * MiB, max_concurrency=self.spec.max_concurrency)
        label = f"uploading checkpoint-{step} to {self.spec.url}"
        with _progress(label, sum(e["size"] for e in entries), report) as progress:
            self._run(Send(self.client, self.spec.bucket, files, options, progress), label)

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

    def download(self, step: int, output_dir: Path, report: TransferReport | None = None) -> Path:
        """Fetch remote checkpoint-N into ``output_dir``: into a temp folder, verified (sizes, SHA-256), the
        manifest written last, then renamed to `checkpoint-N`. On any failure nothing is left behind; a killed
        process leaves its temp folder, which `remove_stale_downloads` deletes before the next restore."""
        started = time.monotonic()
        manifest = self.manifest(step)
        if manifest is None:
            raise StorageError(
                f"checkpoint-{step} is not committed in {self.spec.url}; committed: {self.committed_steps()}."
            )
        target = output_dir / f"checkpoint-{step}"
        self._clear_the_way(target)
        output_dir.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=output_dir, prefix=DOWNLOAD_STAGING.format(checkpoint=target.name)))
        try:
            self._fetch(step, manifest["files"], staging, report)
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
        """Refuse to replace a committed local checkpoint that verifies; set anything else there aside, never
        delete it: an uncommitted leftover, or a committed one whose files no longer match its manifest (a
        scratch purge removed or cut some)."""
        committed = is_committed(target)
        issues = problems(target) if committed else []
        if committed and not issues:
            raise StorageError(
                f"{target} is already committed locally; not overwritten. HINT: resume from it, or move it away "
                "to download the remote copy."
            )
        if target.exists() or target.is_symlink():
            aside = target.parent / QUARANTINE / f"{target.name}.before-download-{int(time.time())}"
            aside.parent.mkdir(exist_ok=True)
            os.replace(target, aside)
            what = f"damaged {target.name} ({'; '.join(issues)})" if issues else f"uncommitted {target.name}"
            log.warning(f"[swiftslurm] moved {what} to {aside} before downloading it")

    def _fetch(
        self, step: int, entries: list[dict[str, Any]], staging: Path, report: TransferReport | None = None
    ) -> None:
        """Download the manifest's files into ``staging`` (swiftslurm.storage.fetch: ranged, parallel, retried),
        each verified (size, SHA-256) and fsynced, and the folders with them. Raises on the first failure."""
        paths = [staging / _safe_path(entry["path"]) for entry in entries]
        listed = self._listed_as_manifest_says(step, entries)
        for folder in {path.parent for path in paths}:
            folder.mkdir(parents=True, exist_ok=True)
        files = [
            RemoteFile(item["Key"], path, entry["size"], entry["sha256"], item.get("ETag"))
            for entry, path, item in zip(entries, paths, listed, strict=True)
        ]
        label = f"downloading checkpoint-{step} from {self.spec.url}"
        with _progress(label, sum(e["size"] for e in entries), report) as progress:
            fetch = Fetch(self.client, self.spec.bucket, files, self._fetch_options(), progress)
            try:
                self._run(fetch, label)
            except FileMismatch as err:
                raise self._damaged(step, entries[err.index], err.what) from err
        for below, _, _ in os.walk(staging):
            if below != str(staging):  # staging itself is fsynced with the manifest, just after
                fsync_dir(Path(below))  # the files' names must be as durable as their bytes

    def _fetch_options(self) -> FetchOptions:
        """Ranges of fetch's own size, not `part_size_mb` (see FetchOptions.part_size)."""
        return FetchOptions(max_concurrency=self.spec.max_concurrency, max_attempts=self.spec.max_attempts)

    def _listed_as_manifest_says(self, step: int, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The listing's entry (Size, ETag) of each manifest file, in the manifest's order. One listing instead of
        a HEAD per file; a missing or resized file fails the restore before anything is downloaded."""
        listed = {item["Key"]: item for item in self._listing(self.key(step))}
        found = []
        for entry in entries:
            item = listed.get(self.key(step, entry["path"]))
            if item is None or item["Size"] != entry["size"]:
                raise self._damaged(
                    step, entry, "missing" if item is None else f"{item['Size']} bytes, manifest says {entry['size']}"
                )
            found.append(item)
        return found

    def _damaged(self, step: int, entry: dict[str, Any], what: str) -> DamagedCheckpoint:
        return DamagedCheckpoint(
            f"{self.key(step, entry['path'])} does not match its remote manifest ({what}): the remote "
            f"checkpoint-{step} is damaged and was not restored. HINT: resume from an older one "
            "(`python -m swiftslurm.ops.storage_cli list`), or delete this one from the store."
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


def remove_stale_downloads(output_dir: Path) -> list[Path]:
    """Delete the temp folders of downloads whose process was killed (a download that fails removes its own).
    Call only where no download can be running: node 0 before its restore (one leader restores at a time)."""
    stale = sorted(output_dir.glob(DOWNLOAD_STAGING.format(checkpoint="checkpoint-*") + "*"))
    for folder in stale:
        log.warning(f"[swiftslurm] removing {folder}: a download cut short by a killed attempt")
        shutil.rmtree(folder, ignore_errors=True)
    return stale


def restore_if_newer(
    store: CheckpointStore,
    output_dir: Path,
    local_step: int,
    report: TransferReport | None = None,
    identity: str | None = None,
) -> Path | None:
    """Download the newest remote checkpoint newer than ``local_step`` (the newest committed local one; 0 when
    there is none) that passes its check: one that fails it (DamagedCheckpoint) is logged and the next older
    one tried. Returns its local path, or None when no remote one is newer and whole. One committed by
    another plan than ``identity`` is refused before anything is downloaded."""
    for remote in reversed(store.committed_steps()):
        if remote <= local_step:
            break
        try:
            check_identity(store.manifest(remote), identity, store.key(remote))
            log.info(f"[swiftslurm] {store.spec.url} has checkpoint-{remote}, newer than local step {local_step}")
            return store.download(remote, output_dir, report)
        except DamagedCheckpoint as err:
            log.warning(f"[swiftslurm] not restoring checkpoint-{remote}: {err} Trying an older one.")
    return None
