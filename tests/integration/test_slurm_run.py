"""A real 2-node SLURM job (scripts/slurm-local.sh) in which ms-swift trains data-parallel."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.integration.conftest import swiftslurm, wait_for_job

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
NOT_DISTRIBUTED = "parallel_mode != ParallelMode.DISTRIBUTED"


def node_logs(run_dir: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((run_dir / "logs").glob("*/node*.log"))}


def assert_trained_data_parallel(run_dir: Path) -> None:
    logs = node_logs(run_dir)
    assert set(logs) == {"node0.log", "node1.log"}, list(logs)
    for name, text in logs.items():
        assert NOT_DISTRIBUTED not in text, name
        assert re.search(r"world_size[:=\s]+2\b", text), f"{name} does not show world size 2"
    assert (run_dir / "output" / "checkpoint-40" / "adapter_model.safetensors").is_file()
    record = json.loads((run_dir / "attempts.jsonl").read_text().splitlines()[-1])
    assert record["exit_code"] == 0 and sorted(record["hosts"]) == ["node1", "node2"]


def test_two_node_job_through_submitit_trains_and_waits(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "finished" in done.stdout and "final loss" in done.stdout
    assert_trained_data_parallel(run_dir)


def test_submit_without_wait_returns_the_job_id_at_once(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    done = swiftslurm("+cluster=local-slurm", f"run_dir={run_dir}", cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    job_id = re.search(r"submitted job (\d+)", done.stdout)
    assert job_id and str(run_dir) in done.stdout
    assert wait_for_job(job_id.group(1)) == "COMPLETED"
    assert_trained_data_parallel(run_dir)


def test_plain_sbatch_of_the_rendered_job_script(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run dir with space"
    prepared = swiftslurm("+cluster=local-slurm", "dry_run=true", f"run_dir='{run_dir}'", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    job = subprocess.run(["sbatch", "--parsable", str(run_dir / "job.sbatch")], capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    assert wait_for_job(job.stdout.strip().split(";")[0]) == "COMPLETED"
    assert_trained_data_parallel(run_dir)


def test_sbatch_template_runs_a_prepared_run_dir(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    prepared = swiftslurm("+cluster=local-slurm", "dry_run=true", f"run_dir={run_dir}", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    env = os.environ | {"SWIFTSLURM_PYTHON": sys.executable}
    job = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--nodes=2",
            "--partition=debug",
            f"--chdir={tmp_path}",
            str(REPO / "sbatch" / "swiftslurm.sbatch"),
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        env=env,
    )
    assert job.returncode == 0, job.stderr
    assert wait_for_job(job.stdout.strip().split(";")[0]) == "COMPLETED"
    assert_trained_data_parallel(run_dir)
