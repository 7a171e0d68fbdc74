"""Issue 25, item 8: fencing is compare-and-act on generations of the lease (rundir/lease.py), never a POSIX lock.

Two jobs that read the lease at the same moment get different tokens even where lockf binds one node only
(NFS `nolock`, Lustre `localflock`; here: both in one process, which POSIX locks never keep apart); lockf
failing (Lustre `noflock`) changes nothing; a leader whose lease another job takes ends its trainer and records
nothing; that trainer writes no manifest, and nothing more is uploaded."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.errors import NodeError
from swiftslurm.node import attempt, watch
from swiftslurm.plan import JobPlan, StorageSpec
from swiftslurm.rundir import jsonio, lease
from swiftslurm.rundir.layout import (
    ATTEMPTS,
    OUTCOME,
    STATUS,
    SYNC_STATE,
    attempt_dir,
    lease_dir,
    output_dir,
    plan_file,
    resume_file,
)
from swiftslurm.rundir.records import read_attempts
from swiftslurm.slurm_env import SlurmEnv
from swiftslurm.storage.store import UploadResult
from swiftslurm.storage.sync import NodeSync
from swiftslurm.storage.uploader import Uploader
from tests.conftest import plan_for
from tests.unit.test_identity_and_lease import commit_with_a_committer, leader_of


def committed(output: Path, step: int) -> Path:
    folder = output / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of step %d" % step)
    ck.commit(folder, world_size=1, swift_version="test")
    return folder


# --- the token: unique without locks ----------------------------------------------------------------------


def test_two_jobs_that_read_the_lease_at_once_never_share_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job 7 reads the lease (job 5's, gone); before it writes, job 6 takes it: 7 must not take token 2 too."""
    lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    running = {"6", "7"}
    read, raced = lease.read, []

    def job_6_takes_it_meanwhile(run_dir: Path) -> dict[str, Any]:
        seen = read(run_dir)
        monkeypatch.setattr(lease, "read", read)  # once: job 6 reads the lease as it is
        raced.append(lease.acquire(tmp_path, leader_of("6"), "6", alive=lambda job: job in running))
        return seen

    monkeypatch.setattr(lease, "read", job_6_takes_it_meanwhile)
    seven = lease.acquire(tmp_path, leader_of("7"), "7", alive=lambda job: job in running)

    (six,) = raced
    assert isinstance(six, lease.Lease) and six.token == 2 and six.holds()
    assert isinstance(seven, str) and "job 6 holds the lease" in seven, seven
    assert read(tmp_path)["job"] == "6"


def test_lockf_failing_changes_nothing_since_no_lock_is_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lustre mounted `noflock` answers lockf with ENOSYS; the lease needs no lock."""

    def noflock(*_: object) -> None:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(fcntl, "lockf", noflock)
    monkeypatch.setattr(fcntl, "flock", noflock)
    held = lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    assert isinstance(held, lease.Lease)
    held.check("quarantine newer checkpoints")
    again = lease.acquire(tmp_path, leader_of("5", restart=1), "5.r1", alive=lambda job: True)
    assert isinstance(again, lease.Lease) and again.token == held.token + 1 and not held.holds()


def test_a_filesystem_without_hard_links_stops_the_leader_with_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_links(*_: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(os, "link", no_links)
    with pytest.raises(NodeError) as refused:
        lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    message = str(refused.value)
    assert "\n" not in message and "link" in message and "HINT" in message, message
    assert list(lease_dir(tmp_path).iterdir()) == []  # no temp file left behind


def test_a_link_whose_reply_nfs_lost_still_takes_the_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NFS retransmits a link whose reply was lost, and the server then answers EEXIST for the link it made."""
    link = os.link

    def made_but_reported_existing(source: str, target: str) -> None:
        link(source, target)
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST))

    monkeypatch.setattr(os, "link", made_but_reported_existing)
    held = lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    assert isinstance(held, lease.Lease) and held.token == 1 and held.holds()
    assert jsonio.read_json(lease_dir(tmp_path) / "1.json") is not None


# --- a leader whose lease is taken while it trains --------------------------------------------------------


def trainer_of(plan: JobPlan, run_dir: Path, job: str, monkeypatch: pytest.MonkeyPatch) -> lease.Lease:
    """Job ``job`` takes the lease, and this process is the trainer it starts: the environment the wrapper gives
    it (watch.trainer_env), its token included."""
    held = lease.acquire(run_dir, leader_of(job), job, alive=lambda job: False)
    assert isinstance(held, lease.Lease)
    for name, value in watch.trainer_env(plan, leader_of(job), run_dir, held.token).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("swiftslurm.engines.hooks.swift_version", lambda: "test")
    return held


def saved(output: Path, step: int) -> Path:
    """checkpoint-N as the trainer saved it, not committed yet."""
    folder = output / f"checkpoint-{step}"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "adapter_model.safetensors").write_bytes(b"weights of step %d" % step)
    return folder


def test_a_trainer_whose_leader_lost_the_lease_writes_no_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 compares the token right before the rename: a takeover while the checkpoint is being hashed still
    refuses the manifest."""
    trainer_of(replace(plan_for(f"run_dir={tmp_path}"), tiny_cache=None), tmp_path, "5", monkeypatch)
    taken = saved(output_dir(tmp_path), 40)
    hash_files = ck.file_entries

    def job_6_takes_the_lease_while_hashing(folder: Path, paths: list[str]) -> list[dict[str, Any]]:
        lease.acquire(tmp_path, leader_of("6"), "6", alive=lambda job: False)  # SLURM said job 5 was gone
        return hash_files(folder, paths)

    monkeypatch.setattr(ck, "file_entries", job_6_takes_the_lease_while_hashing)
    commit_with_a_committer(taken)
    assert not ck.is_committed(taken)
    assert [p.name for p in taken.iterdir()] == ["sub"]  # no manifest, no temp file


def test_the_manifest_names_the_token_of_the_leader_that_started_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = trainer_of(replace(plan_for(f"run_dir={tmp_path}"), tiny_cache=None), tmp_path, "5", monkeypatch)
    folder = saved(output_dir(tmp_path), 20)
    commit_with_a_committer(folder)
    assert (ck.read_manifest(folder) or {}).get("lease_token") == held.token


class TakenOver:
    """Stands in for watch.Trainer: at its second poll job 6 takes the lease; left alone it would run 50 polls
    and exit 0."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.touch()
        self.run_dir, self.pid, self.polls, self.killed = cwd, 0, 0, False
        self.command_exit: int | None = None
        self.tree_exit_s = 60.0
        self.leftovers: tuple[str, ...] = ()
        self.status_at_takeover: bytes | None = None

    def poll(self) -> int | None:
        self.polls += 1
        if self.polls == 2:
            lease.acquire(self.run_dir, leader_of("6"), "6", alive=lambda job: True)  # a local holder: taken over
            self.status_at_takeover = (self.run_dir / STATUS).read_bytes()
        if self.killed:
            return -9
        return 0 if self.polls > 50 else None

    def kill(self) -> int:
        self.killed = True
        return -9

    def forward(self, sig: int, recipients: Any) -> list[int]:
        return []


def test_a_leader_whose_lease_is_taken_while_training_ends_its_trainer_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan: JobPlan = replace(plan_for(f"run_dir={run_dir}", "swift.max_steps=20"), tiny_cache=None)
    trainers: list[TakenOver] = []

    def start(argv: list[str], env: dict[str, str], log_path: Path, cwd: Path) -> TakenOver:
        trainers.append(TakenOver(argv, env, log_path, cwd))
        return trainers[-1]

    monkeypatch.setattr(watch, "Trainer", start)
    monkeypatch.setattr(watch, "POLL_S", 0.0)

    result = attempt.run(run_dir, plan, SlurmEnv.local({}))

    (trainer,) = trainers
    assert trainer.killed and trainer.polls < 50  # ended at the poll after the takeover, not at its own exit
    assert result.decision == "stop" and "to job 6 (token 2)" in result.why, result
    assert (run_dir / STATUS).read_bytes() == trainer.status_at_takeover  # the new leader's from then on
    assert not (run_dir / ATTEMPTS).exists()
    told = jsonio.read_json(attempt_dir(run_dir, attempt.attempt_id(SlurmEnv.local({}))) / OUTCOME)
    assert told is not None and told["action"] == "end"  # this job's other nodes end too


# --- uploads --------------------------------------------------------------------------------------------------


class RecordingStore:
    """Stands in for CheckpointStore: records the steps it is asked to upload."""

    def __init__(self) -> None:
        self.spec = StorageSpec(bucket="b", prefix="run", background_priority="normal")
        self.uploaded: list[int] = []

    def upload(self, checkpoint: Path) -> UploadResult:
        step = ck.checkpoint_step(checkpoint) or 0
        self.uploaded.append(step)
        return UploadResult(step, 1, 1, 0.0)

    def committed_steps(self) -> list[int]:
        return sorted(self.uploaded)

    def prune(self, keep: int) -> list[int]:
        return []

    def cancel(self) -> None:
        pass


def test_an_uploader_whose_job_lost_the_lease_uploads_nothing_further(tmp_path: Path) -> None:
    held = lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    assert isinstance(held, lease.Lease)
    store = RecordingStore()
    uploader = Uploader(store, leads=held.holds)  # type: ignore[arg-type]
    uploader.submit(committed(tmp_path / "output", 10))
    deadline = time.monotonic() + 60
    while 10 not in uploader.remote() and time.monotonic() < deadline:
        time.sleep(0.01)
    lease.acquire(tmp_path, leader_of("6"), "6", alive=lambda job: False)
    uploader.submit(committed(tmp_path / "output", 20))
    assert uploader.drain(timeout_s=60) == []
    assert store.uploaded == [10]
    assert "not uploading checkpoint-20" in uploader.failures()[-1] and "lease" in uploader.failures()[-1]


def test_node_sync_of_a_job_that_lost_the_lease_submits_nothing_and_leaves_sync_json(tmp_path: Path) -> None:
    held = lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    assert isinstance(held, lease.Lease)
    committed(tmp_path / "output", 10)
    store = RecordingStore()
    sync = NodeSync(store.spec, tmp_path, tmp_path / "output", store=store, leads=held.holds)  # type: ignore[arg-type]
    lease.acquire(tmp_path, leader_of("6"), "6", alive=lambda job: False)
    sync.poll(time.time())
    assert not (tmp_path / SYNC_STATE).exists()  # the new leader's
    assert sync.uploader.pending() == []
    sync.stop()
    assert store.uploaded == []


def test_a_leader_that_cannot_take_the_lease_says_why_in_the_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run dir on a filesystem without hard links cannot fence its leader: the run stops, and its run dir
    says why (the soak's first FUSE passthrough had no link: the job failed with status.json still unwritten)."""

    def no_links(*_: object) -> None:
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    plan: JobPlan = replace(plan_for(f"run_dir={run_dir}", "swift.max_steps=20"), tiny_cache=None)
    plan_file(run_dir).write_text(plan.to_json())  # written at submission
    monkeypatch.setattr(os, "link", no_links)
    monkeypatch.setattr(watch, "Trainer", lambda *_: pytest.fail("no trainer without the lease"))
    with pytest.raises(NodeError, match="cannot take the lease"):
        attempt.run(run_dir, plan, SlurmEnv.local({}))
    status = jsonio.read_json(run_dir / STATUS)
    assert status is not None and status["state"] == "failed" and "cannot take the lease" in status["why"], status
    [row] = read_attempts(run_dir)
    assert row.decision == "stop" and "HINT: put run_dir on a filesystem with hard links" in row.why, row
    told = jsonio.read_json(resume_file(run_dir, attempt.attempt_id(SlurmEnv.local({}))))
    assert told is not None and "cannot take the lease" in told.get("error", ""), told  # the other nodes stop
