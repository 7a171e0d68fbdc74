"""Local retention with object storage, and what a killed restore leaves, against a real S3 endpoint (SeaweedFS).

Uploads slower than saves are made so by construction (a store whose uploads wait for the test to open a
gate), never by the machine's speed.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import checkpoint_dirs, is_committed
from swiftslurm.node.watch import trainer_keep
from swiftslurm.plan import StorageSpec
from swiftslurm.rundir.layout import DOWNLOAD_STAGING
from swiftslurm.storage.store import CheckpointStore, UploadResult
from swiftslurm.storage.sync import NodeSync, restore
from swiftslurm.testing.s3 import SeaweedServer
from tests.component.test_store import make_checkpoint, spec_for
from tests.conftest import plan_for

BUCKET = "swiftslurm-unit"


pytestmark = pytest.mark.usefixtures("s3_credentials")


@pytest.fixture
def spec(s3_server: SeaweedServer, request: pytest.FixtureRequest) -> StorageSpec:
    return spec_for(s3_server.endpoint_url, f"runs/{request.node.name}")


class GatedStore(CheckpointStore):
    """A real store whose uploads start only once ``gate`` is open; ``uploading`` is set when one waits."""

    def __init__(self, spec: StorageSpec) -> None:
        super().__init__(spec)
        self.gate = threading.Event()
        self.uploading = threading.Event()
        self.started: list[str] = []

    def upload(self, local_checkpoint: Path) -> UploadResult:
        self.started.append(local_checkpoint.name)
        self.uploading.set()
        assert self.gate.wait(60), "the test never opened the gate"
        return super().upload(local_checkpoint)


def committed_steps(output: Path) -> list[int]:
    return [step for step, path in checkpoint_dirs(output) if is_committed(path)]


@pytest.mark.parametrize("remote_keep", [0, 1])
def test_the_newest_commit_reaches_the_store_and_nothing_pending_is_pruned(
    spec: StorageSpec, tmp_path: Path, remote_keep: int
) -> None:
    store = GatedStore(StorageSpec(**{**spec.__dict__, "keep": remote_keep}))
    output = tmp_path / "output"
    sync = NodeSync(store.spec, tmp_path, output, store=store, keep_local=1)
    make_checkpoint(output, 10)
    sync.poll(now=0.0)
    assert store.uploading.wait(30)  # checkpoint-10's upload has begun, and waits
    make_checkpoint(output, 20)
    make_checkpoint(output, 30)  # saves outpace the upload
    sync.poll(now=10.0)
    assert committed_steps(output) == [10, 20, 30]  # keep_checkpoints=1, but all three wait for their upload

    store.gate.set()
    assert sync.drain(timeout_s=60) == []
    assert store.started[:2] == ["checkpoint-10", "checkpoint-30"]  # then the newest, not the next oldest
    assert store.committed_steps() == ([30] if remote_keep == 1 else [10, 20, 30])
    assert committed_steps(output) == [30]  # everything older is in the store (or superseded there)


def test_with_storage_the_trainer_leaves_retention_to_the_wrapper() -> None:
    local = plan_for("run_dir=/scratch/run", "keep_checkpoints=2")
    synced = plan_for("run_dir=/scratch/run", "keep_checkpoints=2", "storage=s3", "storage.bucket=ckpt")
    assert (trainer_keep(local), trainer_keep(synced)) == (2, 0)


class Bytes:
    """A TransferReport: what node 0's heartbeat is told during a restore."""

    def __init__(self) -> None:
        self.what: list[tuple[str, int]] = []
        self.moved_bytes = 0
        self._lock = threading.Lock()

    def started(self, what: str, total: int) -> None:
        self.what.append((what, total))

    def moved(self, count: int) -> None:
        with self._lock:
            self.moved_bytes += count


def test_restore_removes_what_a_killed_restore_left_and_reports_its_bytes(spec: StorageSpec, tmp_path: Path) -> None:
    uploaded = make_checkpoint(tmp_path / "cluster-a", 40, big_mib=3)
    CheckpointStore(spec).upload(uploaded)
    output = tmp_path / "cluster-b"
    stale = output / (DOWNLOAD_STAGING.format(checkpoint="checkpoint-40") + "k1ll3d")
    (stale / "global_step").mkdir(parents=True)
    (stale / "global_step" / "partial.pt").write_bytes(b"\0" * 1000)
    report = Bytes()
    restored = restore(spec, output, report)
    assert restored == output / "checkpoint-40" and not stale.exists()
    assert [p.name for p in output.iterdir()] == ["checkpoint-40"]
    size = sum(p.stat().st_size for p in uploaded.rglob("*") if p.is_file() and p.name != "swiftslurm_manifest.json")
    [(what, total)] = report.what
    assert what.startswith("downloading checkpoint-40 from s3://") and total == size == report.moved_bytes


def test_restore_removes_a_stale_staging_dir_even_with_nothing_to_download(spec: StorageSpec, tmp_path: Path) -> None:
    stale = tmp_path / (DOWNLOAD_STAGING.format(checkpoint="checkpoint-7") + "x")
    stale.mkdir()
    assert restore(spec, tmp_path) is None and not stale.exists()
