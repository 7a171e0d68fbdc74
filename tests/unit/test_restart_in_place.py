"""Restart in place (attempt.py's CONCLUDE -> ACT -> AGREE_ON_RESUME, with outcome.py): a trainer that fails
while every node is alive starts again inside the same allocation from the newest commit, as a new attempt
(`<job>.i<K>`) recorded in attempts.jsonl; the followers take the leader's published word; a failure that
repeats without progress stops the run with "stopped: no progress"."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import ResumePoint, commit
from swiftslurm.node import attempt, outcome
from swiftslurm.node.watch import Observed
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import records
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.layout import attempt_dir, output_dir
from swiftslurm.rundir.records import read_attempts, read_status, write_node_result
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

LAST_STEP = 20
KILLED = -9


def local_leader() -> SlurmEnv:
    return SlurmEnv.from_environ({})


def one_node_plan(run_dir: Path, *overrides: str) -> JobPlan:
    plan = plan_for(f"run_dir={run_dir}", f"swift.max_steps={LAST_STEP}", "swift.save_steps=10", *overrides)
    return replace(plan, tiny_cache=None)


def committed(run_dir: Path, step: int) -> None:
    folder = output_dir(run_dir) / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of step %d" % step)
    commit(folder, world_size=1, swift_version="test", last_step=LAST_STEP)


Script = list[tuple[int | None, int]]  # per trainer run: the step it commits (None: none), its exit code


@pytest.fixture
def trainer(monkeypatch: pytest.MonkeyPatch) -> Callable[[Script], list[tuple[str, ResumePoint]]]:
    """Replaces the trainer with a script; returns the (attempt, resume point) of every run."""

    def install(script: Script) -> list[tuple[str, ResumePoint]]:
        runs: list[tuple[str, ResumePoint]] = []

        def fake_train(plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt_id: str, resume: ResumePoint, *_: object):  # type: ignore[no-untyped-def]
            step, code = script[len(runs)]
            runs.append((attempt_id, resume))
            if step is not None:
                committed(run_dir, step)
            started = 1.0
            watch = ProgressWatch(Path("/dev/null"), started)
            return Observed(code, [], False, watch, started)

        monkeypatch.setattr(attempt, "train", fake_train)
        return runs

    return install


def test_a_killed_trainer_restarts_in_place_from_the_newest_commit_and_finishes(
    tmp_path: Path, trainer: Callable[[Script], list[tuple[str, ResumePoint]]]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs = trainer([(10, KILLED), (LAST_STEP, 0)])

    result = attempt.run(run_dir, one_node_plan(run_dir), local_leader())

    (first, fresh), (second, resumed) = runs
    assert second == f"{first}.i1"  # a new attempt, in the same allocation
    assert (fresh.step, resumed.step) == (0, 10)  # from the newest commit
    assert (result.decision, result.exit_code) == ("done", 0)
    killed, finished = read_attempts(run_dir)
    assert (killed.attempt, killed.reason, killed.decision) == (first, "infra", "restart"), killed
    assert "restarted in place (1 of 5)" in killed.why, killed
    assert (finished.attempt, finished.reason, finished.decision) == (second, "finished", "done")
    assert (read_status(run_dir) or {})["state"] == "finished"
    published = json.loads((attempt_dir(run_dir, first) / "outcome.json").read_text())
    assert published == {"action": "restart", "next_attempt": second, "nonce": None}  # what the followers read


def test_restarts_without_progress_stop_the_run_with_no_progress(
    tmp_path: Path, trainer: Callable[[Script], list[tuple[str, ResumePoint]]]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs = trainer([(10, KILLED)] + [(None, KILLED)] * 9)

    result = attempt.run(run_dir, one_node_plan(run_dir), local_leader())

    records = read_attempts(run_dir)
    # The first run committed step 10 (progress); the next three did not: the fourth without progress stops.
    assert [r.decision for r in records] == ["restart", "restart", "restart", "restart", "stop"], records
    assert len(runs) == 5
    assert result.decision == "stop" and result.why.startswith("stopped: no progress"), result
    assert all(resume.step == 10 for _, resume in runs[1:])


def test_a_spent_restart_budget_falls_back_to_the_requeue(
    tmp_path: Path, trainer: Callable[[Script], list[tuple[str, ResumePoint]]]
) -> None:
    """Outside SLURM a requeue is a retry in this process; the restart budget is per allocation."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    runs = trainer([(5, KILLED), (10, KILLED), (LAST_STEP, 0)])
    plan = one_node_plan(run_dir, "resilience.max_restarts=1", "resilience.backoff_base_s=0")

    attempt.run(run_dir, plan, local_leader())

    ids = [a for a, _ in runs]
    assert ids == [ids[0], f"{ids[0]}.i1", f"{ids[0]}.i1.retry1"]
    assert [r.decision for r in read_attempts(run_dir)] == ["restart", "requeue", "done"]


def test_a_follower_takes_the_leaders_word(tmp_path: Path) -> None:
    here = tmp_path / "logs" / "77"
    outcome.publish(here, outcome.Outcome("restart", "77.i1"), nonce="job-run-1")
    assert outcome.wait_for(here, "job-run-1") == outcome.Outcome("restart", "77.i1")


def test_a_peer_whose_trainer_failed_ends_this_nodes_trainer(tmp_path: Path) -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_JOB_NUM_NODES": "2", "SLURM_NODEID": "0"}
    peer = attempt._PeerFailed(tmp_path, SlurmEnv.from_environ({**env, "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}))
    assert not peer.failed()
    write_node_result(tmp_path, 1, "n2", 0)  # finished or saved on a stop signal: not a failure
    assert not peer.failed()
    write_node_result(tmp_path, 1, "n2", 1)
    assert peer.failed()


def test_a_node_looks_for_failed_peers_with_one_listing_not_a_file_operation_per_peer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asked at every poll of the trainer on every node: a read of each peer's result made the run dir's traffic
    grow with the square of the node count (473 operations/s at 16 nodes). Only results that are there are read."""
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-16]", "SLURM_JOB_NUM_NODES": "16", "SLURM_NODEID": "3"}
    peer = attempt._PeerFailed(tmp_path, SlurmEnv.from_environ({**env, "SLURM_PROCID": "3", "SLURM_NTASKS": "16"}))
    read: list[Path] = []
    monkeypatch.setattr(records, "peek_json", lambda path: read.append(path))
    monkeypatch.setattr(Path, "is_file", lambda path: pytest.fail(f"stat of {path}"))
    assert not peer.failed() and read == []
    write_node_result(tmp_path, 9, "n10", 1)
    monkeypatch.undo()
    assert peer.failed()


def test_attempt_ids_name_the_requeue_the_restart_and_the_retry() -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n1", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0"}
    where = SlurmEnv.from_environ({**env, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_RESTART_COUNT": "2"})
    assert attempt.attempt_id(where) == "77.r2"
    assert attempt.attempt_id(where, restart=3) == "77.r2.i3"
