"""The SKIP phase of attempt.py: an attempt whose newest committed checkpoint is the run's last step (the last
attempt committed it, then was killed before recording that it finished) starts no trainer and records the run
`finished`. A checkpoint below the last step is not complete: that attempt trains."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import commit, is_last_step, prepare_resume, read_manifest
from swiftslurm.node import attempt
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.layout import OPEN_ATTEMPT, attempt_dir, output_dir, resume_file
from swiftslurm.rundir.records import read_attempts, read_status
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

LAST_STEP = 20
JOB = "4242"


class Trained(Exception):
    """Raised by the fake trainer: the attempt went on to train."""


def requeued_leader() -> SlurmEnv:
    """Node 0 of a one-node job that SLURM has requeued once (the attempt after a killed one)."""
    env = {
        "SLURM_JOB_ID": JOB,
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_RESTART_COUNT": "1",
    }
    return SlurmEnv.from_environ(env)


def one_node_plan(run_dir: Path) -> JobPlan:
    plan = plan_for(f"run_dir={run_dir}", f"swift.max_steps={LAST_STEP}", "swift.save_steps=10")
    assert plan.topology.nodes == 1
    return replace(plan, tiny_cache=None)  # nothing to build: the trainer never runs here


def committed_checkpoint(run_dir: Path, step: int, last_step: int | None) -> Path:
    folder = output_dir(run_dir) / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of step %d" % step)
    commit(folder, world_size=2, swift_version="test", last_step=last_step)
    return folder


def killed_first_attempt(run_dir: Path) -> None:
    """The first attempt opened its record and was killed before closing it."""
    (run_dir / OPEN_ATTEMPT).write_text(json.dumps({"attempt": JOB, "job_id": JOB, "start": 1.0}))


@pytest.fixture
def no_trainer(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Replaces the trainer launch: records the resume point it was asked to train from, then raises."""
    calls: list[object] = []

    def fake_train(plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt_id: str, resume: object, *_: object):  # type: ignore[no-untyped-def]
        calls.append(resume)
        raise Trained(f"the trainer was started from {resume}")

    monkeypatch.setattr(attempt, "train", fake_train)
    return calls


def test_a_run_committed_at_its_last_step_starts_no_trainer_and_is_finished(
    tmp_path: Path, no_trainer: list[object]
) -> None:
    run_dir = tmp_path / "run"
    last = committed_checkpoint(run_dir, LAST_STEP, last_step=LAST_STEP)
    killed_first_attempt(run_dir)

    result = attempt.run(run_dir, one_node_plan(run_dir), requeued_leader())

    assert no_trainer == []
    assert (result.decision, result.exit_code, result.resumed_from) == ("done", 0, str(last))
    lost, skipped = read_attempts(run_dir)
    assert (lost.attempt, lost.reason, lost.decision) == (JOB, "infra", "requeue"), lost
    assert skipped.attempt == f"{JOB}.r1", skipped
    assert (skipped.reason, skipped.decision, skipped.exit_code) == ("finished", "done", 0), skipped
    assert skipped.resume_step == skipped.committed_step == LAST_STEP, skipped
    assert skipped.last_step is None and skipped.first_step_at is None, skipped  # nothing trained
    status = read_status(run_dir)
    assert status is not None and (status["state"], status["committed_step"]) == ("finished", LAST_STEP), status
    chosen = json.loads(resume_file(run_dir, skipped.attempt).read_text())
    expected = {"checkpoint": str(last), "step": LAST_STEP, "complete": True, "nonce": None}  # no such SLURM job
    assert chosen == expected  # what the other nodes read
    assert not (attempt_dir(run_dir, skipped.attempt) / "node0.log").exists()  # no trainer output either


def test_a_checkpoint_below_its_last_step_is_trained_from(tmp_path: Path, no_trainer: list[object]) -> None:
    run_dir = tmp_path / "run"
    committed_checkpoint(run_dir, 10, last_step=LAST_STEP)

    with pytest.raises(Trained):
        attempt.run(run_dir, one_node_plan(run_dir), requeued_leader())

    [resume] = no_trainer
    assert (resume.step, resume.complete) == (10, False)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("step", "last_step", "complete"),
    [
        (LAST_STEP, LAST_STEP, True),
        (10, LAST_STEP, False),
        (LAST_STEP - 1, LAST_STEP, False),
        (LAST_STEP, None, False),  # a manifest from before `last_step` was recorded: train as before
    ],
)
def test_only_a_commit_of_the_last_step_is_complete(
    tmp_path: Path, step: int, last_step: int | None, complete: bool
) -> None:
    folder = committed_checkpoint(tmp_path, step, last_step)
    assert is_last_step(read_manifest(folder)) is complete
    point = prepare_resume(output_dir(tmp_path), tag="t", move=True)
    assert (point.checkpoint, point.step, point.complete) == (folder, step, complete)


def test_an_uncommitted_checkpoint_past_the_last_step_is_set_aside_and_the_run_is_complete(tmp_path: Path) -> None:
    last = committed_checkpoint(tmp_path, LAST_STEP, LAST_STEP)
    beyond = output_dir(tmp_path) / f"checkpoint-{LAST_STEP + 1}"
    beyond.mkdir()
    point = prepare_resume(output_dir(tmp_path), tag="t", move=True)
    assert (point.checkpoint, point.complete) == (last, True)
    assert [p.name for p in point.quarantined] == [f"checkpoint-{LAST_STEP + 1}.t"]
