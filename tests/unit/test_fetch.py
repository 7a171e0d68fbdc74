"""swiftslurm.storage.fetch (ranged, parallel, verified downloads) against an in-memory stand-in for the S3 client.

The stand-in serves ranged GETs and breaks bodies on request, which a real server cannot be made to do on cue;
tests/component/test_store.py and tests/cluster/test_storage.py run the same code against SeaweedFS.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import threading
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, ResponseStreamingError

from swiftslurm.ckpt.checkpoint import MANIFEST
from swiftslurm.errors import StorageError
from swiftslurm.plan import StorageSpec
from swiftslurm.storage import fetch
from swiftslurm.storage.fetch import Cancelled, Fetch, FetchOptions, FileMismatch, Part, RemoteFile, split_ranges
from swiftslurm.storage.store import CheckpointStore, restore_if_newer

BUCKET = "b"


class Body:
    """A response body that raises after ``break_after`` bytes (None: never), as a reset connection does."""

    def __init__(self, data: bytes, break_after: int | None = None) -> None:
        self.data = data
        self.at = 0
        self.break_after = break_after
        self.closed = False

    def read(self, amt: int | None = None) -> bytes:
        end = len(self.data) if amt is None else min(len(self.data), self.at + amt)
        if self.break_after is not None and end > self.break_after:
            if self.at >= self.break_after:
                raise ResponseStreamingError(error="Connection reset by peer")
            end = self.break_after  # hand out what came before the reset, then fail on the next read
        chunk = self.data[self.at : end]
        self.at = end
        return chunk

    def close(self) -> None:
        self.closed = True


class FakeS3:
    """get_object (with Range and IfMatch), list_objects_v2 pages: what CheckpointStore's download uses.
    ``breaks[(key, range)]``: after how many bytes the next GETs of that range break, one entry per GET."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.breaks: dict[tuple[str, str], list[int]] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.bodies: list[Body] = []
        self._lock = threading.Lock()

    def get_object(self, Bucket: str, Key: str, Range: str | None = None, IfMatch: str | None = None) -> Any:
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": Key}}, "GetObject")
        if IfMatch is not None and IfMatch != etag(self.objects[Key]):
            raise ClientError({"Error": {"Code": "PreconditionFailed", "Message": Key}}, "GetObject")
        data = self.objects[Key]
        if Range is not None:
            first, _, last = Range.removeprefix("bytes=").partition("-")
            data = data[int(first) : int(last) + 1]
        with self._lock:
            self.requests.append((Key, Range))
            pending = self.breaks.get((Key, str(Range)), [])
            body = Body(data, pending.pop(0) if pending else None)
            self.bodies.append(body)
        return {"Body": body}

    def get_paginator(self, name: str) -> Any:
        objects = self.objects

        class Pages:
            def paginate(self, Bucket: str, Prefix: str) -> list[dict[str, Any]]:
                found = [(k, v) for k, v in sorted(objects.items()) if k.startswith(Prefix)]
                return [{"Contents": [{"Key": k, "Size": len(v), "ETag": etag(v)} for k, v in found]}]

        return Pages()


def etag(data: bytes) -> str:
    return '"' + hashlib.md5(data).hexdigest() + '"'


@pytest.fixture(autouse=True)
def _no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fetch, "backoff_s", lambda attempt: 0.0)


def remote_files(objects: dict[str, bytes], folder: Path) -> list[RemoteFile]:
    return [
        RemoteFile(key, folder / key.replace("/", "_"), len(data), hashlib.sha256(data).hexdigest(), etag(data))
        for key, data in objects.items()
    ]


def some_objects(seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    return {"big": rng.randbytes(10_000), "odd": rng.randbytes(3_001), "tiny": rng.randbytes(7), "empty": b""}


PARTS_AFTER_THE_FIRST = ["bytes=1000-1999", "bytes=2000-2999", "bytes=3000-3000"]
OPTIONS = FetchOptions(part_size=1_000, max_concurrency=4, max_attempts=3)


@pytest.mark.parametrize(
    ("sizes", "part_size", "expected"),
    [
        ([0], 8, []),
        ([5], 8, [Part(0, 0, 5)]),
        ([16], 8, [Part(0, 0, 8), Part(0, 8, 8)]),
        ([17, 0, 3], 8, [Part(0, 0, 8), Part(0, 8, 8), Part(0, 16, 1), Part(2, 0, 3)]),
    ],
)
def test_split_ranges_cuts_files_in_order_and_skips_empty_ones(
    sizes: list[int], part_size: int, expected: list[Part]
) -> None:
    assert split_ranges(sizes, part_size) == expected


def test_a_part_asks_for_an_inclusive_byte_range() -> None:
    assert Part(0, 8, 8).http_range == "bytes=8-15"


def test_fetch_writes_every_file_whole_with_one_ranged_get_per_part(tmp_path: Path) -> None:
    objects = some_objects()
    s3 = FakeS3(objects)
    files = remote_files(objects, tmp_path)
    Fetch(s3, BUCKET, files, OPTIONS).run()
    assert [f.path.read_bytes() for f in files] == list(objects.values())
    odd = sorted(r for k, r in s3.requests if k == "odd")
    assert odd == ["bytes=0-999", "bytes=1000-1999", "bytes=2000-2999", "bytes=3000-3000"]
    assert len(s3.requests) == 10 + 4 + 1  # nothing asked for the empty file


def test_files_that_cannot_be_mapped_are_hashed_by_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise OSError("mmap not supported here")

    monkeypatch.setattr(fetch.mmap, "mmap", refuse)
    objects = some_objects()
    files = remote_files(objects, tmp_path)
    Fetch(FakeS3(objects), BUCKET, files, OPTIONS).run()
    assert [f.path.read_bytes() for f in files] == list(objects.values())


def test_a_received_piece_is_written_in_write_size_pieces_at_its_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Large single writes get large page-cache folios, which cost several times the kernel CPU here (WRITE_SIZE)."""
    sizes: list[int] = []
    real_pwrite = os.pwrite

    def recording_pwrite(fd: int, data: Any, offset: int) -> int:
        sizes.append(len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(fetch.os, "pwrite", recording_pwrite)
    data = os.urandom(fetch.READ_SIZE + 5)
    path = tmp_path / "f"
    path.write_bytes(b"x" * 7)
    fd = os.open(path, os.O_RDWR)
    try:
        fetch._write_at(fd, data, 7)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"x" * 7 + data
    assert max(sizes) == fetch.WRITE_SIZE and sum(sizes) == len(data)


def test_a_checkpoint_of_more_files_than_descriptors_is_fetched(tmp_path: Path) -> None:
    """Files are opened when their first part arrives and closed once fsynced, not all at once."""
    objects = {f"shard_{i:04d}": random.Random(i).randbytes(50) for i in range(600)}
    files = remote_files(objects, tmp_path)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 100, hard))
    try:
        Fetch(FakeS3(objects), BUCKET, files, OPTIONS).run()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert [f.path.read_bytes() for f in files] == list(objects.values())


def test_a_body_broken_midway_is_asked_again_from_where_it_stopped(tmp_path: Path) -> None:
    objects = some_objects()
    s3 = FakeS3(objects)
    s3.breaks[("tiny", "bytes=0-6")] = [3]
    s3.breaks[("odd", "bytes=0-999")] = [300]  # the first part breaks twice: at byte 300,
    s3.breaks[("odd", "bytes=300-999")] = [10]  # then 10 bytes into the retry
    files = remote_files(objects, tmp_path)
    Fetch(s3, BUCKET, files, OPTIONS).run()
    assert [f.path.read_bytes() for f in files] == list(objects.values())
    assert [r for k, r in s3.requests if k == "tiny"] == ["bytes=0-6", "bytes=3-6"]
    odd = [r for k, r in s3.requests if k == "odd"]
    assert sorted(odd) == sorted(["bytes=0-999", "bytes=300-999", "bytes=310-999", *PARTS_AFTER_THE_FIRST])
    assert all(body.closed for body in s3.bodies if body.break_after is not None)  # no half-read connection reused


def test_a_part_that_keeps_breaking_fails_after_max_attempts_naming_the_fix(tmp_path: Path) -> None:
    objects = {"big": random.Random(1).randbytes(5_000)}
    s3 = FakeS3(objects)
    s3.breaks[("big", "bytes=0-999")] = [100]
    s3.breaks[("big", "bytes=100-999")] = [0, 0]  # then not a byte more, twice
    with pytest.raises(StorageError, match=r"big \(bytes 0-999\) failed 3 times.*HINT: .*storage.max_attempts"):
        Fetch(s3, BUCKET, remote_files(objects, tmp_path), OPTIONS).run()


def test_a_refused_request_is_not_asked_again(tmp_path: Path) -> None:
    objects = {"x": b"new bytes"}
    files = [RemoteFile("x", tmp_path / "x", 9, hashlib.sha256(b"new bytes").hexdigest(), '"an older etag"')]
    s3 = FakeS3(objects)
    with pytest.raises(ClientError, match="PreconditionFailed"):
        Fetch(s3, BUCKET, files, OPTIONS).run()
    assert len(s3.requests) == 0  # the stand-in refuses before it records, as a 412 carries no body


@pytest.mark.parametrize(
    ("which", "sha256", "what"),
    [("odd", "0" * 64, "SHA-256 differs"), ("empty", "1" * 64, "SHA-256 differs")],
)
def test_bytes_that_differ_from_the_manifest_name_the_file(tmp_path: Path, which: str, sha256: str, what: str) -> None:
    objects = some_objects()
    files = [
        f if f.key != which else RemoteFile(f.key, f.path, f.size, sha256, f.etag)
        for f in remote_files(objects, tmp_path)
    ]
    with pytest.raises(FileMismatch) as caught:
        Fetch(FakeS3(objects), BUCKET, files, OPTIONS).run()
    assert (caught.value.index, caught.value.what) == (list(objects).index(which), what)


def test_cancel_stops_the_download(tmp_path: Path) -> None:
    objects = {"big": random.Random(2).randbytes(50_000)}
    files = remote_files(objects, tmp_path)
    running: list[Fetch] = []
    running.append(Fetch(FakeS3(objects), BUCKET, files, OPTIONS, progress=lambda n: running[0].cancel()))
    with pytest.raises(Cancelled):
        running[0].run()


def test_a_damaged_remote_file_leaves_nothing_in_place(tmp_path: Path) -> None:
    """Through CheckpointStore.download: the mismatch is reported with the fix, and no folder is left behind."""
    rng = random.Random(3)
    payload = {"model.safetensors": rng.randbytes(5_000), "sub/state.json": rng.randbytes(100)}
    entries = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in payload.items()]
    manifest = {"format": 1, "step": 7, "files": entries}
    objects = {f"run/checkpoint-7/{p}": d for p, d in payload.items()}
    objects["run/checkpoint-7/sub/state.json"] = bytes(100)  # same size, other bytes
    objects[f"run/checkpoint-7/{MANIFEST}"] = json.dumps(manifest).encode()
    store = CheckpointStore(StorageSpec(bucket=BUCKET, prefix="run", part_size_mb=5), client=FakeS3(objects))
    with pytest.raises(StorageError, match=r"sub/state\.json does not match its remote manifest \(SHA-256 differs\)"):
        store.download(7, tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []


def test_a_restore_through_the_store_is_whole_and_committed(tmp_path: Path) -> None:
    rng = random.Random(4)
    payload = {"model.safetensors": rng.randbytes(12 << 20), "a/b/state.json": rng.randbytes(100), "empty": b""}
    entries = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in payload.items()]
    objects = {f"run/checkpoint-7/{p}": d for p, d in payload.items()}
    objects[f"run/checkpoint-7/{MANIFEST}"] = json.dumps({"format": 1, "step": 7, "files": entries}).encode()
    s3 = FakeS3(objects)
    restored = CheckpointStore(StorageSpec(bucket=BUCKET, prefix="run", part_size_mb=5), client=s3).download(
        7, tmp_path
    )
    assert {p: (restored / p).read_bytes() for p in payload} == payload
    assert (restored / MANIFEST).is_file()
    # Downloads use fetch's own ranges (64 MiB), not the 5 MiB upload parts the spec asks for.
    assert [r for k, r in s3.requests if k.endswith("model.safetensors")] == [f"bytes=0-{(12 << 20) - 1}"]


# --- issue 25, item 9: a restore falls back past a remote checkpoint that fails its check ----------------------


def remote_checkpoint(step: int, payload: dict[str, bytes]) -> dict[str, bytes]:
    entries = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in payload.items()]
    objects = {f"run/checkpoint-{step}/{p}": d for p, d in payload.items()}
    objects[f"run/checkpoint-{step}/{MANIFEST}"] = json.dumps({"format": 1, "step": step, "files": entries}).encode()
    return objects


def test_restore_falls_back_to_an_older_remote_checkpoint_when_the_newest_fails_its_check(tmp_path: Path) -> None:
    objects = {
        **remote_checkpoint(7, {"model.safetensors": b"seven"}),
        **remote_checkpoint(9, {"model.safetensors": b"nine!"}),
    }
    objects["run/checkpoint-9/model.safetensors"] = b"NINE!"  # same size, other bytes
    store = CheckpointStore(StorageSpec(bucket=BUCKET, prefix="run"), client=FakeS3(objects))
    assert restore_if_newer(store, tmp_path / "out", local_step=0) == tmp_path / "out" / "checkpoint-7"
    assert (tmp_path / "out" / "checkpoint-7" / "model.safetensors").read_bytes() == b"seven"
    assert not (tmp_path / "out" / "checkpoint-9").exists()
    assert restore_if_newer(store, tmp_path / "elsewhere", local_step=7) is None  # nothing newer is whole


class RefusingS3(FakeS3):
    def get_object(self, Bucket: str, Key: str, Range: str | None = None, IfMatch: str | None = None) -> Any:
        if Key.endswith("model.safetensors"):
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": Key}}, "GetObject")
        return super().get_object(Bucket, Key, Range, IfMatch)


def test_restore_does_not_fall_back_when_the_store_refuses_to_answer(tmp_path: Path) -> None:
    """Only a checkpoint that fails its check is passed over: an older one would throw away remote progress
    that the next attempt may well restore."""
    objects = {
        **remote_checkpoint(7, {"model.safetensors": b"seven"}),
        **remote_checkpoint(9, {"model.safetensors": b"nine!"}),
    }
    store = CheckpointStore(StorageSpec(bucket=BUCKET, prefix="run", max_attempts=1), client=RefusingS3(objects))
    with pytest.raises(StorageError, match="AccessDenied"):
        restore_if_newer(store, tmp_path / "out", local_step=0)
    assert not (tmp_path / "out" / "checkpoint-7").exists()
