"""Run facts for `status`: the state decision, metrics, sweep records, the table (the ledger: test_ledger.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import commit
from swiftslurm.ops import status
from swiftslurm.ops.runs import SlurmView, decide_state, gather
from swiftslurm.rundir.metrics import read_metrics
from swiftslurm.rundir.records import record_submission
from swiftslurm.rundir.sweepdir import read_points, record_point, run_dirs


@pytest.mark.parametrize(
    ("written", "slurm_state", "cancelled", "expected"),
    [
        ("finished", "COMPLETED", False, "finished"),
        ("running", "RUNNING", False, "running"),
        ("requeued", "PENDING", False, "requeued"),
        ("", "PENDING", False, "pending"),
        ("running", "CANCELLED", True, "cancelled"),
        ("requeued", "REQUEUED", True, "cancelled"),  # cancelled while waiting to start again
        ("running", "TIMEOUT", False, "failed"),  # killed before the wrapper could say anything
        ("running", None, False, "running"),  # SLURM unreachable: the run dir's word
        ("", None, False, "pending"),
    ],
)
def test_state_combines_the_run_dir_and_slurm(written: str, slurm_state: str | None, cancelled: bool, expected: str):
    status_json = {"state": written, "why": "x"} if written else {}
    state, _ = decide_state(status_json, slurm_state, cancelled, submitted=True)
    assert state == expected


def write_run(run_dir: Path, losses: list[float], state: str = "finished") -> None:
    (run_dir / "output").mkdir(parents=True)
    plan = {
        "run_name": run_dir.name,
        "topology": {"nodes": 2},
        "batch": {"micro": 1, "grad_accum": 2, "data_parallel": 2},
    }
    (run_dir / "plan.json").write_text(json.dumps(plan))
    lines = [
        {"loss": loss, "global_step/max_steps": f"{i + 1}/{len(losses)}", "train_speed(s/it)": 0.5}
        for i, loss in enumerate(losses)
    ]
    lines.append({"train_runtime": 3.0, "global_step/max_steps": f"{len(losses)}/{len(losses)}"})
    (run_dir / "output" / "logging.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n{torn")
    (run_dir / "status.json").write_text(json.dumps({"state": state, "why": "because"}))
    checkpoint = run_dir / "output" / f"checkpoint-{len(losses)}"
    checkpoint.mkdir()
    (checkpoint / "adapter.bin").write_bytes(b"w")
    commit(checkpoint, world_size=2, swift_version="test")
    record_submission(run_dir, "42", "slurm")


def test_metrics_and_facts_come_from_the_run_dir(tmp_path: Path) -> None:
    run_dir = tmp_path / "r1"
    write_run(run_dir, [3.0, 2.5, 2.0])
    metrics = read_metrics(run_dir)
    assert (metrics.step, metrics.max_steps, metrics.loss) == (3, 3, 2.0)
    facts = gather(run_dir, SlurmView(available=True, states={"42": "COMPLETED"}))
    assert (facts.state, facts.job_id, facts.committed_step, facts.loss) == ("finished", "42", 3, 2.0)
    assert facts.samples_per_s == pytest.approx(4 / 0.5)  # global batch 4, 0.5 s per step


def test_status_table_and_json_for_a_sweep_dir_say_when_slurm_is_unavailable(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for i, losses in enumerate(([3.0, 2.0], [3.0, 1.5])):
        run_dir = tmp_path / "runs" / f"p{i}"
        write_run(run_dir, losses)
        record_point(tmp_path / "sweep", {"num": i, "run_dir": str(run_dir), "job_id": "42", "overrides": []})
    assert run_dirs(tmp_path / "sweep") == [tmp_path / "runs" / "p0", tmp_path / "runs" / "p1"]
    facts, _ = status.collect(tmp_path / "sweep", use_slurm=False)
    text = status.render(facts, SlurmView(available=False, error="squeue: cannot reach slurmctld"))
    assert "p0" in text and "p1" in text and "2 run(s): 2 finished" in text
    assert "SLURM unavailable (squeue: cannot reach slurmctld)" in text
    assert status.main([str(tmp_path / "sweep"), "--json", "--no-slurm"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sweep"] is True and [r["loss"] for r in out["runs"]] == [2.0, 1.5]


def test_recording_a_point_again_replaces_it(tmp_path: Path) -> None:
    record_point(tmp_path, {"num": 0, "run_dir": "/r0", "job_id": "1"})
    record_point(tmp_path, {"num": 0, "run_dir": "/r0", "job_id": "2"})
    assert [p["job_id"] for p in read_points(tmp_path)] == ["2"]


def test_plots_are_written_for_runs_and_the_sweep(tmp_path: Path) -> None:
    from swiftslurm.ops.plots import plot_path

    for i in range(2):
        write_run(tmp_path / "runs" / f"p{i}", [3.0, 2.0 - i])
        record_point(tmp_path / "sweep", {"num": i, "run_dir": str(tmp_path / "runs" / f"p{i}")})
    facts, _ = status.collect(tmp_path / "sweep", use_slurm=False)
    written = plot_path(tmp_path / "sweep", facts)
    assert tmp_path / "sweep" / "final_loss.png" in written
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written) and len(written) == 5


def test_a_local_job_is_running_while_its_process_lives_and_never_asked_of_slurm(tmp_path: Path) -> None:
    import os

    from swiftslurm.ops.runs import slurm_job_ids

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record_submission(run_dir, str(os.getpid()), "local")
    assert gather(run_dir).state == "running" and slurm_job_ids([run_dir]) == []
    record_submission(run_dir, "999999999", "local")  # no such process
    assert gather(run_dir).state == "failed"


def test_a_run_submitted_by_hand_whose_wrapper_never_started_points_at_slurms_output(tmp_path: Path) -> None:
    """`sbatch RUN_DIR/job.sbatch` writes no job.json, and a wrapper that never started (the node's Python cannot
    import swiftslurm) writes no status.json: SLURM's output file in logs/ is the one trace, and status says so
    instead of calling the run a dry run."""
    from swiftslurm.ops.runs import slurm_job_ids

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"run_name": "r"}))
    assert gather(run_dir).state == "planned"  # a dry run: nothing submitted
    for job in ("9", "77"):  # an earlier submission by hand, then the newest
        (run_dir / "logs" / f"slurm-{job}.out").write_text("ModuleNotFoundError: No module named 'hostlist'\n")
    assert slurm_job_ids([run_dir]) == ["77"]

    failed = gather(run_dir, SlurmView(available=True, states={"77": "FAILED"}))
    assert (failed.state, failed.job_id) == ("failed", "77")
    assert "without a final record" in failed.why and failed.why.endswith(f"see {run_dir}/logs/slurm-77.out")

    unknown = gather(run_dir)  # SLURM not asked
    assert unknown.state == "pending" and unknown.why == (
        f"submitted by hand as job 77; no word from the wrapper yet: see {run_dir}/logs/slurm-77.out"
    )


def test_a_job_refused_the_lease_never_becomes_the_runs_job(tmp_path: Path) -> None:
    """`sbatch RUN_DIR/job.sbatch` a second time while job 10 leads: job 11's wrapper is refused the lease and
    ends (SLURM: FAILED). Status showed the live run `failed`, job 11, because job 11's output file was the
    newest in logs/; the run is job 10's, running, then finished, whatever job 11 did."""
    from swiftslurm.rundir import lease
    from swiftslurm.rundir.records import write_status
    from swiftslurm.slurm_env import SlurmEnv

    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "plan.json").write_text(json.dumps({"run_name": "r"}))
    (run_dir / "logs" / "slurm-10.out").write_text("")
    holder = SlurmEnv(job_id="10", hosts=("n1",), node_id=0, num_nodes=1, proc_id=0, num_tasks=1, restart_count=0)
    assert isinstance(lease.acquire(run_dir, holder, "10", alive=lambda job: True), lease.Lease)
    write_status(run_dir, "running", job_id="10", attempt="10")
    (run_dir / "logs" / "slurm-11.out").write_text("[swiftslurm] job 11 does not lead ...: job 10 holds the lease\n")
    (run_dir / "logs" / "11").mkdir()
    (run_dir / "logs" / "11" / "resume.json").write_text(json.dumps({"error": "job 11 does not lead"}))

    live = gather(run_dir, SlurmView(available=True, states={"10": "RUNNING", "11": "FAILED"}))
    assert (live.state, live.job_id) == ("running", "10"), live
    write_status(run_dir, "finished", job_id="10")
    done = gather(run_dir, SlurmView(available=True, states={"10": "COMPLETED", "11": "FAILED"}))
    assert (done.state, done.job_id) == ("finished", "10"), done


def test_a_resubmitted_run_is_not_hidden_by_the_earlier_jobs_final_state(tmp_path: Path) -> None:
    """`resume` after a cancel: status.json still holds the old job's `cancelled` until the new job's wrapper
    writes; the run is the new job's (pending, running), or `logs -f` right after `resume` ends at once."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "plan.json").write_text(json.dumps({"run_name": "r"}))
    (run_dir / "status.json").write_text(json.dumps({"state": "cancelled", "job_id": "30", "updated": 1000.0}))
    (run_dir / "job.json").write_text(json.dumps({"job_id": "30", "scheduler": "slurm", "submitted": 900.0}))
    assert gather(run_dir).state == "cancelled"
    (run_dir / "job.json").write_text(json.dumps({"job_id": "31", "scheduler": "slurm", "submitted": 1010.0}))
    resumed = gather(run_dir, SlurmView(available=True, states={"31": "PENDING"}))
    assert (resumed.state, resumed.job_id) == ("pending", "31")
    assert gather(run_dir).state == "pending"  # SLURM not asked: submitted, no word yet


def test_a_run_dir_that_restored_another_ones_last_checkpoint_shows_its_loss(tmp_path: Path) -> None:
    """No logging.jsonl and no node log of those steps here: the checkpoint's trainer_state.json holds them."""
    run_dir = tmp_path / "run"
    checkpoint = run_dir / "output" / "checkpoint-40"
    checkpoint.mkdir(parents=True)
    history = [{"loss": 1.5, "step": 20}, {"loss": 0.75, "step": 40}, {"train_runtime": 9.0, "step": 40}]
    (checkpoint / "trainer_state.json").write_text(json.dumps({"max_steps": 40, "log_history": history}))
    metrics = read_metrics(run_dir)
    assert (metrics.loss, metrics.step, metrics.max_steps) == (0.75, 40, 40)
    assert metrics.losses == ((20, 1.5), (40, 0.75))


def test_a_local_run_whose_leader_held_the_lease_is_the_local_jobs(tmp_path: Path) -> None:
    """Outside SLURM the leader holds the lease as `local-<pid>`: never taken for a job submitted by hand."""
    from swiftslurm.ops.submission import submission
    from swiftslurm.rundir import lease
    from swiftslurm.slurm_env import SlurmEnv

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record_submission(run_dir, "999999999", "local")
    assert isinstance(lease.acquire(run_dir, SlurmEnv.from_environ({}), "local-1", alive=lambda job: True), lease.Lease)
    assert submission(run_dir)["job_id"] == "999999999"
    assert gather(run_dir).state == "failed"  # its process is gone, without a final word: not `pending`


def test_the_committed_step_is_read_from_manifests_without_a_look_at_each_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A large job's checkpoint has hundreds of files; `status` over many runs must not stat them all: the
    # manifest says the step is committed, and an attempt checks its files when it resumes from it.
    run_dir = tmp_path / "big"
    write_run(run_dir, [3.0, 2.5])
    older = run_dir / "output" / "checkpoint-1"
    older.mkdir()
    (older / "adapter.bin").write_bytes(b"w")
    commit(older, world_size=2, swift_version="test")
    (run_dir / "output" / "checkpoint-3").mkdir()  # a save in progress: no manifest yet
    stats: list[str] = []
    real_stat = Path.stat

    def counted_stat(self: Path, *args: object, **kwargs: object) -> object:
        if "checkpoint-" in str(self) and self.name != "manifest.json":
            stats.append(self.name)
        return real_stat(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "stat", counted_stat)
    assert gather(run_dir).committed_step == 2
    assert "adapter.bin" not in stats
