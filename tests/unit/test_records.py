"""What the run dir records about how an attempt ended, whoever submitted the job (issue 17, items 5 and 9): a
wrapper's refusal before the attempt starts (status.json says why), one line per refusal on stderr, and no
attempt_open.json left behind by a concluded attempt."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import NodeError
from swiftslurm.launch import prepare_run_dir
from swiftslurm.node import __main__ as node_main
from swiftslurm.node import attempt, conclude
from swiftslurm.node.supervise import run_node
from swiftslurm.ops import control as ops
from swiftslurm.ops.runs import SlurmView
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import records
from swiftslurm.rundir.layout import ATTEMPTS, CANCELLED, OPEN_ATTEMPT, STATUS, lease_file, plan_file
from swiftslurm.rundir.records import AttemptRecord, read_attempts, read_status, record_submission
from swiftslurm.rundir.sweepdir import LEGACY_SWEEP_FILE, read_points, record_point, record_resubmission
from swiftslurm.slurm_env import SlurmEnv
from swiftslurm.submit import jobs as submit
from tests.conftest import plan_for
from tests.unit.test_errors import Writes

JOB = "4343"


def slurm_env(nodes: int, node: int = 0) -> dict[str, str]:
    """SLURM's variables for node ``node`` of a job of ``nodes`` nodes (one task each)."""
    hosts = ",".join(f"n{i + 1}" for i in range(nodes))
    return {
        "SLURM_JOB_ID": JOB,
        "SLURM_JOB_NODELIST": hosts,
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_NTASKS": str(nodes),
    }


def one_node_run_dir(tmp_path: Path) -> tuple[Path, JobPlan]:
    run_dir = tmp_path / "run"
    plan = replace(plan_for(f"run_dir={run_dir}", "+cluster=local-slurm", "cluster.nodes=1"), tiny_cache=None)
    assert plan.topology.nodes == 1
    prepare_run_dir(plan, "")
    return run_dir, plan


def test_a_wrong_node_count_is_recorded_in_status_with_the_fix(tmp_path: Path) -> None:
    """`sbatch --nodes=2` of a 1-node plan: the wrapper refuses, and status.json says why (was: no record, and
    `status` showed `unknown` with no reason; the explanation was only in the job's log, wherever that was)."""
    run_dir, plan = one_node_run_dir(tmp_path)

    with pytest.raises(NodeError, match="--nodes=1") as refused:
        attempt.run(run_dir, plan, SlurmEnv.from_environ(slurm_env(2)))

    status = read_status(run_dir)
    assert status is not None, "no status.json"
    assert (status["state"], status["reason"], status["why"]) == ("failed", "user_error", str(refused.value))
    assert status["job_id"] == JOB
    [record] = read_attempts(run_dir)
    assert (record.attempt, record.refused, record.decision) == (JOB, True, "stop")
    assert not lease_file(run_dir).exists()  # a resubmission starting while this job completes may lead


def test_a_follower_that_refuses_records_nothing(tmp_path: Path) -> None:
    """Node 0 alone writes the run's records (it refuses the same allocation at the same time)."""
    run_dir, plan = one_node_run_dir(tmp_path)
    with pytest.raises(NodeError):
        attempt.run(run_dir, plan, SlurmEnv.from_environ(slurm_env(2, node=1)))
    assert not (run_dir / STATUS).exists() and not (run_dir / ATTEMPTS).exists()


def test_a_refused_job_beside_the_runs_leader_changes_nothing(tmp_path: Path) -> None:
    """A second job of the run dir with a wrong node count, while the first still runs: the first's records
    stand (only the lease's holder writes them)."""
    run_dir, _ = one_node_run_dir(tmp_path)
    (run_dir / "lease.json").write_text(json.dumps({"job": "99", "token": 3}))
    (run_dir / STATUS).write_text(json.dumps({"state": "running", "job_id": "99"}))

    where = SlurmEnv.from_environ(slurm_env(2))
    assert not conclude.record_refusal(run_dir, where, JOB, "wrong node count", alive=lambda job: job == "99")

    assert read_status(run_dir) == {"state": "running", "job_id": "99"}
    assert not (run_dir / ATTEMPTS).exists()


def test_a_changed_plan_is_recorded_in_status(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, _ = one_node_run_dir(tmp_path)
    plan_file(run_dir).write_text(plan_file(run_dir).read_text().replace('"run_name"', '"run_name" ', 1))
    for name, value in slurm_env(1).items():
        monkeypatch.setenv(name, value)

    with pytest.raises(NodeError, match="changed since the run dir was prepared"):
        run_node(str(run_dir))

    status = read_status(run_dir)
    assert status is not None and status["state"] == "failed" and "never edit plan.json" in status["why"]


def test_the_wrappers_refusal_is_one_whole_line_on_stderr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """print() wrote the message and its newline in two writes, and srun's own error line landed between them:
    `...cluster.nodes=1.srun: error: ...`. The line now arrives whole, newline included."""
    stderr = Writes()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setattr(node_main, "ignore_from_now_on", lambda: None)  # pytest's own process goes on
    assert node_main.main([str(tmp_path / "no-run-dir")]) == 2
    assert len(stderr.calls) == 1 and stderr.calls[0].endswith("\n") and "plan.json" in stderr.calls[0]


def test_a_concluded_attempt_leaves_no_open_mark(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17, item 9: attempt_open.json stayed in every finished run dir. A whole attempt (the SKIP path: the
    run's last step is committed) opens its mark, records itself and removes it; the lost attempt before it is
    recorded as lost."""
    from tests.unit import test_attempt_skip as skip

    monkeypatch.setattr(attempt, "train", lambda *_: pytest.fail("no trainer should start"))
    run_dir = tmp_path / "run"
    skip.committed_checkpoint(run_dir, skip.LAST_STEP, last_step=skip.LAST_STEP)
    skip.killed_first_attempt(run_dir)

    result = attempt.run(run_dir, skip.one_node_plan(run_dir), skip.requeued_leader())

    assert result.decision == "done"
    assert [r.attempt for r in read_attempts(run_dir)] == [skip.JOB, f"{skip.JOB}.r1"]
    assert not (run_dir / OPEN_ATTEMPT).exists()


def test_an_open_mark_of_another_attempt_stays(tmp_path: Path) -> None:
    """Only the recorded attempt's own mark goes: a newer attempt's (opened meanwhile) is left alone."""
    records.open_attempt(tmp_path, AttemptRecord("7.r1"))
    records.close_attempt(tmp_path, AttemptRecord("7"))
    assert records.read_open_attempt(tmp_path) == AttemptRecord("7.r1")
    records.close_attempt(tmp_path, AttemptRecord("7.r1"))
    assert records.read_open_attempt(tmp_path) is None


def failed_point(tmp_path: Path, name: str) -> Path:
    """A prepared run dir whose (local) job is gone without a final record: `resume` submits it again."""
    run_dir = tmp_path / "runs" / name
    prepare_run_dir(replace(plan_for(f"run_dir={run_dir}"), tiny_cache=None), "")
    record_submission(run_dir, "999999999", "local")  # no such process: the job failed
    return run_dir


def test_resume_of_a_sweep_records_the_new_jobs_in_the_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17, item 9: after `swiftslurm resume SWEEP_DIR` the sweep's record still named the old jobs. The
    submission itself is a stand-in here (tests/cluster/test_operations.py submits for real)."""
    sweep_dir = tmp_path / "sweep"
    for num, name in enumerate(("p0", "p1")):
        record_point(sweep_dir, {"num": num, "run_dir": str(failed_point(tmp_path, name)), "job_id": "999999999"})
    new_jobs = iter(["701", "702"])
    monkeypatch.setattr(submit, "submit", lambda plan: SimpleNamespace(job_id=next(new_jobs)))

    assert ops.main(["resume", str(sweep_dir)]) == 0

    points = read_points(sweep_dir)
    assert [(p["job_id"], p["action"]) for p in points] == [("701", "resubmitted"), ("702", "resubmitted")]
    assert [p["num"] for p in points] == [0, 1]


def test_resume_of_a_legacy_sweep_keeps_every_point(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep recorded in sweep.json (before sweep.jsonl): its first resubmission carries all points over."""
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    points = [{"num": n, "run_dir": str(failed_point(tmp_path, f"p{n}")), "job_id": "9"} for n in range(2)]
    (sweep_dir / LEGACY_SWEEP_FILE).write_text(json.dumps({"points": points}))

    record_resubmission(sweep_dir, Path(points[1]["run_dir"]), "703")

    assert [p["job_id"] for p in read_points(sweep_dir)] == ["9", "703"]


class Scancel:
    """slurm_cli.run as SLURM answers scancel: a save signal makes each signalled job's wrapper record its attempt
    (what the real wrapper does, shortened to at once), so the calls show the order of signals and waits."""

    def __init__(self, jobs: dict[str, Path]) -> None:
        self.jobs = jobs  # job id -> its run dir
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], timeout_s: float = 0) -> str:
        self.calls.append(argv)
        if argv[:2] == ["scancel", "--signal=USR2"]:
            for job in argv[2:]:
                records.append_attempt(self.jobs[job], AttemptRecord(job, committed_step=48, reason="cancelled"))
        return ""


def test_cancelling_a_sweep_signals_every_point_before_waiting_for_any(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 17, item 10: `cancel SWEEP_DIR` saved the points one after another (one stopped at step 48 while
    another trained on to 168). Now one save signal reaches all running points, then one wait, then one scancel."""
    sweep_dir = tmp_path / "sweep"
    jobs = {}
    for num, job in enumerate(("501", "502")):
        run_dir = tmp_path / "runs" / f"p{num}"
        prepare_run_dir(replace(plan_for(f"run_dir={run_dir}", "+cluster=local-slurm"), tiny_cache=None), "")
        record_submission(run_dir, job, "slurm")
        record_point(sweep_dir, {"num": num, "run_dir": str(run_dir), "job_id": job})
        jobs[job] = run_dir
    slurm = Scancel(jobs)
    monkeypatch.setattr(slurm_cli, "run", slurm.run)
    monkeypatch.setattr(ops, "ask_slurm", lambda ids: SlurmView(True, dict.fromkeys(ids, "RUNNING")))

    assert ops.main(["cancel", str(sweep_dir)]) == 0

    assert slurm.calls == [["scancel", "--signal=USR2", "501", "502"], ["scancel", "501", "502"]]
    assert all((run_dir / CANCELLED).is_file() for run_dir in jobs.values())


def test_the_newest_wrapper_failure_of_another_node_names_its_node_phase_and_error(tmp_path: Path) -> None:
    from swiftslurm.rundir.records import newest_wrapper_failure, write_wrapper_failure

    logs = tmp_path / "logs"
    assert newest_wrapper_failure(tmp_path, "155") is None
    write_wrapper_failure(logs / "154", 1, "node5", "prepare", RuntimeError("an older job's"))
    write_wrapper_failure(logs / "155.r1", 2, "node6", "agree_on_resume", OSError(5, "Input/output error"))
    said = newest_wrapper_failure(tmp_path, "155")
    assert said is not None and said.startswith("node 2's wrapper (node6) failed in phase agree_on_resume of attempt")
    assert "155.r1" in said and "Input/output error" in said
    assert newest_wrapper_failure(tmp_path, "15") is None  # another job's attempts are not this job's
