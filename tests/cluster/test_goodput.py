"""The goodput ledger on the real local SLURM cluster with real ms-swift: a 2-node run preempted twice
(time-compressed: at steps, every step at least STEP_FLOOR_S long), one whose worker crashes, and a job array's
tasks; the ledger's categories add up to SLURM's accounting of the allocation, in `status` and `status --json`."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.rundir.sweepdir import read_points
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts, preempt_at_steps, submit, wait_for_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
STEP_FLOOR = str(HERE / "step_floor_plugin.py")
CRASH = str(HERE / "crash_once_plugin.py")
CRASH_STEP = 30  # crash_once_plugin.CRASH_STEP (importing it would import ms-swift here)
STEP_FLOOR_S = 0.25  # step_floor_plugin.STEP_FLOOR_S
RUN = ("swift.max_steps=80", "swift.save_steps=20")
# SLURM keeps a job run's Start and End in whole seconds, cut down (time_t), while the run's own marks are the
# wrapper's and the trainer's clock to the millisecond: an attempt that concludes in the last fraction of a
# second before SLURM ends its job run (the requeue, the batch script's exit) has marks up to 1 s past the End
# SLURM reports. The ledger counts none of it (`outside_s` says how much there was), so its categories add up
# to the allocation exactly; on this one machine (one clock) the records reach at most that second outside.
SLURM_ROUNDING_S = 1.0
JSON_ROUNDING_S = 0.05  # `status --json` rounds every figure to 0.1


def sacct_runs(job: str) -> list[tuple[int, int]]:
    """SLURM's own figures, asked here independently of swiftslurm: (elapsed s, nodes) of every run of the job."""
    out = subprocess.run(
        ["sacct", "-D", "-X", "-n", "-P", "-j", job, "-o", "ElapsedRaw,AllocNodes"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [(int(e), int(n)) for e, n in (line.split("|") for line in out.split())]


def ledger_of(run_dir: Path) -> tuple[dict[str, Any], str]:
    as_json = swiftslurm("status", str(run_dir), "--json", cwd=run_dir.parent)
    assert as_json.returncode == 0, as_json.stderr
    text = swiftslurm("status", str(run_dir), cwd=run_dir.parent)
    assert text.returncode == 0, text.stderr
    print(text.stdout)
    ledger = json.loads(as_json.stdout)["runs"][0]["ledger"]
    print(json.dumps(ledger, indent=1))
    assert ledger is not None and "goodput ledger of" in text.stdout
    return ledger, text.stdout


def assert_adds_up(ledger: dict[str, Any], job: str) -> None:
    """Every allocated second is in one category, and no second is counted beyond SLURM's rounding."""
    runs = sacct_runs(job)
    devices_per_node = 1  # local-slurm: 1 CPU process per node
    allocated = sum(elapsed * nodes * devices_per_node for elapsed, nodes in runs)
    assert ledger["allocated_s"] == pytest.approx(allocated, abs=1.0)
    assert ledger["allocated_from"] == "SLURM accounting"
    spent = sum(ledger["spent_s"].values())
    rounding = JSON_ROUNDING_S * (len(ledger["spent_s"]) + 1)
    assert ledger["allocated_s"] - rounding <= spent <= ledger["allocated_s"] + rounding, (spent, allocated, runs)
    assert 0 <= ledger["unaccounted_s"] <= rounding
    slurm_rounding = sum(SLURM_ROUNDING_S * nodes * devices_per_node for _, nodes in runs)
    assert 0 <= ledger["outside_s"] <= slurm_rounding + JSON_ROUNDING_S, (ledger["outside_s"], runs)


def test_a_run_preempted_twice_accounts_for_every_allocated_second(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    plugin = (f"swift.external_plugins=[{STEP_FLOOR}]", "swift.callbacks=[step_floor]")
    job = submit(run_dir, *RUN, *plugin)
    preempt_at_steps(run_dir, job, [25, 55])
    assert wait_for_job(job) == "COMPLETED"
    assert [a["reason"] for a in attempts(run_dir)] == ["preempted", "preempted", "finished"]
    ledger, _ = ledger_of(run_dir)
    assert_adds_up(ledger, job)
    spent = ledger["spent_s"]
    assert ledger["job_runs"] == 3
    # The old run ends as soon as SLURM accepts the requeue (no KillWait hold): sacct's End of a run and the
    # next run's Submit are the same second, give or take sacct's rounding.
    assert ledger["requeue_hold_s"] <= 2 * 2
    # Not "restart": a requeued job run ends within a second of its attempt's end, and SLURM's End, whole
    # seconds cut down, can leave none of that inside the allocation (it is then in outside_s).
    for category in ("startup", "load", "committed", "save", "finish"):
        assert spent[category] > 0, category
    assert spent["uncommitted"] == 0  # nothing is running any more
    assert 0 < ledger["goodput"] < 1


def test_a_worker_crash_shows_the_training_lost_since_the_last_commit(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    plugins = (f"swift.external_plugins=[{STEP_FLOOR},{CRASH}]", "swift.callbacks=[step_floor,crash_once]")
    job = submit(run_dir, *RUN, *plugins, "resilience.backoff_base_s=1")
    assert wait_for_job(job) == "COMPLETED"
    records = attempts(run_dir)
    assert [(a["reason"], a["decision"]) for a in records] == [("infra", "restart"), ("finished", "done")]
    assert records[1]["resume_step"] == 20  # the crash at step 30 lost the 10 steps after the commit of 20
    ledger, _ = ledger_of(run_dir)
    assert_adds_up(ledger, job)
    spent = ledger["spent_s"]
    # Lost: from the commit of step 20 to the last step node 0 saw logged before the crash (25; ms-swift logs
    # every 5 steps), 5 steps of at least STEP_FLOOR_S on both nodes. Noticing the crash is the restart's.
    assert spent["lost"] >= (CRASH_STEP - 5 - 20) * STEP_FLOOR_S * 2
    assert records[0]["last_step"] >= CRASH_STEP - 5
    assert spent["committed"] >= 80 * STEP_FLOOR_S * 2
    assert spent["restart"] > 0 and ledger["job_runs"] == 1  # restarted inside the same allocation


def test_each_task_of_a_job_array_is_one_job_run_split_by_its_own_attempts(tmp_path: Path, slurm_cluster: None) -> None:
    """A task is `<array>_<i>` to sacct and job.json, its raw id to its attempts (SLURM_JOB_ID): one job run,
    allocated its own row, its start-up only up to its attempt (issue 29: each task counted twice, start-up 52 %)."""
    args = ("-m", "+cluster=local-slurm", "seed=1,2", "swift.max_steps=20", "swift.save_steps=10")
    done = swiftslurm(*args, "array_parallelism=2", "wait=true", cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    [sweep_dir] = (tmp_path / "runs" / "sweeps").iterdir()
    for point in read_points(sweep_dir):
        assert "_" in point["job_id"] and wait_for_job(point["job_id"]) == "COMPLETED"
        [record] = attempts(Path(point["run_dir"]))
        assert record["job_id"] != point["job_id"]  # the raw id, as SLURM_JOB_ID has it inside the task
        ledger, _ = ledger_of(Path(point["run_dir"]))
        assert_adds_up(ledger, point["job_id"])  # the task's own ElapsedRaw × AllocNodes
        assert ledger["job_runs"] == 1
        spent = ledger["spent_s"]
        assert spent["committed"] > 0 and spent["startup"] < spent["load"], spent
