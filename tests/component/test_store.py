"""swiftslurm.storage.store and .uploader against a real S3 endpoint (SeaweedFS on 127.0.0.1), plus the CLI."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.ckpt.checkpoint import MANIFEST, commit, is_committed, problems
from swiftslurm.errors import ConfigError, NodeError, StorageError
from swiftslurm.ops import storage_cli
from swiftslurm.plan import StorageSpec
from swiftslurm.rundir.layout import SYNC_STATE
from swiftslurm.storage.send import ChangedSinceCommit
from swiftslurm.storage.store import (
    QUICK_ATTEMPTS,
    CheckpointStore,
    make_client,
    newest_remote_step,
    quick_bound_s,
    restore_if_newer,
)
from swiftslurm.storage.sync import NodeSync, restore
from swiftslurm.storage.uploader import Uploader
from swiftslurm.submit.jobs import check_storage
from swiftslurm.testing.s3 import SECRET_KEY, FaultProxy, Faults, SeaweedServer, use_test_credentials
from tests.conftest import REPO, plan_for

MiB = 1 << 20
BUCKET = "swiftslurm-unit"


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    use_test_credentials(monkeypatch)


def spec_for(endpoint_url: str, prefix: str) -> StorageSpec:
    return StorageSpec(
        bucket=BUCKET,
        prefix=prefix,
        endpoint_url=endpoint_url,
        region="us-east-1",
        addressing_style="path",
        part_size_mb=8,
        max_attempts=3,
        timeout_s=10,
    )


@pytest.fixture(scope="module")
def shared_client(s3_server: SeaweedServer) -> Any:
    """One client for the module: making one parses botocore's service models, ~0.5 s each time."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        use_test_credentials(monkeypatch)
        return make_client(spec_for(s3_server.endpoint_url, ""))


@pytest.fixture
def spec(s3_server: SeaweedServer, request: pytest.FixtureRequest) -> StorageSpec:
    """A spec with a prefix of its own per test, so tests share the server but not their checkpoints."""
    return spec_for(s3_server.endpoint_url, f"runs/{request.node.name}")


@pytest.fixture
def store(spec: StorageSpec, shared_client: Any) -> CheckpointStore:
    return CheckpointStore(spec, client=shared_client)


def make_checkpoint(output_dir: Path, step: int, big_mib: int = 0, small: int = 5, seed: int = 0) -> Path:
    """A committed checkpoint-N: an optional big random file, ``small`` small ones, one in a subfolder."""
    folder = output_dir / f"checkpoint-{step}"
    (folder / "global_step" / "shard").mkdir(parents=True)
    rng = random.Random(seed * 1000 + step)
    if big_mib:
        (folder / "model.safetensors").write_bytes(rng.randbytes(big_mib * MiB))
    for i in range(small):
        (folder / f"small_{i}.json").write_bytes(rng.randbytes(rng.randrange(0, 4096)))
    (folder / "global_step" / "shard" / "optim.pt").write_bytes(rng.randbytes(100_000))
    commit(folder, world_size=1, swift_version="test")
    return folder


def same_tree(a: Path, b: Path) -> bool:
    files_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    files_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    return files_a == files_b and all((a / p).read_bytes() == (b / p).read_bytes() for p in files_a)


@pytest.fixture
def record_calls(store: CheckpointStore) -> Iterator[Callable[..., list[tuple[str, str]]]]:
    """record_calls(*operations) -> the (operation, key) of every later call of them, in call order."""
    registered: list[tuple[str, Callable[..., None]]] = []

    def record(*operations: str) -> list[tuple[str, str]]:
        calls: list[tuple[str, str]] = []

        def on_call(params: dict[str, Any], model: Any, **kwargs: Any) -> None:
            keys = [o["Key"] for o in params.get("Delete", {}).get("Objects", [])] or [params.get("Key", "")]
            calls.extend((model.name, key) for key in keys)

        for operation in operations:
            registered.append((f"provide-client-params.s3.{operation}", on_call))
            store.client.meta.events.register(*registered[-1])
        return calls

    yield record
    for event, handler in registered:  # the client is shared by the module's tests
        store.client.meta.events.unregister(event, handler)


def test_round_trip_restores_identical_bytes(store: CheckpointStore, tmp_path: Path) -> None:
    local = make_checkpoint(tmp_path / "a", 40, big_mib=40, small=40)
    result = store.upload(local)
    assert (result.step, result.files, result.already_remote) == (40, 42, False)
    restored = store.download(40, tmp_path / "b")
    assert restored == tmp_path / "b" / "checkpoint-40"
    assert same_tree(local, restored)
    assert problems(restored, deep=True) == []
    assert not [p for p in (tmp_path / "b").iterdir() if p.name.startswith(".")]  # no staging left


def test_manifest_is_published_last_and_once(store: CheckpointStore, tmp_path: Path, record_calls: Any) -> None:
    calls = record_calls("PutObject", "CreateMultipartUpload", "CompleteMultipartUpload")
    store.upload(make_checkpoint(tmp_path, 10, big_mib=20, small=8))
    manifest_key = store.key(10, MANIFEST)
    assert calls[-1] == ("PutObject", manifest_key)
    assert [key for _, key in calls].count(manifest_key) == 1
    assert ("CompleteMultipartUpload", store.key(10, "model.safetensors")) in calls


def test_second_upload_sends_nothing(store: CheckpointStore, tmp_path: Path, record_calls: Any) -> None:
    local = make_checkpoint(tmp_path, 10)
    store.upload(local)
    calls = record_calls("PutObject", "UploadPart", "CreateMultipartUpload")
    again = store.upload(local)
    assert again.already_remote and again.files == 0
    assert calls == []


def test_retry_after_a_cut_short_upload_skips_files_already_stored(store: CheckpointStore, tmp_path: Path) -> None:
    local = make_checkpoint(tmp_path, 10, big_mib=10)
    store.upload(local)
    store.client.delete_object(Bucket=store.spec.bucket, Key=store.key(10, MANIFEST))  # as if cut short
    result = store.upload(local)
    assert (result.files, result.already_remote) == (0, False)
    assert store.committed_steps() == [10]


def test_upload_refuses_a_file_changed_since_its_commit(store: CheckpointStore, tmp_path: Path) -> None:
    local = make_checkpoint(tmp_path, 30)
    (local / "global_step" / "shard" / "optim.pt").write_bytes(b"\0" * 100_000)  # same size, other bytes
    with pytest.raises(StorageError, match="changed after its commit"):  # the server checks the manifest's SHA-256
        store.upload(local)
    assert 30 not in store.committed_steps()


def test_download_refuses_a_corrupted_remote_file(store: CheckpointStore, tmp_path: Path) -> None:
    local = make_checkpoint(tmp_path / "a", 20)
    store.upload(local)
    victim = store.key(20, "global_step/shard/optim.pt")
    store.client.put_object(Bucket=store.spec.bucket, Key=victim, Body=b"\0" * 100_000)  # same size, other bytes
    with pytest.raises(StorageError, match=r"optim\.pt does not match its remote manifest \(SHA-256 differs\)"):
        store.download(20, tmp_path / "b")
    assert list((tmp_path / "b").iterdir()) == []


def test_download_refuses_to_overwrite_a_committed_local_checkpoint(store: CheckpointStore, tmp_path: Path) -> None:
    local = make_checkpoint(tmp_path, 20)
    store.upload(local)
    with pytest.raises(StorageError, match="already committed locally"):
        store.download(20, tmp_path)


def test_download_sets_an_uncommitted_leftover_aside(store: CheckpointStore, tmp_path: Path) -> None:
    store.upload(make_checkpoint(tmp_path / "a", 20))
    leftover = tmp_path / "b" / "checkpoint-20"
    leftover.mkdir(parents=True)
    (leftover / "half_written.bin").write_bytes(b"x")
    assert is_committed(store.download(20, tmp_path / "b"))
    assert [p.name.split(".")[0] for p in (tmp_path / "b" / "quarantine").iterdir()] == ["checkpoint-20"]


def test_download_refuses_a_manifest_path_outside_the_checkpoint(store: CheckpointStore, tmp_path: Path) -> None:
    manifest = {"format": 1, "step": 5, "files": [{"path": "../../escape", "size": 1, "sha256": "0" * 64}]}
    store.client.put_object(Bucket=store.spec.bucket, Key=store.key(5, MANIFEST), Body=json.dumps(manifest))
    with pytest.raises(StorageError, match="unsafe path"):
        store.download(5, tmp_path / "out")
    assert not (tmp_path / "escape").exists()


def test_checkpoint_without_manifest_is_not_listed(store: CheckpointStore, tmp_path: Path) -> None:
    store.upload(make_checkpoint(tmp_path, 10))
    store.client.put_object(Bucket=store.spec.bucket, Key=store.key(99, "model.safetensors"), Body=b"partial")
    store.client.put_object(Bucket=store.spec.bucket, Key=store.key(1000, "x") + "/" + MANIFEST, Body=b"{}")
    assert store.committed_steps() == [10]
    assert newest_remote_step(store) == 10
    assert store.manifest(99) is None


def test_prune_keeps_the_newest_and_deletes_manifests_first(
    store: CheckpointStore, tmp_path: Path, record_calls: Any
) -> None:
    for step in (10, 20, 30):
        store.upload(make_checkpoint(tmp_path, step))
    store.client.put_object(Bucket=store.spec.bucket, Key=store.key(5, "orphan.bin"), Body=b"left by a cut upload")
    calls = record_calls("DeleteObject", "DeleteObjects")
    assert store.prune(keep=0) == []
    assert store.prune(keep=1) == [10, 20]
    assert store.committed_steps() == [30]
    for step in (10, 20):
        keys = [key for _, key in calls if key.startswith(store.key(step))]
        assert keys[0] == store.key(step, MANIFEST) and len(keys) > 1
    remaining = store.client.list_objects_v2(Bucket=store.spec.bucket, Prefix=store.spec.root).get("Contents", [])
    assert {o["Key"].split("/")[2] for o in remaining} == {"checkpoint-30"}


def test_restore_if_newer_downloads_only_a_newer_remote_checkpoint(store: CheckpointStore, tmp_path: Path) -> None:
    store.upload(make_checkpoint(tmp_path / "a", 30))
    assert restore_if_newer(store, tmp_path / "b", local_step=30) is None
    restored = restore_if_newer(store, tmp_path / "b", local_step=0)
    assert restored == tmp_path / "b" / "checkpoint-30" and is_committed(restored)


def test_uploader_uploads_in_the_background_and_applies_retention(store: CheckpointStore, tmp_path: Path) -> None:
    history = tmp_path / "uploads.jsonl"
    uploader = Uploader(store, keep=2, history=history)
    before = time.time()
    for step in (10, 20, 30):
        uploader.submit(make_checkpoint(tmp_path, step, small=3))
    assert uploader.drain(timeout_s=60) == []
    assert store.committed_steps() == [20, 30]
    assert uploader.failures() == []
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    # One line per upload; newest first, so 10 is skipped when 20 and 30 were submitted before it started.
    assert {20, 30} <= {line["step"] for line in lines} <= {10, 20, 30}
    for line, after in zip(lines, [*lines[1:], None], strict=True):
        assert line["files"] == 4 and line["size"] > 0 and not line["already_remote"]  # 3 small ones and optim.pt
        assert before <= line["started"] and line["seconds"] > 0
        if after is not None:  # one at a time: each ends before the next starts
            assert line["started"] + line["seconds"] <= after["started"] + 0.01
    with pytest.raises(RuntimeError):
        uploader.submit(tmp_path / "checkpoint-40")


def test_uploader_keeps_a_failed_checkpoint_pending(tmp_path: Path, s3_server: SeaweedServer) -> None:
    missing = StorageSpec(bucket="no-such-bucket", prefix="x", endpoint_url=s3_server.endpoint_url, max_attempts=1)
    uploader = Uploader(CheckpointStore(missing))
    local = make_checkpoint(tmp_path, 10)
    uploader.submit(local)
    assert uploader.drain(timeout_s=1.5) == [local]
    assert uploader.failures() and "no-such-bucket" in uploader.failures()[0]


def test_missing_bucket_error_names_it_and_the_fix(s3_server: SeaweedServer, tmp_path: Path) -> None:
    store = CheckpointStore(StorageSpec(bucket="no-such-bucket", prefix="x", endpoint_url=s3_server.endpoint_url))
    with pytest.raises(StorageError, match=r"bucket `no-such-bucket` does not exist.*fix `storage.bucket`"):
        store.committed_steps()


def test_refused_credentials_point_at_the_boto3_chain_and_never_show_the_secret(
    spec: StorageSpec, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + SECRET_KEY)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StorageError) as caught:
        CheckpointStore(spec).committed_steps()
    assert "AWS_ACCESS_KEY_ID" in str(caught.value) and "AWS_PROFILE" in str(caught.value)
    assert SECRET_KEY not in str(caught.value) and SECRET_KEY not in caplog.text


def test_secret_never_appears_in_spec_store_or_logs(
    store: CheckpointStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # botocore's debug logs included
    uploader = Uploader(store)
    uploader.submit(make_checkpoint(tmp_path / "a", 10))
    assert uploader.drain(timeout_s=60) == []
    store.download(10, tmp_path / "b")
    assert "[swiftslurm] uploaded checkpoint-10: 6 files" in caplog.text
    for text in (repr(store.spec), repr(store), caplog.text, json.dumps(store.spec.__dict__)):
        assert SECRET_KEY not in text


def test_cli_lists_downloads_and_prunes(store: CheckpointStore, tmp_path: Path, capsys: Any) -> None:
    for step in (10, 20):
        store.upload(make_checkpoint(tmp_path / "run", step))
    where = ["--bucket", BUCKET, "--prefix", store.spec.prefix, "--endpoint-url", str(store.spec.endpoint_url)]
    assert storage_cli.main(["list", *where]) == 0
    listing = capsys.readouterr().out
    assert "10" in listing and "20" in listing and "MiB" in listing
    assert storage_cli.main(["download", "latest", "--output-dir", str(tmp_path / "got"), *where]) == 0
    assert is_committed(tmp_path / "got" / "checkpoint-20")
    said = capsys.readouterr().err  # what it contacts and for how long, before each wait
    checking = f"checking {store.spec.url} (up to {QUICK_ATTEMPTS} tries, 5 s timeouts each)..."
    downloading = f"downloading checkpoint-20 from {store.spec.url}: "
    assert checking in said and downloading in said and said.index(checking) < said.index(downloading), said
    assert "MiB (each request up to 10 tries, 60 s timeouts)..." in said  # the flags' spec: StorageSpec's defaults
    assert storage_cli.main(["prune", "--keep", "1", *where]) == 0
    assert store.committed_steps() == [20]


def test_cli_reads_the_storage_section_of_plan_json(store: CheckpointStore, tmp_path: Path, capsys: Any) -> None:
    store.upload(make_checkpoint(tmp_path / "run", 10))
    (tmp_path / "plan.json").write_text(json.dumps({"storage": store.spec.__dict__}))
    assert storage_cli.main(["list", "--run-dir", str(tmp_path)]) == 0
    assert "10" in capsys.readouterr().out
    (tmp_path / "plan.json").write_text(json.dumps({"version": 1}))
    assert storage_cli.main(["list", "--run-dir", str(tmp_path)]) == 2
    assert "no `storage` section" in capsys.readouterr().err


def test_cli_uploads_the_newest_committed_checkpoint_a_finished_run_left_pending(
    store: CheckpointStore, tmp_path: Path, capsys: Any
) -> None:
    """The run finished, its drain cut before checkpoint-20 reached the store: `upload --run-dir` sends it and
    sync.json (what `status` reads) no longer lists it pending."""
    run_dir = tmp_path / "run"
    store.upload(make_checkpoint(run_dir / "output", 10))
    make_checkpoint(run_dir / "output", 20)
    (run_dir / "plan.json").write_text(json.dumps({"storage": store.spec.__dict__}))
    (run_dir / SYNC_STATE).write_text(json.dumps({"url": store.spec.url, "remote": [10], "pending": [20]}))
    assert storage_cli.main(["upload", "--run-dir", str(run_dir)]) == 0
    printed = capsys.readouterr()
    assert f"checkpoint-20 is in {store.spec.url}" in printed.out
    assert f"uploading checkpoint-20 to {store.spec.url}: " in printed.err
    assert "MiB (each request up to 3 tries, 10 s timeouts)..." in printed.err  # the run's own spec (spec_for)
    assert store.committed_steps() == [10, 20]
    synced = json.loads((run_dir / SYNC_STATE).read_text())
    assert (synced["remote"], synced["pending"]) == ([10, 20], [])
    assert storage_cli.main(["upload", "--run-dir", str(run_dir)]) == 0  # nothing to send: said so
    assert "(it was already)" in capsys.readouterr().out


def test_cli_upload_without_a_committed_checkpoint_says_so(store: CheckpointStore, tmp_path: Path, capsys: Any) -> None:
    (tmp_path / "run" / "output" / "checkpoint-5").mkdir(parents=True)  # written, never committed
    (tmp_path / "run" / "plan.json").write_text(json.dumps({"storage": store.spec.__dict__}))
    assert storage_cli.main(["upload", "--run-dir", str(tmp_path / "run")]) == 2
    assert "no committed checkpoint in" in capsys.readouterr().err


@pytest.mark.parametrize("down", ["refusing connections", "accepting and never answering"])
def test_cli_with_the_store_down_says_what_it_checks_and_gives_up_within_the_stated_bound(
    s3_server: SeaweedServer, capsys: Any, down: str
) -> None:
    """Flags only: the spec's own budget (10 tries, 60 s timeouts) would keep the caller waiting for minutes. The
    first contact is CheckpointStore.quick's, said before it starts; the bound is what the code guarantees
    (quick_bound_s), with room for a busy machine, not a measure of speed."""
    silent = down == "accepting and never answering"
    with FaultProxy(s3_server.endpoint_url, Faults(stall_rate=1.0 if silent else 0.0, stall_s=600)) as proxy:
        if not silent:
            proxy.go_down()
        started = time.monotonic()
        code = storage_cli.main(["list", "--bucket", BUCKET, "--prefix", "runs/down", "--endpoint-url", proxy.url])
        took = time.monotonic() - started
    said = capsys.readouterr().err.splitlines()
    assert code == 2
    assert f"checking s3://{BUCKET}/runs/down/ at {proxy.url} (up to {QUICK_ATTEMPTS} tries" in said[0], said
    gave_up = "no answer from" if silent else "cannot reach"
    assert any(gave_up in line for line in said[1:]), said
    assert took < 3 * quick_bound_s(), f"{took:.0f} s"


EXIT_WITHOUT_DRAIN = """
import sys
from pathlib import Path
from swiftslurm.storage.store import CheckpointStore
from swiftslurm.storage.uploader import Uploader
from swiftslurm.plan import StorageSpec
spec = StorageSpec(bucket=sys.argv[1], prefix=sys.argv[2], endpoint_url=sys.argv[3], region="us-east-1")
Uploader(CheckpointStore(spec)).submit(Path(sys.argv[4]))
"""


def test_interpreter_exit_without_drain_finishes_the_upload_then_exits(store: CheckpointStore, tmp_path: Path) -> None:
    local = make_checkpoint(tmp_path, 10)
    argv = [BUCKET, store.spec.prefix, str(store.spec.endpoint_url), str(local)]
    done = subprocess.run([sys.executable, "-c", EXIT_WITHOUT_DRAIN, *argv], cwd=REPO, timeout=60)
    assert done.returncode == 0
    assert store.committed_steps() == [10]


def test_a_connection_closed_after_100_continue_fails_instead_of_spinning() -> None:
    """A server that answers `100 Continue` and hangs up: botocore's Expect handling would loop forever."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(10)

        def hang_up_after_continue() -> None:
            with contextlib.suppress(OSError):
                while True:
                    conn, _ = listener.accept()
                    with conn:
                        conn.recv(65536)
                        conn.sendall(b"HTTP/1.1 100 Continue\r\n")

        threading.Thread(target=hang_up_after_continue, daemon=True).start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        client = make_client(StorageSpec(bucket="b-b", prefix="p", endpoint_url=url, max_attempts=2, timeout_s=2))
        failures: list[Exception] = []

        def put() -> None:
            try:
                client.put_object(Bucket="b-b", Key="k", Body=b"x" * (2 * MiB))  # big enough for Expect
            except Exception as err:
                failures.append(err)

        worker = threading.Thread(target=put, daemon=True)  # a daemon: were it to spin, the suite still ends
        worker.start()
        worker.join(timeout=20)
        assert not worker.is_alive(), "put_object spins after `100 Continue` and a clean close"
        assert failures


def test_node_sync_uploads_what_gets_committed_and_reports_it(store: CheckpointStore, tmp_path: Path) -> None:
    output = tmp_path / "output"
    make_checkpoint(output, 10)
    uncommitted = output / "checkpoint-15"
    uncommitted.mkdir()  # a save in progress: no manifest yet, must not be uploaded
    sync = NodeSync(store.spec, tmp_path, output, store=store)
    sync.poll(now=0.0)
    make_checkpoint(output, 20)
    sync.poll(now=0.5)  # within SCAN_S of the last look: not seen yet
    assert sync.drain(timeout_s=60) == []
    assert store.committed_steps() == [10, 20]
    state = json.loads((tmp_path / SYNC_STATE).read_text())
    assert (state["remote"], state["pending"], state["failures"]) == ([10, 20], [], 0)
    assert state["url"] == store.spec.url


def test_node_sync_reports_what_could_not_be_uploaded(s3_server: SeaweedServer, tmp_path: Path) -> None:
    missing = StorageSpec(bucket="no-such-bucket", prefix="x", endpoint_url=s3_server.endpoint_url, max_attempts=1)
    make_checkpoint(tmp_path / "output", 10)
    sync = NodeSync(missing, tmp_path, tmp_path / "output")
    assert sync.drain(timeout_s=1.5) == [10]
    state = json.loads((tmp_path / SYNC_STATE).read_text())
    assert state["pending"] == [10] and state["failures"] >= 1 and "no-such-bucket" in state["last_failure"]


def test_restore_fetches_the_remote_checkpoint_only_when_it_is_newer(store: CheckpointStore, tmp_path: Path) -> None:
    store.upload(make_checkpoint(tmp_path / "cluster-a", 40))
    make_checkpoint(tmp_path / "cluster-b", 20)
    restored = restore(store.spec, tmp_path / "cluster-b")
    assert restored == tmp_path / "cluster-b" / "checkpoint-40" and problems(restored, deep=True) == []
    assert restore(store.spec, tmp_path / "cluster-b") is None  # up to date now


def test_check_access_fails_before_submission_with_the_fix(s3_server: SeaweedServer, spec: StorageSpec) -> None:
    CheckpointStore(spec).check_access()
    wrong = StorageSpec(bucket="no-such-bucket", prefix="x", endpoint_url=s3_server.endpoint_url, max_attempts=1)
    with pytest.raises(StorageError, match="does not exist"):
        CheckpointStore(wrong).check_access()


# --- issue 14, item 1: one run's checkpoints per prefix ------------------------------------------------------


def committed_by(output_dir: Path, step: int, identity: str | None) -> Path:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of step %d" % step)
    commit(folder, world_size=1, swift_version="test", identity=identity)
    return folder


def test_restore_refuses_another_plans_remote_checkpoint_and_downloads_nothing(
    tmp_path: Path, store: CheckpointStore, spec: StorageSpec
) -> None:
    store.upload(committed_by(tmp_path / "other-run", 30, identity="aaaaaaaaaaaaaaaa"))
    mine = tmp_path / "output"
    with pytest.raises(NodeError) as refused:
        restore(spec, mine, identity="bbbbbbbbbbbbbbbb")
    assert "aaaaaaaaaaaaaaaa" in str(refused.value) and "bbbbbbbbbbbbbbbb" in str(refused.value)
    assert not mine.exists() or not any(mine.iterdir())
    assert restore(spec, mine, identity="aaaaaaaaaaaaaaaa") == mine / "checkpoint-30"  # its own plan restores it


def test_submission_refuses_a_prefix_that_holds_another_runs_checkpoints(
    tmp_path: Path, store: CheckpointStore, spec: StorageSpec
) -> None:
    plan = replace(plan_for(f"run_dir={tmp_path / 'run'}"), storage=spec)
    check_storage(plan)  # an empty prefix
    store.upload(committed_by(tmp_path / "before-identities", 10, identity=None))
    check_storage(plan)  # committed by an older swiftslurm: taken as this run's
    store.upload(committed_by(tmp_path / "mine", 20, identity=plan.identity()))
    check_storage(plan)
    store.upload(committed_by(tmp_path / "other", 30, identity="aaaaaaaaaaaaaaaa"))
    with pytest.raises(ConfigError) as refused:
        check_storage(plan)
    message = str(refused.value)
    assert "aaaaaaaaaaaaaaaa" in message and plan.identity() in message and "storage.prefix=" in message


def test_an_uploader_whose_job_lost_the_lease_uploads_and_prunes_nothing_remote(
    store: CheckpointStore, tmp_path: Path
) -> None:
    """Issue 14, item 4: remote retention is a destructive step too; only the run dir's leader applies it. Issue
    25, item 8: nor does a job that lost the lease upload any more (here it uploaded 10-30 while it led)."""
    for step in (10, 20, 30):
        store.upload(make_checkpoint(tmp_path, step, small=1))
    uploader = Uploader(store, keep=1, leads=lambda: False)
    uploader.submit(make_checkpoint(tmp_path, 40, small=1))
    assert uploader.drain(timeout_s=60) == []
    assert store.committed_steps() == [10, 20, 30]
    assert "not uploading checkpoint-40" in uploader.failures()[-1]


# --- issue 25, item 9: upload integrity -------------------------------------------------------------------------


def changed_after_commit(folder: Path) -> Path:
    """Overwrite a committed checkpoint's multipart file (20 MiB, three 8 MiB parts) with other bytes of its size."""
    path = folder / "model.safetensors"
    path.write_bytes(random.Random(99).randbytes(path.stat().st_size))
    return folder


def test_upload_refuses_a_multipart_file_changed_since_its_commit(store: CheckpointStore, tmp_path: Path) -> None:
    local = changed_after_commit(make_checkpoint(tmp_path, 30, big_mib=20))
    with pytest.raises(ChangedSinceCommit, match=r"model\.safetensors was read for upload with SHA-256"):
        store.upload(local)
    assert 30 not in store.committed_steps()
    stored = [key for key, _ in store._objects(store.key(30))]
    assert store.key(30, "model.safetensors") not in stored  # not stored under the manifest's SHA-256
    uploads = store.client.list_multipart_uploads(Bucket=store.spec.bucket, Prefix=store.key(30))
    assert not uploads.get("Uploads")  # aborted


def test_a_checkpoint_changed_since_its_commit_is_refused_once_and_reported(
    store: CheckpointStore, tmp_path: Path
) -> None:
    output = tmp_path / "output"
    make_checkpoint(output, 10)
    changed_after_commit(make_checkpoint(output, 20, big_mib=20))
    sync = NodeSync(store.spec, tmp_path, output, store=store)
    assert sync.drain(timeout_s=60) == [20]
    assert store.committed_steps() == [10]
    state = json.loads((tmp_path / SYNC_STATE).read_text())
    assert (state["remote"], state["pending"], state["refused"], state["failures"]) == ([10], [], [20], 1)
    assert "checkpoint-20 is not uploaded and not retried" in state["last_failure"]


def test_restore_falls_back_to_an_older_remote_checkpoint_when_the_newest_fails_its_check(
    store: CheckpointStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for step in (10, 20):
        store.upload(make_checkpoint(tmp_path / "a", step, big_mib=9))
    victim = store.key(20, "model.safetensors")
    store.client.put_object(Bucket=store.spec.bucket, Key=victim, Body=random.Random(5).randbytes(9 * MiB))
    store.client.put_object(Bucket=store.spec.bucket, Key=store.key(30, MANIFEST), Body=b"{not json")
    caplog.set_level(logging.WARNING)
    restored = restore(store.spec, tmp_path / "b")
    assert restored == tmp_path / "b" / "checkpoint-10" and problems(restored, deep=True) == []
    assert not (tmp_path / "b" / "checkpoint-20").exists()
    assert "not restoring checkpoint-30" in caplog.text and "not restoring checkpoint-20" in caplog.text
    assert restore(store.spec, tmp_path / "b") is None  # 10 is here: nothing newer passes its check
