"""Issue 14, items 1 and 4 on real files: a checkpoint resumes only the plan that committed it (run identity),
and one job leads a run dir (the lease, its fencing token, the nonce in resume.json). SLURM is asked through
the `alive` callable the node code takes, or faked at its one seam (slurm_cli.run)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm import slurm as slurm_cli
from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.engines.hooks import IDENTITY_ENV, Committer
from swiftslurm.errors import ConfigError, NodeError, SubmitError
from swiftslurm.launch import prepare_run_dir
from swiftslurm.node import heartbeat, resume
from swiftslurm.node.conclude import close_lost_attempt
from swiftslurm.node.watch import FAST_POLL_FOR_S, FAST_POLL_S, POLL_S, trainer_env, wait_pause
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import lease, records
from swiftslurm.rundir.layout import ATTEMPTS, LEADER_BEAT, OPEN_ATTEMPT, QUARANTINE, RESUME, lease_dir
from swiftslurm.rundir.records import AttemptRecord
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for


def leader_of(job: str, restart: int = 0) -> SlurmEnv:
    return SlurmEnv(job_id=job, hosts=("n1",), node_id=0, num_nodes=1, proc_id=0, num_tasks=1, restart_count=restart)


def lease_files(run_dir: Path) -> dict[str, str]:
    return {path.name: path.read_text() for path in lease_dir(run_dir).iterdir()}


def a_plan(run_dir: Path, *overrides: str) -> JobPlan:
    return replace(plan_for(f"run_dir={run_dir}", *overrides), tiny_cache=None)


def checkpoint(output: Path, step: int, identity: str | None, commit: bool = True) -> Path:
    folder = output / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of step %d" % step)
    if commit:
        ck.commit(folder, world_size=1, swift_version="test", identity=identity)
    return folder


# --- 1. run identity ---------------------------------------------------------------------------------------


def test_identity_is_what_is_trained_not_how_or_where_it_runs(tmp_path: Path) -> None:
    base = a_plan(tmp_path / "a").identity()
    same = [
        a_plan(tmp_path / "elsewhere"),  # the output dir inside the run dir is in swift_argv
        a_plan(tmp_path / "a", "cluster.time=2:00:00", "cluster.nccl.timeout_s=60", "keep_checkpoints=2"),
        a_plan(tmp_path / "a", "storage=s3", "storage.bucket=ckpt", "storage.prefix=other/place"),
    ]
    other = [
        a_plan(tmp_path / "a", "swift.learning_rate=0.01"),
        a_plan(tmp_path / "a", "dataset=[/data/other.jsonl]"),
        a_plan(tmp_path / "a", "seed=7"),
    ]
    assert [p.identity() for p in same] == [base] * len(same)
    assert base not in [p.identity() for p in other]


def test_the_manifest_carries_the_identity_the_wrapper_gives_the_trainer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = a_plan(tmp_path / "run")
    env = trainer_env(plan, leader_of("5"), tmp_path / "run")
    assert env[IDENTITY_ENV] == plan.identity()
    monkeypatch.setenv(IDENTITY_ENV, env[IDENTITY_ENV])
    monkeypatch.setattr("swiftslurm.engines.hooks.swift_version", lambda: "test")
    folder = checkpoint(plan.output_dir, 10, None, commit=False)
    committer = Committer("swift")
    committer.after_save(folder, None)
    committer.wait()
    manifest = ck.read_manifest(folder)
    assert manifest is not None
    assert (manifest["plan_identity"], manifest["world_size"], manifest["engine"]) == (plan.identity(), 1, "swift")


def test_a_checkpoint_of_another_plan_is_not_resumed_and_nothing_is_moved(tmp_path: Path) -> None:
    output = tmp_path / "output"
    checkpoint(output, 10, identity="aaaaaaaaaaaaaaaa")
    newer = checkpoint(output, 20, None, commit=False)
    with pytest.raises(NodeError) as refused:
        ck.prepare_resume(output, tag="7", move=True, identity="bbbbbbbbbbbbbbbb")
    message = str(refused.value)
    assert "aaaaaaaaaaaaaaaa" in message and "bbbbbbbbbbbbbbbb" in message and "HINT" in message
    assert newer.is_dir() and not (output / QUARANTINE).exists()


def test_a_checkpoint_committed_before_identities_is_resumed(tmp_path: Path) -> None:
    older_swiftslurm = checkpoint(tmp_path, 10, identity=None)
    assert ck.prepare_resume(tmp_path, tag="7", move=True, identity="bbbbbbbbbbbbbbbb").checkpoint == older_swiftslurm
    own = checkpoint(tmp_path, 20, identity="bbbbbbbbbbbbbbbb")
    assert ck.prepare_resume(tmp_path, tag="8", move=True, identity="bbbbbbbbbbbbbbbb").checkpoint == own


def test_the_leader_tells_its_followers_when_it_refuses_another_plans_checkpoint(tmp_path: Path) -> None:
    plan = a_plan(tmp_path / "run")
    checkpoint(plan.output_dir, 10, identity="aaaaaaaaaaaaaaaa")
    here = tmp_path / "run" / "logs" / "5"
    with pytest.raises(NodeError):
        resume.agree_on_resume(plan, here, leader=True, nonce="5@t")
    published = json.loads((here / RESUME).read_text())
    assert "another plan" in published["error"] and published["nonce"] == "5@t"


def test_a_run_dir_of_another_plan_with_a_commit_is_refused_naming_the_settings_that_differ(tmp_path: Path) -> None:
    plan = a_plan(tmp_path / "run")
    prepare_run_dir(plan, "")
    prepare_run_dir(a_plan(tmp_path / "run", "cluster.time=2:00:00"), "")  # how it runs: the same run
    checkpoint(plan.output_dir, 10, identity=plan.identity())
    with pytest.raises(ConfigError) as refused:
        prepare_run_dir(a_plan(tmp_path / "run", "swift.learning_rate=0.01", "swift.lora_rank=4"), "")
    assert "--learning_rate 0.001 → 0.01; --lora_rank 8 → 4" in str(refused.value), refused.value
    assert "committed checkpoint-10" in str(refused.value)


def test_a_run_dir_whose_run_committed_nothing_is_planned_again_in_place(tmp_path: Path) -> None:
    """A user error (`target_modules` naming no module) stops the run before anything is committed; the rerun
    with the fix and the same run_dir must be taken, the old run's files kept aside, not refused."""
    from swiftslurm.launch import check_run_dir, write_run_dir

    run_dir = tmp_path / "run"
    prepare_run_dir(a_plan(run_dir, "swift.target_modules=[no_such_module]"), "")
    records.write_status(run_dir, "failed", reason="user_error", why="user error: target modules not found")
    fixed = a_plan(run_dir, "swift.target_modules=[all-linear]")
    checked = check_run_dir(fixed)
    assert checked.replaces == ("--target_modules no_such_module → all-linear",)
    assert "planned again in place" in (checked.note(run_dir) or "")
    write_run_dir(fixed, "", checked)
    assert JobPlan.load(run_dir / "plan.json").identity() == fixed.identity()
    assert not (run_dir / "status.json").exists()  # the new run starts with no state of the old one
    [kept] = (run_dir / "replaced").iterdir()
    assert "no_such_module" in (kept / "plan.json").read_text() and (kept / "status.json").is_file()


# --- 4. one leader per run: the lease ---------------------------------------------------------------------


def test_the_token_rises_with_each_acquisition_and_a_requeue_takes_its_own_lease(tmp_path: Path) -> None:
    first = lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: True)
    again = lease.acquire(tmp_path, leader_of("5", restart=1), "5.r1", alive=lambda job: True)
    assert isinstance(first, lease.Lease) and isinstance(again, lease.Lease)
    assert (first.token, again.token) == (1, 2)
    assert lease.read(tmp_path)["job"] == "5"


def test_a_second_job_does_not_lead_while_slurm_holds_the_first(tmp_path: Path) -> None:
    held = lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    before = lease_files(tmp_path)
    refused = lease.acquire(tmp_path, leader_of("6"), "6", alive=lambda job: job == "5")
    assert isinstance(held, lease.Lease) and isinstance(refused, str)
    assert "job 5 holds the lease" in refused and "HINT" in refused and "\n" not in refused
    assert lease_files(tmp_path) == before  # the holder's lease is untouched


def test_a_leader_whose_slurm_cannot_be_asked_does_not_take_over(tmp_path: Path) -> None:
    def unreachable(job: str) -> bool:
        raise SubmitError("`squeue -h -j 5 -o %T` failed: Socket timed out on send/recv operation")

    lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    refused = lease.acquire(tmp_path, leader_of("6"), "6", alive=unreachable)
    assert isinstance(refused, str) and "could not say" in refused


def test_a_leader_that_lost_the_lease_quarantines_nothing(tmp_path: Path) -> None:
    plan = a_plan(tmp_path / "run")
    run_dir = Path(plan.run_dir)
    checkpoint(plan.output_dir, 10, identity=plan.identity())
    newer = checkpoint(plan.output_dir, 20, None, commit=False)  # what a quarantine would move
    old = lease.acquire(run_dir, leader_of("5"), "5", alive=lambda job: False)
    lease.acquire(run_dir, leader_of("6"), "6", alive=lambda job: False)  # SLURM said job 5 was gone
    assert isinstance(old, lease.Lease)
    with pytest.raises(lease.LeaseLost, match="not doing: quarantine"):
        resume.agree_on_resume(plan, run_dir / "logs" / "5", leader=True, lease=old, nonce="5@t")
    assert newer.is_dir() and not (plan.output_dir / QUARANTINE).exists()


def test_a_leader_that_lost_the_lease_closes_no_attempt(tmp_path: Path) -> None:
    plan = a_plan(tmp_path / "run")
    run_dir = Path(plan.run_dir)
    run_dir.mkdir()
    (run_dir / OPEN_ATTEMPT).write_text(json.dumps({"attempt": "4", "job_id": "4", "start": 1.0}))
    old = lease.acquire(run_dir, leader_of("5"), "5", alive=lambda job: False)
    lease.acquire(run_dir, leader_of("6"), "6", alive=lambda job: False)
    assert isinstance(old, lease.Lease)
    with pytest.raises(lease.LeaseLost):
        close_lost_attempt(run_dir, plan, leader_of("5"), "5", old, alive=lambda job: False)
    assert not (run_dir / ATTEMPTS).exists()
    assert records.read_open_attempt(run_dir) == AttemptRecord("4", "4", start=1.0)


def test_an_open_attempt_whose_job_slurm_still_holds_is_not_lost(tmp_path: Path) -> None:
    plan = a_plan(tmp_path / "run")
    run_dir = Path(plan.run_dir)
    run_dir.mkdir()
    (run_dir / OPEN_ATTEMPT).write_text(json.dumps({"attempt": "4", "job_id": "4", "start": 1.0}))
    why = close_lost_attempt(run_dir, plan, leader_of("5"), "5", alive=lambda job: job == "4")
    assert why is not None and "SLURM still holds job 4" in why
    assert not (run_dir / ATTEMPTS).exists()
    assert close_lost_attempt(run_dir, plan, leader_of("5"), "5", alive=lambda job: False) is None
    assert records.read_attempts(run_dir)[0].attempt == "4"  # gone from SLURM: lost


def commit_with_a_committer(folder: Path) -> None:
    committer = Committer("swift")
    committer.after_save(folder, None)
    committer.wait()


def test_the_trainer_prunes_only_while_its_leader_holds_the_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = tmp_path / "output"
    for step in (10, 20):
        checkpoint(output, step, identity=None)
    third = checkpoint(output, 30, None, commit=False)
    held = lease.acquire(tmp_path, leader_of("5"), "5", alive=lambda job: False)
    lease.acquire(tmp_path, leader_of("6"), "6", alive=lambda job: False)
    assert isinstance(held, lease.Lease)
    monkeypatch.setenv("SWIFTSLURM_KEEP_CHECKPOINTS", "1")
    monkeypatch.setenv("SWIFTSLURM_RUN_DIR", str(tmp_path))
    monkeypatch.setenv(lease.TOKEN_ENV, str(held.token))
    monkeypatch.setattr("swiftslurm.engines.hooks.swift_version", lambda: "test")
    commit_with_a_committer(third)
    assert [p.name for _, p in ck.checkpoint_dirs(output)] == ["checkpoint-10", "checkpoint-20", "checkpoint-30"]
    monkeypatch.setenv(lease.TOKEN_ENV, str(held.token + 1))  # the holder's own token: it prunes
    commit_with_a_committer(third)
    assert [p.name for _, p in ck.checkpoint_dirs(output)] == ["checkpoint-30"]


# --- 4. the nonce in resume.json -------------------------------------------------------------------------


def test_a_follower_waits_past_a_stale_resume_file_of_an_earlier_job_with_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Job ids restart at 1 on a wiped cluster: logs/5/resume.json may be an earlier job 5's choice."""
    stale = tmp_path / RESUME
    stale.write_text(json.dumps({"checkpoint": "/old/checkpoint-90", "step": 90, "nonce": "5@2026-01-01T00:00:00"}))
    monkeypatch.setattr(heartbeat, "STALE_S", 0.0)  # node 0 never beats here: stop at the first look
    with pytest.raises(NodeError, match="has not published"):
        resume._wait_for_choice(stale, tmp_path / LEADER_BEAT, nonce="5@2026-12-01T08:00:00")
    stale.write_text(json.dumps({"checkpoint": None, "step": 0, "nonce": "5@2026-12-01T08:00:00"}))
    assert resume._wait_for_choice(stale, tmp_path / LEADER_BEAT, nonce="5@2026-12-01T08:00:00").step == 0


def test_a_follower_looks_for_the_resume_point_often_in_its_first_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leader publishes within a fraction of a second: a follower sleeping POLL_S from the start lost most of
    one per attempt. Its pauses are asserted, not times."""
    path, pauses = tmp_path / RESUME, []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 3:  # node 0 publishes while this follower sleeps its third pause
            path.write_text(json.dumps({"checkpoint": None, "step": 0, "nonce": "5@t"}))

    monkeypatch.setattr(resume.time, "sleep", sleep)
    assert resume._wait_for_choice(path, tmp_path / LEADER_BEAT, nonce="5@t").step == 0
    assert pauses == [FAST_POLL_S] * 3 and FAST_POLL_S < POLL_S
    assert wait_pause(FAST_POLL_FOR_S) == POLL_S  # after its first second, as often as before


def test_the_nonce_is_the_job_and_the_start_slurm_gave_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(slurm_cli, "run", lambda argv: "JobId=5 JobName=x StartTime=2026-12-01T08:00:00 TimeLimit=1\n")
    assert lease.nonce(leader_of("5")) == "5@2026-12-01T08:00:00"
    assert lease.nonce(SlurmEnv.local({})) is None


def test_the_nonce_is_the_batch_scripts_name_for_the_job_run_without_asking_slurm(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every node forms the nonce: from the batch script's SWIFTSLURM_JOB_RUN, not one scontrol call per node."""
    asked: list[list[str]] = []
    monkeypatch.setattr(slurm_cli, "run", lambda argv: asked.append(argv) or "JobId=5 StartTime=x\n")
    env = {"SLURM_JOB_ID": "5", "SLURM_PROCID": "3", "SLURM_NODEID": "3", "SLURM_JOB_NODELIST": "n[1-4]"}
    node = SlurmEnv.from_environ({**env, "SWIFTSLURM_JOB_RUN": "5@1796545200.123"})
    assert lease.nonce(node) == "5@1796545200.123" and asked == []
    # another job's (an sbatch from inside a job passes its environment on) is not this job run's name
    assert SlurmEnv.from_environ({**env, "SWIFTSLURM_JOB_RUN": "4@1796545100.0"}).job_run is None
    assert lease.nonce(SlurmEnv.from_environ(env)) == "5@x" and len(asked) == 1  # a hand-written script: SLURM's
