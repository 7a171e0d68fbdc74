"""Preemption, real preemption, time limits, user errors: on the real SLURM cluster with real ms-swift.

CPU training here is deterministic, so a run that was stopped and resumed must end with the same adapter
bytes as one that never stopped.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import is_committed
from swiftslurm.testing.cli import command
from swiftslurm.testing.cluster import (
    attempts,
    current_step,
    job_state,
    preempt_at_steps,
    status,
    submit,
    wait_for_job,
    wait_until,
)
from swiftslurm.testing.node_group import partition
from tests.cluster.conftest import ADAPTER, LONG

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEP_FLOOR_PLUGIN = Path(__file__).resolve().parent / "step_floor_plugin.py"
STEP_FLOOR_S = 0.25  # step_floor_plugin.STEP_FLOOR_S (importing it would import ms-swift here)


def test_signal_mid_training_commits_requeues_and_ends_identical(tmp_path: Path, uninterrupted: bytes) -> None:
    run_dir = tmp_path / "run"
    # The user waits on the run: the command must follow it across the requeue and exit 0 at the end.
    waiter = subprocess.Popen(
        command("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *LONG),
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert waiter.stdout is not None
    job = re.search(r"submitted job (\d+)", waiter.stdout.readline())
    assert job, "no job id printed"
    preempt_at_steps(run_dir, job.group(1), [30])
    output, _ = waiter.communicate(timeout=600)
    assert waiter.returncode == 0, output[-3000:]

    first, last = attempts(run_dir)[0], attempts(run_dir)[-1]
    assert (first["reason"], first["decision"]) == ("preempted", "requeue")
    saved = Path(run_dir / "output" / f"checkpoint-{first['committed_step']}")
    assert first["committed_step"] == first["last_step"] >= 30  # saved at the step it was at
    assert is_committed(saved)
    assert last["resumed_from"] == str(saved) and last["job_id"] == first["job_id"]  # same job, requeued
    assert status(run_dir)["state"] == "finished"
    assert (run_dir / ADAPTER).read_bytes() == uninterrupted


def test_several_preemptions_in_a_row_still_end_identical(tmp_path: Path, uninterrupted: bytes) -> None:
    run_dir = tmp_path / "run"
    job = submit(run_dir, *LONG)
    preempt_at_steps(run_dir, job, [20, 55, 90])
    assert wait_for_job(job) == "COMPLETED"
    reasons = [a["reason"] for a in attempts(run_dir)]
    assert reasons == ["preempted", "preempted", "preempted", "finished"], reasons
    resumed = [a["resume_step"] for a in attempts(run_dir)]
    committed = [a["committed_step"] for a in attempts(run_dir)]
    assert resumed[1:] == committed[:-1]  # every attempt starts where the previous one committed
    assert (run_dir / ADAPTER).read_bytes() == uninterrupted


def test_real_preemption_by_a_higher_priority_job(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    job = submit(run_dir, "swift.max_steps=150", "swift.save_steps=50")
    wait_until(lambda: current_step(run_dir) >= 25, 300, "training to start")
    urgent = subprocess.run(
        ["sbatch", "--parsable", "-p", partition("urgent"), "-N3", "--exclusive", "--wrap", "sleep 3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert wait_for_job(urgent) == "COMPLETED"
    assert wait_for_job(job) == "COMPLETED"
    records = attempts(run_dir)
    assert records[0]["reason"] == "preempted" and records[-1]["reason"] == "finished"
    assert records[1]["resume_step"] == records[0]["committed_step"] > 0
    assert status(run_dir)["state"] == "finished"


def test_run_longer_than_its_time_limit_finishes_over_several_attempts(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    # No attempt outlives the 3 min limit (SLURM kills it there, signal or not). 760 steps of at least 0.25 s
    # each (the step_floor plugin, whatever the machine's speed) take at least 190 s: no single attempt can
    # finish them, and the second attempt has at most what the first could not do (the signal, 30-90 s before
    # the end, stops the first after 90-150 s).
    steps, floor_s, limit_s = 760, STEP_FLOOR_S, 180
    assert steps * floor_s > limit_s
    plugin = (f"swift.external_plugins=[{STEP_FLOOR_PLUGIN}]", "swift.callbacks=[step_floor]")
    limits = (f"cluster.time={limit_s // 60}", "cluster.signal_lead_s=30")
    job = submit(run_dir, *limits, f"swift.max_steps={steps}", f"swift.save_steps={steps // 4}", *plugin)
    assert wait_for_job(job, timeout_s=900) == "COMPLETED"
    reasons = [a["reason"] for a in attempts(run_dir)]
    assert reasons[0] == "timed_out" and reasons[-1] == "finished", reasons
    assert (run_dir / "output" / f"checkpoint-{steps}" / "adapter_model.safetensors").is_file()


def test_user_error_is_not_retried_and_says_why(tmp_path: Path, slurm_cluster: None) -> None:
    from swiftslurm import tiny

    dataset = tmp_path / "data" / "train.jsonl"
    dataset.parent.mkdir()
    shutil.copy(tiny.build_tiny_assets().dataset_path, dataset)
    run_dir = tmp_path / "run"
    job = submit(run_dir, f"dataset=[{dataset}]")
    dataset.unlink()  # deleted after submission, before ms-swift reads it
    assert wait_for_job(job) == "FAILED"
    [record] = attempts(run_dir)
    assert (record["reason"], record["decision"]) == ("user_error", "stop")
    assert "train.jsonl" in record["why"] or "FileNotFoundError" in record["why"], record["why"]
    assert status(run_dir)["state"] == "failed" and status(run_dir)["why"] == record["why"]
    assert job_state(job) == "FAILED"


def test_a_run_without_progress_is_killed_as_hung_and_retried_in_budget(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    # ms-swift needs ~15 s to its first step here: a 3 s start-up limit makes every attempt "hang".
    job = submit(
        run_dir,
        "resilience.startup_timeout_s=3",
        "resilience.max_consecutive_failures=1",
        "resilience.backoff_base_s=1",
    )
    assert wait_for_job(job) == "FAILED"
    records = attempts(run_dir)
    # Every node alive: the retry is a restart in place (same job), then "no progress" stops the run.
    assert [(a["reason"], a["decision"]) for a in records] == [("infra", "restart"), ("infra", "stop")]
    assert records[1]["attempt"] == f"{records[0]['attempt']}.i1" and "stopped: no progress" in records[1]["why"]
    assert all("no training step" in a["why"] for a in records), [a["why"] for a in records]
    assert status(run_dir)["state"] == "failed"
