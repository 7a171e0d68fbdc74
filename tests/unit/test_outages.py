"""Outages are retried with back-off, never fatal without a record: the object store failing at restore
(down past botocore's retries, an expired session token), a local checkpoint damaged by a scratch purge, and
`scontrol requeue` failing while slurmctld does not answer. The store is a stand-in client raising botocore's
own errors (CheckpointStore's seam, make_client); SLURM is faked at its seam (slurm.runner)."""

from __future__ import annotations

import hashlib
import json
import signal
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from swiftslurm import slurm as slurm_cli
from swiftslurm.ckpt.checkpoint import MANIFEST, ResumePoint, commit, is_committed, problems
from swiftslurm.errors import StorageError
from swiftslurm.node import attempt, outcome
from swiftslurm.node.requeue import Requeued
from swiftslurm.node.resume import publish_unrestored
from swiftslurm.node.watch import Observed
from swiftslurm.plan import JobPlan, StorageSpec
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.jsonio import append_jsonl
from swiftslurm.rundir.layout import ATTEMPTS, QUARANTINE, UPLOAD_HISTORY, output_dir, resume_file
from swiftslurm.rundir.records import AttemptRecord, amend_attempt, append_attempt, read_attempts, read_status
from swiftslurm.slurm_env import SlurmEnv
from swiftslurm.storage import store as store_mod
from swiftslurm.storage.store import CheckpointStore
from swiftslurm.storage.sync import restore
from tests.conftest import plan_for
from tests.unit.test_attempt_skip import JOB, requeued_leader
from tests.unit.test_fetch import FakeS3

LAST_STEP = 30
UNREACHABLE = EndpointConnectionError(endpoint_url="http://s3.test:8333/b?list-type=2")
EXPIRED = ClientError(
    {"Error": {"Code": "ExpiredToken", "Message": "The provided token has expired."}}, "ListObjectsV2"
)


def local_leader() -> SlurmEnv:
    return SlurmEnv.from_environ({})


def storage_plan(run_dir: Path, *overrides: str) -> JobPlan:
    plan = plan_for(
        f"run_dir={run_dir}",
        f"swift.max_steps={LAST_STEP}",
        "swift.save_steps=10",
        "storage=s3",
        "storage.bucket=ckpt",
        "storage.prefix=run",
        "storage.endpoint_url=http://s3.test:8333",
        "storage.wait_at_exit_s=0",  # the end of an attempt does not wait for uploads the outage fails
        "storage.max_attempts=1",  # nor does the uploader ask the stand-in again (CheckpointStore._get_bytes)
        *overrides,
    )
    return replace(plan, tiny_cache=None)


def committed(run_dir: Path, step: int) -> Path:
    folder = output_dir(run_dir) / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of step %d" % step)
    commit(folder, world_size=1, swift_version="test", last_step=LAST_STEP)
    return folder


def uploaded(run_dir: Path, step: int) -> None:
    """An earlier attempt uploaded checkpoint-N (the line the uploader appends)."""
    line = {"step": step, "files": 2, "size": 100, "seconds": 0.1, "already_remote": False, "started": 1.0}
    append_jsonl(run_dir / UPLOAD_HISTORY, [line])


class DownStore:
    """An S3 client whose every request fails with ``error``, as botocore raises it after its own retries."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def _fail(self, *_: object, **__: object) -> Any:
        raise self.error

    get_paginator = get_object = head_object = list_objects_v2 = put_object = _fail


@pytest.fixture
def store_down(monkeypatch: pytest.MonkeyPatch) -> Callable[[Exception], DownStore]:
    def install(error: Exception) -> DownStore:
        client = DownStore(error)
        monkeypatch.setattr(store_mod, "make_client", lambda spec: client)
        return client

    return install


Answer = slurm_cli.Answer | Exception


class FakeSlurm:
    """SLURM's commands as the wrapper of a one-node job asks them; `scontrol requeue` and `scontrol update`
    answer in turn from the scripts (an exception is raised; the last answer stays)."""

    def __init__(self, requeue: Sequence[Answer] = (), update: Sequence[Answer] = ()) -> None:
        self.scripts = {
            "requeue": list(requeue) or [slurm_cli.Answer(0)],
            "update": list(update) or [slurm_cli.Answer(0)],
        }
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> slurm_cli.Answer:
        self.calls.append(list(argv))
        if argv[:3] == ["scontrol", "show", "job"]:
            return slurm_cli.Answer(0, f"JobId={JOB} StartTime=2026-12-01T10:00:00 TimeLimit=UNLIMITED EndTime=Unknown")
        if argv[0] == "scontrol" and argv[1] in self.scripts:
            script = self.scripts[argv[1]]
            answer = script.pop(0) if len(script) > 1 else script[0]
            if isinstance(answer, Exception):
                raise answer
            return answer
        return slurm_cli.Answer(0, "")  # squeue, sinfo: nothing to say

    def asked(self, *argv: str) -> int:
        return sum(call[: len(argv)] == list(argv) for call in self.calls)


@pytest.fixture
def slurm(monkeypatch: pytest.MonkeyPatch) -> Callable[..., FakeSlurm]:
    def install(**scripts: Sequence[Answer]) -> FakeSlurm:
        fake = FakeSlurm(**scripts)
        monkeypatch.setattr(slurm_cli, "runner", fake)
        monkeypatch.setattr(slurm_cli, "sleep", lambda s: None)
        monkeypatch.setattr(signal, "signal", lambda *_: None)  # the requeue ignores TERM: not in pytest's process
        return fake

    return install


Trainer = Callable[[list[tuple[int | None, int]]], list[ResumePoint]]


@pytest.fixture
def trainer(monkeypatch: pytest.MonkeyPatch) -> Trainer:
    """Replaces the trainer with a script of (step it commits or None, exit code) per run; returns the resume
    point of every run."""

    def install(script: list[tuple[int | None, int]]) -> list[ResumePoint]:
        runs: list[ResumePoint] = []

        def fake_train(
            plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt_id: str, resume: ResumePoint, *_: object
        ) -> Observed:
            step, code = script[len(runs)]
            runs.append(resume)
            if step is not None:
                committed(run_dir, step)
            return Observed(code, [], False, ProgressWatch(Path("/dev/null"), 1.0), 1.0)

        monkeypatch.setattr(attempt, "train", fake_train)
        return runs

    return install


# --- the store cannot be read at restore ----------------------------------------------------------------------


def test_a_store_down_at_restore_with_local_checkpoints_behind_requeues_with_back_off(
    tmp_path: Path, store_down: Callable[[Exception], DownStore], slurm: Callable[..., FakeSlurm], trainer: Trainer
) -> None:
    """checkpoint-20 was uploaded, then the scratch disk lost it: training from checkpoint-10 would lose ten
    steps, so no trainer starts; the attempt is an infrastructure failure, requeued after the back-off."""
    run_dir = tmp_path / "run"
    committed(run_dir, 10)
    uploaded(run_dir, 20)
    store_down(UNREACHABLE)
    fake = slurm()
    runs = trainer([])

    with pytest.raises(Requeued):
        attempt.run(run_dir, storage_plan(run_dir), requeued_leader())

    assert runs == []  # no trainer started
    [row] = read_attempts(run_dir)
    assert (row.reason, row.decision, row.delay_s, row.progressed) == ("infra", "requeue", 30, False), row
    assert row.restore_error is not None and "cannot reach" in row.restore_error, row
    assert "step 10) is older than step 20, uploaded before" in row.restore_error, row
    assert row.why is not None and row.why.startswith("infrastructure failure: no trainer started: "), row
    assert "requeued in 30s (1 of 3 failures in a row" in row.why, row
    status = read_status(run_dir) or {}
    assert (status["state"], status["reason"], status["why"]) == ("requeued", "infra", row.why), status
    assert fake.asked("scontrol", "requeue", JOB) == 1
    assert fake.asked("scontrol", "update", f"JobId={JOB}", "StartTime=now+30") == 1  # the back-off
    chosen = json.loads(resume_file(run_dir, row.attempt).read_text())
    assert chosen["checkpoint"] is None and "cannot reach" in chosen["unrestored"]  # the other nodes train neither


def test_an_expired_token_on_every_attempt_ends_in_a_stop_with_the_fix(
    tmp_path: Path, store_down: Callable[[Exception], DownStore], trainer: Trainer
) -> None:
    """The same expired AWS_SESSION_TOKEN in every requeued attempt's environment: each attempt is recorded, the
    back-off grows, and the run stops within the budget of failures in a row, saying what to change."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    uploaded(run_dir, 10)
    store_down(EXPIRED)
    runs = trainer([])

    result = attempt.run(run_dir, storage_plan(run_dir, "resilience.backoff_base_s=0"), local_leader())

    assert runs == []
    rows = read_attempts(run_dir)
    assert [r.decision for r in rows] == ["requeue", "requeue", "requeue", "stop"], rows
    assert all(r.reason == "infra" and "ExpiredToken" in (r.restore_error or "") for r in rows), rows
    assert result.decision == "stop" and result.why.startswith("stopped: no progress"), result
    assert "AWS_SESSION_TOKEN" in result.why and "AWS_PROFILE" in result.why  # the fix
    assert (read_status(run_dir) or {})["state"] == "failed"


def test_a_store_down_at_restore_resumes_from_a_local_checkpoint_as_new_as_any_upload(
    tmp_path: Path, store_down: Callable[[Exception], DownStore], trainer: Trainer
) -> None:
    run_dir = tmp_path / "run"
    local = committed(run_dir, 20)
    uploaded(run_dir, 20)
    store_down(UNREACHABLE)
    runs = trainer([(LAST_STEP, 0)])

    result = attempt.run(run_dir, storage_plan(run_dir), local_leader())

    [resume] = runs
    assert (resume.checkpoint, resume.step) == (local, 20)
    assert result.decision == "done"
    [row] = read_attempts(run_dir)
    assert (row.resumed_from, row.reason) == (str(local), "finished"), row
    assert row.restore_error is not None and "cannot reach" in row.restore_error, row  # the record says so


def test_the_other_nodes_start_no_trainer_when_node_0_could_not_restore(tmp_path: Path, trainer: Trainer) -> None:
    """They end with exit code 0 once node 0 has concluded (a failing follower would make srun kill node 0)."""
    run_dir = tmp_path / "run"
    plan = replace(storage_plan(run_dir, "+cluster=local-slurm"), tiny_cache=None)  # two nodes
    env = {"SLURM_JOB_ID": JOB, "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2"}
    follower = SlurmEnv.from_environ({**env, "SLURM_NODEID": "1", "SLURM_PROCID": "1"})
    publish_unrestored(resume_file(run_dir, JOB), "the object store could not be read", nonce=None)
    outcome.publish(resume_file(run_dir, JOB).parent, outcome.Outcome(outcome.END), nonce=None)
    runs = trainer([])

    result = attempt.run(run_dir, plan, follower)

    assert (runs, result.exit_code, result.decision) == ([], 0, None)
    assert json.loads((resume_file(run_dir, JOB).parent / "node1.json").read_text())["exit_code"] == 0


# --- a local checkpoint damaged by a scratch purge ------------------------------------------------------------


def remote_checkpoint(step: int, payload: dict[str, bytes]) -> dict[str, bytes]:
    entries = [{"path": p, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for p, d in payload.items()]
    objects = {f"run/checkpoint-{step}/{p}": d for p, d in payload.items()}
    manifest = {"format": 1, "step": step, "last_step": LAST_STEP, "world_size": 1, "files": entries}
    objects[f"run/checkpoint-{step}/{MANIFEST}"] = json.dumps(manifest).encode()
    return objects


def test_a_committed_checkpoint_cut_by_a_scratch_purge_is_set_aside_and_restored(tmp_path: Path) -> None:
    """Its manifest is there, a file is shorter than the manifest says: it is not resumable, and the store's
    copy replaces it (the damaged folder is kept in quarantine) instead of "already committed locally"."""
    out = tmp_path / "output"
    payload = {"adapter_model.safetensors": b"weights of step 20" * 100}
    purged = out / "checkpoint-20"
    purged.mkdir(parents=True)
    (purged / "adapter_model.safetensors").write_bytes(payload["adapter_model.safetensors"])
    commit(purged, world_size=1, swift_version="test", last_step=LAST_STEP)
    (purged / "adapter_model.safetensors").write_bytes(b"cut")  # the purge
    spec = StorageSpec(bucket="b", prefix="run", part_size_mb=5)
    store = CheckpointStore(spec, client=FakeS3(remote_checkpoint(20, payload)))

    restored = restore(spec, out, store=store)

    assert restored == purged and is_committed(restored) and problems(restored) == []
    assert (restored / "adapter_model.safetensors").read_bytes() == payload["adapter_model.safetensors"]
    [aside] = (out / QUARANTINE).iterdir()
    assert aside.name.startswith("checkpoint-20.before-download-") and (aside / MANIFEST).is_file()


def test_a_verified_local_checkpoint_is_still_never_overwritten(tmp_path: Path) -> None:
    out = tmp_path / "output"
    payload = {"adapter_model.safetensors": b"weights of step 20"}
    here = out / "checkpoint-20"
    here.mkdir(parents=True)
    (here / "adapter_model.safetensors").write_bytes(payload["adapter_model.safetensors"])
    commit(here, world_size=1, swift_version="test", last_step=LAST_STEP)
    store = CheckpointStore(
        StorageSpec(bucket="b", prefix="run", part_size_mb=5), client=FakeS3(remote_checkpoint(20, payload))
    )
    with pytest.raises(StorageError, match="already committed locally; not overwritten"):
        store.download(20, out)


# --- `scontrol requeue` while slurmctld does not answer -------------------------------------------------------

NO_ANSWER = TimeoutError("scontrol did not answer within 30 s")


def killed_without_restart(run_dir: Path, trainer: Trainer) -> JobPlan:
    """A killed trainer of a run without object storage, requeued after the back-off (no restart in place)."""
    committed(run_dir, 10)
    trainer([(None, -9)])
    plan = plan_for(f"run_dir={run_dir}", f"swift.max_steps={LAST_STEP}", "resilience.max_restarts=0")
    return replace(plan, tiny_cache=None)


def test_a_requeue_slurm_never_takes_is_recorded_and_stops_the_run(
    tmp_path: Path, slurm: Callable[..., FakeSlurm], trainer: Trainer
) -> None:
    run_dir = tmp_path / "run"
    plan = killed_without_restart(run_dir, trainer)
    fake = slurm(requeue=[NO_ANSWER])

    result = attempt.run(run_dir, plan, requeued_leader())

    assert fake.asked("scontrol", "requeue", JOB) == 3  # asked again within the seam's budget
    assert (result.decision, result.exit_code) == ("stop", 1), result
    assert f"SLURM did not requeue job {JOB} after 3 tries" in result.why, result
    [row] = read_attempts(run_dir)  # the amendment is folded into the attempt's row
    assert (row.reason, row.decision, row.why) == ("infra", "stop", result.why), row
    assert row.requeue_error is not None and "did not answer within" in row.requeue_error, row
    status = read_status(run_dir) or {}
    assert (status["state"], status["why"], status["reason"]) == ("failed", result.why, "infra"), status
    lines = [json.loads(line) for line in (run_dir / ATTEMPTS).read_text().splitlines()]
    assert [line["decision"] for line in lines] == ["requeue", "stop"]  # append-only: the row, then its amendment


def test_a_requeue_that_times_out_once_is_asked_again_and_requeues(
    tmp_path: Path, slurm: Callable[..., FakeSlurm], trainer: Trainer
) -> None:
    run_dir = tmp_path / "run"
    plan = killed_without_restart(run_dir, trainer)
    fake = slurm(requeue=[NO_ANSWER, slurm_cli.Answer(0)])

    with pytest.raises(Requeued):
        attempt.run(run_dir, plan, requeued_leader())

    assert fake.asked("scontrol", "requeue", JOB) == 2
    [row] = read_attempts(run_dir)
    assert (row.decision, row.requeue_error, (read_status(run_dir) or {})["state"]) == ("requeue", None, "requeued")


def test_a_requeued_job_whose_back_off_cannot_be_set_still_ends_as_requeued(
    tmp_path: Path, slurm: Callable[..., FakeSlurm], trainer: Trainer
) -> None:
    """SLURM took the job back; the StartTime update after it never got an answer: the attempt still ends as
    requeued (it only starts sooner), not with an error after the requeue."""
    run_dir = tmp_path / "run"
    plan = killed_without_restart(run_dir, trainer)
    fake = slurm(update=[NO_ANSWER])

    with pytest.raises(Requeued):
        attempt.run(run_dir, plan, requeued_leader())

    assert fake.asked("scontrol", "requeue", JOB) == 1
    assert fake.asked("scontrol", "update", f"JobId={JOB}", "StartTime=now+30") == 3


def test_an_amendment_corrects_the_newest_row_of_its_attempt_only(tmp_path: Path) -> None:
    """`local-<pid>` ids may come back in a later rerun: the older row keeps its facts."""
    for decision in ("stop", "requeue"):
        append_attempt(tmp_path, AttemptRecord("local-7", reason="infra", decision=decision))
    amend_attempt(tmp_path, "local-7", decision="stop", requeue_error="no answer")
    amend_attempt(tmp_path, "never-recorded", decision="stop")
    older, newer = read_attempts(tmp_path)
    assert (older.decision, older.requeue_error) == ("stop", None)
    assert (newer.decision, newer.requeue_error, newer.reason) == ("stop", "no answer", "infra")
