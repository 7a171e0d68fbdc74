"""Object storage on the real SLURM cluster: SeaweedFS on the bridge address (the nodes' network namespaces
reach the host only there), real ms-swift on the tiny model, credentials only in the submitting shell.

- Every committed checkpoint appears remotely with its manifest, through a proxy that resets, stalls and
  throttles requests, with no half-uploaded checkpoint ever visible as complete, and training untouched.
- A "new cluster" (the run dir deleted, the run resubmitted under the same name) restores from the store and
  resumes at the newest remote step, ending with the adapter of a run that never stopped.
- The secret and the access key appear nowhere in the run directory (plan, scripts, logs, status).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import checkpoint_dirs, is_committed, read_manifest
from swiftslurm.plan import StorageSpec
from swiftslurm.storage.store import CheckpointStore
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts, preempt_at_steps, queue_state, status, submit, wait_until
from swiftslurm.testing.s3 import ACCESS_KEY, SECRET_KEY, FaultProxy, Faults, Sampler, SeaweedServer
from tests.cluster.conftest import ADAPTER, BRIDGE, LONG

# s3_credentials: exported in the shell that submits, as a user would; SLURM hands the environment to the job.
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster", "s3_credentials")]
S3_HOST = BRIDGE  # where the s3_server fixture listens: the jobs reach it there
BUCKET = "swiftslurm-runs"
# Small checkpoints make ~10 requests each: a high rate still lets every upload through within its retries.
NODE0_LOGS = "logs/*/node0.log"
FLAKY = Faults(reset_rate=0.15, stall_rate=0.03, stall_s=3.0, error_rate=0.03, error_burst=3, seed=11)


def storage_overrides(endpoint_url: str, run_name: str) -> tuple[str, ...]:
    return (
        "storage=s3",
        f"storage.bucket={BUCKET}",
        f"storage.endpoint_url={endpoint_url}",
        "storage.addressing_style=path",
        "storage.region=us-east-1",
        f"run_name={run_name}",
    )


def remote_store(server: SeaweedServer, run_name: str) -> CheckpointStore:
    spec = StorageSpec(
        bucket=BUCKET,
        prefix=f"swiftslurm/{run_name}",
        endpoint_url=server.endpoint_url,
        region="us-east-1",
        addressing_style="path",
    )
    return CheckpointStore(spec)


def files_containing(root: Path, *needles: str) -> list[str]:
    """Every file under ``root`` (text or binary) that contains one of ``needles``."""
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}: {n}" for n in needles if n.encode() in data]
    return found


def test_every_commit_is_uploaded_through_a_flaky_network_and_no_secret_is_written(
    tmp_path: Path, s3_server: SeaweedServer
) -> None:
    run_dir = tmp_path / "run"
    store = remote_store(s3_server, "synced")
    sampler = Sampler(s3_server.client(), BUCKET, store.spec.root)
    sampler.start()
    with FaultProxy(s3_server.endpoint_url, FLAKY, host=BRIDGE, lifetime_s=600) as proxy:
        done = swiftslurm(
            "+cluster=local-slurm",
            "wait=true",
            f"run_dir={run_dir}",
            *storage_overrides(proxy.url, "synced"),
            "swift.max_steps=60",
            "swift.save_steps=10",
            cwd=tmp_path,
        )
        injected = dict(proxy.injected)
    sampler.stop.set()
    sampler.join()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    [attempt] = attempts(run_dir)  # training was never interrupted by the network
    assert attempt["reason"] == "finished"
    local = {step: path for step, path in checkpoint_dirs(run_dir / "output") if is_committed(path)}
    assert sorted(local) == [10, 20, 30, 40, 50, 60]
    assert store.committed_steps() == sorted(local)
    assert all(store.manifest(step) == read_manifest(path) for step, path in local.items())
    assert sampler.samples > 10 and sampler.violations == []
    assert injected["reset"] > 0 and sum(injected.values()) >= 5, injected
    synced = status(run_dir)["storage"]
    assert (synced["remote"], synced["pending"]) == (sorted(local), []), synced
    assert json.loads((run_dir / "sync.json").read_text())["pending"] == []
    uploads = [json.loads(line) for line in (run_dir / "uploads.jsonl").read_text().splitlines()]
    assert sorted(u["step"] for u in uploads) == sorted(local)  # a line per upload (a retried one may come later)
    assert all(u["seconds"] > 0 and u["files"] > 0 for u in uploads)

    assert files_containing(run_dir, SECRET_KEY, ACCESS_KEY) == []
    assert SECRET_KEY not in done.stdout + done.stderr


def test_a_new_cluster_restores_from_the_store_and_ends_identical(
    tmp_path: Path, s3_server: SeaweedServer, uninterrupted: bytes
) -> None:
    overrides = (*storage_overrides(s3_server.endpoint_url, "moved"), *LONG)
    store = remote_store(s3_server, "moved")

    # Cluster A: trains, is preempted after step 60 (its save is uploaded before it requeues), then is lost
    # while its requeued job waits to start again.
    first = tmp_path / "cluster-a" / "run"
    first.parent.mkdir()
    job = submit(first, *overrides)
    preempt_at_steps(first, job, [60])
    wait_until(lambda: queue_state(job) in ("PENDING", None), 120, "the requeued job to be pending")
    subprocess.run(["scancel", job], check=True)
    wait_until(lambda: queue_state(job) is None, 120, "the job to leave the queue")
    [preempted] = attempts(first)
    saved = preempted["committed_step"]
    assert saved >= 60 and store.committed_steps()[-1] == saved
    assert status(first)["storage"]["pending"] == []
    shutil.rmtree(first.parent)

    # Cluster B: nothing local; the same run resubmitted.
    second = tmp_path / "cluster-b" / "run"
    second.parent.mkdir()
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={second}", *overrides, cwd=second.parent)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [attempt] = attempts(second)
    assert attempt["resume_step"] == saved
    assert attempt["resumed_from"] == str(second / "output" / f"checkpoint-{saved}")
    assert (second / ADAPTER).read_bytes() == uninterrupted
    assert store.committed_steps()[-1] == 120
    assert f"will resume from s3://{BUCKET}/swiftslurm/moved/checkpoint-{saved}: " in done.stdout, done.stdout

    # Cluster C: the same plan once more, in a run dir of its own: told before it happens that it resumes the
    # finished run's last checkpoint; then status and logs show that run's history, not "none logged".
    third = tmp_path / "cluster-c" / "run"
    third.parent.mkdir()
    again = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={third}", *overrides, cwd=third.parent)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"will resume from s3://{BUCKET}/swiftslurm/moved/checkpoint-120: " in again.stdout, again.stdout
    restored = f"nothing left to train: its last step was restored from s3://{BUCKET}/swiftslurm/moved/checkpoint-120"
    assert restored in again.stdout and "final loss       (none logged)" not in again.stdout, again.stdout
    [record] = attempts(third)
    assert record["restored_from"] == f"s3://{BUCKET}/swiftslurm/moved/checkpoint-120"
    assert record["why"].startswith(restored), record["why"]
    shown = json.loads(swiftslurm("status", str(third), "--json", cwd=tmp_path).stdout)["runs"][0]
    assert shown["loss"] is not None and shown["max_steps"] == 120, shown
    logs = swiftslurm("logs", str(third), cwd=tmp_path)
    assert "no attempt has started yet" not in logs.stderr and "downloaded checkpoint-120" in logs.stdout, logs


def is_upload(head: bytes) -> bool:
    """A request that writes to the store: a part, a whole object, the start or end of a multipart upload."""
    return head.startswith((b"PUT ", b"POST "))


def committed_in_log(run_dir: Path, step: int) -> bool:
    """Whether node 0's trainer has committed checkpoint-N (it says so in its log, even if it is pruned later)."""
    return any(f"committed checkpoint-{step}" in log.read_text(errors="replace") for log in run_dir.glob(NODE0_LOGS))


def committed_steps(output: Path) -> list[int]:
    return [step for step, path in checkpoint_dirs(output) if is_committed(path)]


def test_keep_checkpoints_1_with_uploads_slower_than_saves_prunes_nothing_pending_and_uploads_the_newest(
    tmp_path: Path, s3_server: SeaweedServer
) -> None:
    """The store takes no upload until three checkpoints are committed (the proxy refuses every write): uploads
    slower than saves, on any machine. Before, the trainer pruned each pending checkpoint at the next commit
    and the uploader dropped it, so the store got nothing until the end."""
    run_dir = tmp_path / "run"
    store = remote_store(s3_server, "held")
    with FaultProxy(s3_server.endpoint_url, Faults(), host=BRIDGE, lifetime_s=1200) as proxy:
        proxy.refuse = is_upload
        overrides = ("swift.max_steps=60", "swift.save_steps=10", "keep_checkpoints=1", "storage.keep=1")
        job = submit(run_dir, *storage_overrides(proxy.url, "held"), *overrides, "storage.max_attempts=2")
        wait_until(lambda: committed_in_log(run_dir, 30), 600, "three commits")
        held = committed_steps(run_dir / "output")
        proxy.refuse = None
        wait_until(lambda: queue_state(job) is None, 600, "the run to end")
    assert {10, 20, 30} <= set(held), f"pruned before they were uploaded: {held}"
    [attempt] = attempts(run_dir)
    assert attempt["reason"] == "finished"
    assert store.committed_steps() == [60]
    assert committed_steps(run_dir / "output") == [60]  # the others are uploaded, or superseded in the store
    uploaded = [json.loads(line)["step"] for line in (run_dir / "uploads.jsonl").read_text().splitlines()]
    # Once one is remote, older ones are superseded (storage.keep=1) and skipped. Which one goes first after the
    # proxy opens depends on the uploader's back-off against the test's timing: the unit test pins the order.
    assert uploaded == sorted(set(uploaded)) and uploaded[-1] == 60, uploaded
    logs = [*run_dir.glob(NODE0_LOGS), *run_dir.glob("submitit/*_log.out")]  # the trainer's, the wrapper's
    text = "".join(log.read_text(errors="replace") for log in logs)
    assert "dropped" not in text and "pruned checkpoint-10 locally: the store has it" in text
    assert not re.search(r"pruned checkpoint-\d+ \(keep_checkpoints", text)  # the trainer's retention is off
