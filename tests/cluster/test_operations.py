"""Sweeps and operating runs on the real SLURM cluster with real ms-swift: a 4-point sweep that returns at
once, one point preempted and requeued alone, `wait=true` re-running the sweep to wait for it, status
(table, JSON, plots), `cancel` of a running run, and status with SLURM unreachable.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.rundir.sweepdir import read_points
from swiftslurm.testing.cli import command, swiftslurm
from swiftslurm.testing.cluster import attempts, current_step, queue_state, submit, wait_for_job, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SWEEP = (
    "-m",
    "+cluster=local-slurm",
    "swift.learning_rate=1e-4,2e-4",
    "strategy=ddp,zero2",  # the two multi-process strategies that train on CPUs
    "swift.max_steps=20",
    "swift.save_steps=10",
)
FINISHED_LINE = r"^\d\d:\d\d:\d\d  \S+: (?:\S+ → )?finished$"  # wait=true's line when a point has finished


GATE_PLUGIN = Path(__file__).resolve().parent / "gate_plugin.py"
GATE_FILE = "gate.open"  # gate_plugin.GATE_FILE (importing it would import ms-swift here)
GATE_STEP_ENV = "SWIFTSLURM_TEST_GATE_STEP"
HELD_STEP = 200  # far past where the first attempt is cancelled (step 10 and a few more)


def held_at_the_gate(run_dir: Path) -> bool:
    logs = run_dir.glob("logs/*/node0.log")
    return any(f"holding at step {HELD_STEP}" in log.read_text(errors="replace") for log in logs)


def status_json(path: Path, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = swiftslurm("status", str(path), "--json", cwd=path.parent, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_sweep_returns_at_once_requeues_only_the_preempted_point_and_completes(tmp_path: Path, slurm_cluster: None):
    done = swiftslurm(*SWEEP, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    jobs = re.findall(r"submitted job (\d+)", done.stdout)
    assert len(jobs) == 4, done.stdout
    # It returned while the jobs are still queued or running: the login node is not held.
    assert any(queue_state(job) in ("PENDING", "RUNNING") for job in jobs)
    [sweep_dir] = (tmp_path / "runs" / "sweeps").iterdir()
    runs = [Path(p["run_dir"]) for p in read_points(sweep_dir)]
    assert len(runs) == 4 and len(set(runs)) == 4

    # Preempt one point mid-training.
    victim, victim_job = runs[0], jobs[0]
    wait_until(lambda: current_step(victim) >= 5, 600, "the first point to train")
    subprocess.run(["scancel", "--signal=USR2", victim_job], check=True)
    follow = subprocess.Popen(  # `logs -f` across the requeue: it names the next attempt and ends with the state
        command("logs", "-f", str(victim)), stdout=subprocess.PIPE, text=True
    )

    # The same sweep again, waiting: nothing is resubmitted; it waits for every point and prints the table.
    again = swiftslurm(*SWEEP, "wait=true", cwd=tmp_path, timeout=900)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert "submitted job" not in again.stdout
    assert "4 run(s): 4 finished" in again.stdout
    assert len(re.findall(FINISHED_LINE, again.stdout, re.M)) == 4 and "Launching" not in again.stdout + again.stderr
    followed, _ = follow.communicate(timeout=120)
    assert follow.returncode == 0, followed[-3000:]
    assert f"[swiftslurm logs] attempt {victim_job}.r1 started (the one before: preempted → requeue)" in followed
    assert followed.rstrip().splitlines()[-1].startswith("[swiftslurm logs] run finished")
    assert "lines folded; `logs --verbose` shows them]" in followed  # ms-swift's argument dump

    report = status_json(sweep_dir)
    assert [r["state"] for r in report["runs"]] == ["finished"] * 4
    assert all(r["loss"] is not None and r["committed_step"] == 20 for r in report["runs"])
    assert report["runs"][0]["attempt_reasons"] == ["preempted→requeue", "finished→done"]
    assert all(r["attempts"] == 1 for r in report["runs"][1:])  # only the preempted point was requeued
    assert all(wait_for_job(job) == "COMPLETED" for job in jobs)

    plotted = swiftslurm("status", str(sweep_dir), "--plot", cwd=tmp_path)
    assert plotted.returncode == 0, plotted.stderr
    assert (sweep_dir / "final_loss.png").read_bytes().startswith(b"\x89PNG")
    assert all((run / "loss.png").is_file() for run in runs)


def test_an_array_sweep_is_one_sbatch_and_trains_every_point_to_the_end(tmp_path: Path, slurm_cluster: None):
    """The sweeper's array path end to end (issue 15, item 4): one array, each task an ordinary run."""
    args = ("-m", "+cluster=local-slurm", "seed=1,2", "swift.max_steps=4", "swift.save_steps=4", "array_parallelism=2")
    done = swiftslurm(*args, "wait=true", cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    [array] = re.findall(r"submitted 2 point\(s\) as job array\(s\) \['(\d+)'\]", done.stdout)
    assert "2 run(s): 2 finished" in done.stdout
    assert len(re.findall(FINISHED_LINE, done.stdout, re.M)) == 2 and "Launching" not in done.stdout + done.stderr
    [sweep_dir] = (tmp_path / "runs" / "sweeps").iterdir()
    points = read_points(sweep_dir)
    assert [p["job_id"] for p in points] == [f"{array}_0", f"{array}_1"]
    assert [p["action"] for p in points] == ["submitted", "submitted"]
    assert all(wait_for_job(p["job_id"]) == "COMPLETED" for p in points)


def test_cancel_stops_a_running_run_for_good_and_status_works_without_slurm(tmp_path: Path, slurm_cluster: None):
    run_dir = tmp_path / "run"
    # The resumed attempt below must still run while SLURM is unreachable, on any machine: it holds at step
    # HELD_STEP (gate_plugin) until the test opens the gate. The first attempt is cancelled long before that.
    gate = (f"swift.external_plugins=[{GATE_PLUGIN}]", "swift.callbacks=[gate]")
    held = f"+cluster.env.{GATE_STEP_ENV}={HELD_STEP}"
    job = submit(run_dir, "swift.max_steps=400", "swift.save_steps=50", *gate, held)
    wait_until(lambda: current_step(run_dir) >= 10, 300, "training to start")
    cancelled = swiftslurm("cancel", str(run_dir), cwd=tmp_path)
    assert cancelled.returncode == 0 and f"cancelled job {job}; saved at step" in cancelled.stdout, cancelled.stderr
    assert wait_for_job(job) in ("CANCELLED", "FAILED")  # `cancel`'s scancel, or the wrapper's own stop first
    [record] = attempts(run_dir)  # not requeued
    assert record["decision"] == "stop" and record["reason"] == "cancelled" and "cancelled" in record["why"]
    assert record["committed_step"] == record["last_step"] >= 10  # it saved the step it was at
    assert status_json(run_dir)["runs"][0]["state"] == "cancelled"

    # SLURM unreachable (no controller configuration): an ended run is answered from its run directory alone
    # (status asks SLURM only about runs that have not ended).
    offline_env = {"SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    offline = swiftslurm("status", str(run_dir), cwd=tmp_path, env=offline_env)
    assert offline.returncode == 0 and "cancelled" in offline.stdout, offline.stdout + offline.stderr

    # A cancelled run is not requeued by anything, but `resume` brings it back from its checkpoint.
    resumed = swiftslurm("resume", str(run_dir), cwd=tmp_path)
    assert resumed.returncode == 0 and "resubmitted as job" in resumed.stdout, resumed.stderr
    new_job = re.search(r"resubmitted as job (\d+)", resumed.stdout)
    assert new_job is not None
    wait_until(lambda: held_at_the_gate(run_dir) or len(attempts(run_dir)) == 2, 300, f"resumed, held at {HELD_STEP}")
    assert len(attempts(run_dir)) == 1, attempts(run_dir)
    # A run that has not ended needs SLURM's word: without it, the run directory still answers, and says so.
    offline = swiftslurm("status", str(run_dir), cwd=tmp_path, env=offline_env)
    assert offline.returncode == 0 and "SLURM unavailable" in offline.stdout, offline.stdout + offline.stderr
    report = status_json(run_dir, env=offline_env)
    assert report["slurm"]["available"] is False and report["runs"][0]["state"] != "cancelled", report
    (run_dir / GATE_FILE).touch()
    subprocess.run(["scancel", new_job.group(1)], check=True)
    wait_until(lambda: len(attempts(run_dir)) == 2, 120, "the resumed attempt's record")
    assert attempts(run_dir)[-1]["resume_step"] == record["committed_step"]


def test_cancel_of_a_sweep_stops_its_points_together_and_resume_records_the_new_jobs(
    tmp_path: Path, slurm_cluster: None
):
    """Issue 17, items 9 and 10: `cancel SWEEP_DIR` saved the points one after another (one stopped at step 48
    while another trained on to 168), each why read "...; preempted after N training steps", and after
    `resume SWEEP_DIR` sweep.jsonl still named the old jobs."""
    args = ("-m", "+cluster=local-slurm", "cluster.nodes=1", "seed=1,2", "swift.max_steps=400", "swift.save_steps=50")
    done = swiftslurm(*args, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    jobs = re.findall(r"submitted job (\d+)", done.stdout)
    assert len(jobs) == 2, done.stdout
    [sweep_dir] = (tmp_path / "runs" / "sweeps").iterdir()
    runs = [Path(p["run_dir"]) for p in read_points(sweep_dir)]
    for run in runs:
        wait_until(lambda r=run: current_step(r) >= 5, 600, f"{run.name} to train")

    cancelled = swiftslurm("cancel", str(sweep_dir), cwd=tmp_path)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.count("cancelled job") == 2, cancelled.stdout
    assert all(wait_for_job(job) in ("CANCELLED", "FAILED") for job in jobs)
    ended = [attempts(run)[-1] for run in runs]
    assert all(r["reason"] == "cancelled" and "preempted" not in r["why"] for r in ended), ended
    # Together: every point had its save signal before any point had recorded its attempt.
    signalled = [t for r in ended for name, t in r["signals"] if name == "SIGUSR2"]
    assert len(signalled) == 2 and max(signalled) < min(r["end"] for r in ended), ended

    resumed = swiftslurm("resume", str(sweep_dir), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    new_jobs = re.findall(r"resubmitted as job (\d+)", resumed.stdout)
    try:
        assert len(new_jobs) == 2, resumed.stdout
        points = read_points(sweep_dir)
        assert [(p["job_id"], p["action"]) for p in points] == [(job, "resubmitted") for job in new_jobs]
        assert report_jobs(sweep_dir) == new_jobs
    finally:
        subprocess.run(["scancel", *new_jobs], check=False)


def report_jobs(sweep_dir: Path) -> list[str]:
    """The job ids `status SWEEP_DIR --json` shows for the sweep's points."""
    return [r["job_id"] for r in status_json(sweep_dir)["runs"]]
