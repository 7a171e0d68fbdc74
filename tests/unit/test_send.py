"""swiftslurm.storage.send, the upload's parallel part sender, against an in-memory client that fails on cue."""

from __future__ import annotations

import base64
import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.errors import StorageError
from swiftslurm.storage import send
from swiftslurm.storage.parallel import Cancelled
from swiftslurm.storage.send import ChangedSinceCommit, LocalFile, Send, SendOptions, pieces

BUCKET = "b"


class FakeS3:
    """PutObject and multipart uploads into a dict; `fail_part` makes that part number's upload raise."""

    def __init__(self, fail_part: int | None = None) -> None:
        self.objects: dict[str, bytes] = {}
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.uploads: dict[str, dict[int, bytes]] = {}
        self.aborted: list[str] = []
        self.fail_part = fail_part
        self._lock = threading.Lock()

    def _record(self, name: str, kwargs: dict[str, Any]) -> None:
        with self._lock:
            self.calls.append((name, {k: v for k, v in kwargs.items() if k != "Body"}))

    def put_object(self, **kwargs: Any) -> dict[str, Any]:
        self._record("put_object", kwargs)
        self.objects[kwargs["Key"]] = bytes(kwargs["Body"])  # a server keeps a copy; the sender reuses buffers
        return {}

    def create_multipart_upload(self, **kwargs: Any) -> dict[str, Any]:
        self._record("create_multipart_upload", kwargs)
        upload_id = f"id-{kwargs['Key']}"
        self.uploads[upload_id] = {}
        return {"UploadId": upload_id}

    def upload_part(self, **kwargs: Any) -> dict[str, Any]:
        self._record("upload_part", kwargs)
        if kwargs["PartNumber"] == self.fail_part:
            raise ConnectionError("reset by peer, every attempt")
        self.uploads[kwargs["UploadId"]][kwargs["PartNumber"]] = bytes(kwargs["Body"])
        return {"ETag": f'"{kwargs["PartNumber"]}"'}

    def complete_multipart_upload(self, **kwargs: Any) -> dict[str, Any]:
        self._record("complete_multipart_upload", kwargs)
        parts = self.uploads.pop(kwargs["UploadId"])
        self.objects[kwargs["Key"]] = b"".join(parts[p["PartNumber"]] for p in kwargs["MultipartUpload"]["Parts"])
        return {}

    def abort_multipart_upload(self, **kwargs: Any) -> dict[str, Any]:
        self._record("abort_multipart_upload", kwargs)
        self.aborted.append(kwargs["UploadId"])
        return {}

    def called(self, name: str) -> list[dict[str, Any]]:
        return [kwargs for called, kwargs in self.calls if called == name]


def b64_sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def local_file(folder: Path, name: str, data: bytes) -> LocalFile:
    path = folder / name
    path.write_bytes(data)
    return LocalFile(path, f"run/{name}", len(data), hashlib.sha256(data).hexdigest())


def test_small_files_are_one_put_and_large_ones_parts_of_part_size(tmp_path: Path) -> None:
    files = [
        local_file(tmp_path, "empty", b""),
        local_file(tmp_path, "small", b"x" * 100),
        local_file(tmp_path, "large", b"y" * 250),
    ]
    found = [(p.file.key, p.start, p.length, p.number) for p in pieces(files, part_size=100)]
    assert found == [
        ("run/empty", 0, 0, 0),
        ("run/small", 0, 100, 0),
        ("run/large", 0, 100, 1),
        ("run/large", 100, 100, 2),
        ("run/large", 200, 50, 3),
    ]


def test_every_file_arrives_whole_with_checksums_the_server_can_check(tmp_path: Path) -> None:
    small, large = b"small bytes", bytes(range(256)) * 40
    files = [local_file(tmp_path, "small", small), local_file(tmp_path, "large", large)]
    s3, sent = FakeS3(), list[int]()
    Send(s3, BUCKET, files, SendOptions(part_size=1000, max_concurrency=4), sent.append).run()
    assert s3.objects == {"run/small": small, "run/large": large}
    assert sum(sent) == len(small) + len(large)
    [put] = s3.called("put_object")
    assert put["ChecksumSHA256"] == b64_sha256(small)  # the manifest's SHA-256, not hashed again
    assert put["Metadata"] == {"sha256": hashlib.sha256(small).hexdigest()}
    [create] = s3.called("create_multipart_upload")
    assert create["ChecksumAlgorithm"] == "SHA256"
    assert create["Metadata"] == {"sha256": hashlib.sha256(large).hexdigest()}
    [complete] = s3.called("complete_multipart_upload")
    parts = complete["MultipartUpload"]["Parts"]
    assert [p["PartNumber"] for p in parts] == list(range(1, 12))
    assert [p["ChecksumSHA256"] for p in parts] == [b64_sha256(large[i : i + 1000]) for i in range(0, len(large), 1000)]


def test_a_failed_part_fails_the_upload_and_aborts_the_multipart_upload(tmp_path: Path) -> None:
    files = [local_file(tmp_path, "large", b"z" * 5000)]
    s3 = FakeS3(fail_part=3)
    with pytest.raises(ConnectionError, match="reset"):
        Send(s3, BUCKET, files, SendOptions(part_size=1000, max_concurrency=2)).run()
    assert s3.aborted == ["id-run/large"]
    assert "run/large" not in s3.objects
    assert not s3.called("complete_multipart_upload")


def test_a_file_shorter_than_its_manifest_says_is_not_sent(tmp_path: Path) -> None:
    file = local_file(tmp_path, "shrunk", b"x" * 100)
    file.path.write_bytes(b"x" * 10)  # truncated after its commit
    s3 = FakeS3()
    with pytest.raises(StorageError, match="changed after it was committed"):
        Send(s3, BUCKET, [file], SendOptions(part_size=1000)).run()
    assert s3.objects == {}


def test_cancel_stops_before_the_next_request(tmp_path: Path) -> None:
    files = [local_file(tmp_path, f"f{i}", b"x") for i in range(5)]
    s3 = FakeS3()
    send = Send(s3, BUCKET, files, SendOptions(part_size=1000, max_concurrency=1))
    send.cancel()
    with pytest.raises(Cancelled):
        send.run()
    assert s3.objects == {}


# --- issue 25, item 9: a file changed after its commit --------------------------------------------------------


def test_a_multipart_file_changed_after_its_commit_is_not_completed(tmp_path: Path) -> None:
    file = local_file(tmp_path, "large", b"a" * 2500)
    file.path.write_bytes(b"b" * 2500)  # same size, other bytes: each part's own checksum still matches it
    s3 = FakeS3()
    with pytest.raises(ChangedSinceCommit, match="changed after it was committed"):
        Send(s3, BUCKET, [file], SendOptions(part_size=1000, max_concurrency=2)).run()
    assert not s3.called("complete_multipart_upload") and s3.aborted == ["id-run/large"]
    assert s3.objects == {}  # never stored under the manifest's SHA-256, which a later retry would trust


class RewritingS3(FakeS3):
    """Rewrites the file's last bytes (same size) once part 1 is in: the file changes during its upload."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def upload_part(self, **kwargs: Any) -> dict[str, Any]:
        reply = super().upload_part(**kwargs)
        if kwargs["PartNumber"] == 1:
            with open(self.path, "r+b") as f:
                f.seek(2000)
                f.write(b"c" * 500)
        return reply


def test_a_file_changed_between_its_parts_is_not_completed(tmp_path: Path) -> None:
    file = local_file(tmp_path, "large", b"a" * 2500)
    s3 = RewritingS3(file.path)
    with pytest.raises(ChangedSinceCommit, match=f"SHA-256 {hashlib.sha256(b'a' * 2000 + b'c' * 500).hexdigest()}"):
        Send(s3, BUCKET, [file], SendOptions(part_size=1000, max_concurrency=1)).run()
    assert len(s3.called("upload_part")) == 3 and not s3.called("complete_multipart_upload")
    assert s3.objects == {}


class CheckingS3(FakeS3):
    """PutObject as the server does it: a body whose SHA-256 is not the request's checksum is refused."""

    def put_object(self, **kwargs: Any) -> dict[str, Any]:
        if b64_sha256(bytes(kwargs["Body"])) != kwargs["ChecksumSHA256"]:
            raise RuntimeError("BadDigest")
        return super().put_object(**kwargs)


def test_a_one_part_file_the_server_refuses_is_named_changed_when_its_bytes_differ(tmp_path: Path) -> None:
    file = local_file(tmp_path, "small", b"x" * 100)
    file.path.write_bytes(b"y" * 100)
    with pytest.raises(ChangedSinceCommit, match="has other bytes than its manifest's SHA-256") as caught:
        Send(CheckingS3(), BUCKET, [file], SendOptions(part_size=1000)).run()
    assert str(caught.value.__cause__) == "BadDigest"


def test_a_worker_waiting_to_fold_its_part_stops_when_an_earlier_part_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts are folded into the file's SHA-256 in byte order: part 2 waits for part 1, whose read fails."""
    file = local_file(tmp_path, "large", b"a" * 3000)
    part_2_read = threading.Event()
    real_read = send._PartReader.read

    def read(reader: Any, what: LocalFile, start: int, length: int) -> Any:
        if start == 0:
            part_2_read.wait(timeout=10)
            raise OSError("part 1 unreadable")
        body = real_read(reader, what, start, length)
        part_2_read.set()
        return body

    monkeypatch.setattr(send._PartReader, "read", read)
    failures: list[BaseException] = []

    def upload() -> None:
        try:
            Send(FakeS3(), BUCKET, [file], SendOptions(part_size=1000, max_concurrency=2)).run()
        except BaseException as err:
            failures.append(err)

    worker = threading.Thread(target=upload, daemon=True)  # a daemon: were part 2 to wait forever, the suite ends
    worker.start()
    worker.join(timeout=20)
    assert not worker.is_alive(), "part 2 waits forever for part 1, which failed"
    assert [str(err) for err in failures] == ["part 1 unreadable"]
