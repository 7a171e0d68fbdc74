"""The store refusing connections at restore, against a real S3 endpoint (SeaweedFS on 127.0.0.1) behind the
fault proxy: node 0's attempts are recorded as infrastructure failures and retried with back-off, none trains
from a local checkpoint older than what was uploaded; once the store answers, the local copy a scratch purge
damaged is set aside and the store's copy restored. The trainer is replaced (tests/unit/test_outages.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import ResumePoint, problems
from swiftslurm.node import attempt
from swiftslurm.node.watch import Observed
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.layout import QUARANTINE, UPLOAD_HISTORY, output_dir
from swiftslurm.rundir.records import read_attempts
from swiftslurm.slurm_env import SlurmEnv
from swiftslurm.storage.store import CheckpointStore
from swiftslurm.storage.uploader import Uploader
from swiftslurm.testing.s3 import FaultProxy, Faults, SeaweedServer
from tests.unit.test_outages import LAST_STEP, committed, local_leader, storage_plan

BUCKET = "swiftslurm-outages"


def plan_at(run_dir: Path, endpoint_url: str) -> JobPlan:
    plan = storage_plan(run_dir, "resilience.backoff_base_s=0", "resilience.max_consecutive_failures=1")
    assert plan.storage is not None
    spec = replace(plan.storage, bucket=BUCKET, endpoint_url=endpoint_url, region="us-east-1", max_attempts=2)
    return replace(plan, storage=replace(spec, addressing_style="path", timeout_s=5, wait_at_exit_s=30))


def test_a_store_refusing_connections_at_restore_is_retried_and_then_restored_from(
    tmp_path: Path, s3_server: SeaweedServer, s3_credentials: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    committed(run_dir, 10)
    purged = committed(run_dir, 20)
    runs: list[ResumePoint] = []

    def fake_train(
        plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt_id: str, resume: ResumePoint, *_: object
    ) -> Observed:
        runs.append(resume)
        committed(run_dir, LAST_STEP)
        return Observed(0, [], False, ProgressWatch(Path("/dev/null"), 1.0), 1.0)

    monkeypatch.setattr(attempt, "train", fake_train)
    with FaultProxy(s3_server.endpoint_url, Faults()) as proxy:
        plan = plan_at(run_dir, proxy.url)
        assert plan.storage is not None
        uploads = Uploader(CheckpointStore(plan.storage), history=run_dir / UPLOAD_HISTORY)  # an earlier attempt
        uploads.submit(purged)
        assert uploads.drain(30) == []
        (purged / "adapter_model.safetensors").write_bytes(b"cut")  # then a scratch purge
        proxy.stop()  # from here on every connection is refused

        stopped = attempt.run(run_dir, plan, local_leader())

    assert runs == []  # never trained from checkpoint-10, behind the store
    rows = read_attempts(run_dir)
    assert [(r.reason, r.decision) for r in rows] == [("infra", "requeue"), ("infra", "stop")], rows
    assert all("could not be read" in (r.restore_error or "") for r in rows), rows
    assert stopped.decision == "stop" and "cannot reach" in stopped.why, stopped

    # The store answers again; the run is resubmitted (the same run dir).
    finished = attempt.run(run_dir, plan_at(run_dir, s3_server.endpoint_url), local_leader())

    [resume] = runs
    assert (resume.checkpoint, resume.step, resume.restore_error) == (purged, 20, None)
    assert problems(purged) == [] and finished.decision == "done"
    [aside] = (output_dir(run_dir) / QUARANTINE).iterdir()
    assert aside.name.startswith("checkpoint-20.before-download-")
