"""A real 2-node SLURM job (scripts/slurm-local.sh) in which ms-swift trains data-parallel."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import MANIFEST
from swiftslurm.rundir import lease
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import TERMINAL, attempts, job_state, status, wait_for_job, wait_until
from swiftslurm.testing.node_group import group_nodes, partition
from tests.conftest import REPO

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
    assert record["exit_code"] == 0 and sorted(record["hosts"]) == group_nodes()[:2]


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
            f"--partition={partition()}",
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


def test_sbatch_template_with_a_wrong_node_count_says_why_in_the_run_dir(tmp_path: Path, slurm_cluster: None) -> None:
    """Issue 17, item 5: `sbatch --nodes=1 sbatch/swiftslurm.sbatch RUN_DIR` of a 2-node plan, from another
    directory. The wrapper refuses; the run dir says why: status.json (`failed`, the fix) and the job's output
    in RUN_DIR/logs/, the refusal a line of its own (it was glued to srun's `srun: error: ...`). The submit
    directory gets only the pointer to that log."""
    run_dir = tmp_path / "run"
    prepared = swiftslurm("+cluster=local-slurm", "dry_run=true", f"run_dir={run_dir}", cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    template = str(REPO / "sbatch" / "swiftslurm.sbatch")
    argv = ["sbatch", "--parsable", "--nodes=1", f"--partition={partition()}", f"--chdir={elsewhere}", template]
    argv.append(str(run_dir))
    env = os.environ | {"SWIFTSLURM_PYTHON": sys.executable}
    job = subprocess.run(argv, capture_output=True, text=True, env=env)
    assert job.returncode == 0, job.stderr
    job_id = job.stdout.strip().split(";")[0]
    assert wait_for_job(job_id) == "FAILED"

    recorded = status(run_dir)
    assert recorded["state"] == "failed" and recorded["job_id"] == job_id, recorded
    assert "made for 2" in recorded["why"] and "HINT: submit with --nodes=2" in recorded["why"], recorded
    shown = swiftslurm("status", str(run_dir), "--json", cwd=tmp_path)
    [row] = json.loads(shown.stdout)["runs"]
    assert row["state"] == "failed" and "--nodes=2" in row["why"], shown.stdout
    lines = (run_dir / "logs" / f"slurm-{job_id}.out").read_text().splitlines()
    refusal = [line for line in lines if "made for 2" in line]
    assert refusal and all(line.endswith("cluster.nodes=1.") for line in refusal), lines
    pointer = (elsewhere / f"swiftslurm-{job_id}.out").read_text()
    assert pointer == f"swiftslurm.sbatch: the output of this job goes to {run_dir}/logs/slurm-{job_id}.out\n"


GATE_PLUGIN = Path(__file__).resolve().parent / "gate_plugin.py"
GATE_FILE = "gate.open"  # gate_plugin.GATE_FILE (importing it would import ms-swift here)


def sbatch(run_dir: Path) -> str:
    job = subprocess.run(["sbatch", "--parsable", str(run_dir / "job.sbatch")], capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    return job.stdout.strip().split(";")[0]


def shown_status(run_dir: Path, cwd: Path) -> tuple[str, str]:
    """The state and job `swiftslurm status --json` shows for the run."""
    done = swiftslurm("status", str(run_dir), "--json", cwd=cwd)
    assert done.returncode == 0, done.stderr
    [run] = json.loads(done.stdout)["runs"]
    return run["state"], run["job_id"]


def test_a_second_sbatch_of_one_run_dir_stops_without_touching_it_and_the_first_finishes(
    tmp_path: Path, slurm_cluster: None
) -> None:
    """Issue 14, item 4: `sbatch RUN_DIR/job.sbatch` twice. The first job leads; it is held at step 15 (the gate
    plugin) until the second has ended, so both run at once on any machine. The second leader stops with one
    line, before any destructive step: no quarantine, no prune, no attempt of the first closed as lost."""
    run_dir = tmp_path / "run"
    plugin = (f"swift.external_plugins=[{GATE_PLUGIN}]", "swift.callbacks=[gate]")
    one_node = ("+cluster=local-slurm", "cluster.nodes=1", "keep_checkpoints=2", "dry_run=true")
    prepared = swiftslurm(*one_node, f"run_dir={run_dir}", *plugin, cwd=tmp_path)
    assert prepared.returncode == 0, prepared.stderr
    first = sbatch(run_dir)
    jobs = [first]
    try:
        wait_until(lambda: (run_dir / "output" / "checkpoint-10" / MANIFEST).is_file(), 300, "checkpoint-10")
        lease_before = lease.read(run_dir)
        assert lease_before["job"] == first
        output_before = sorted(p.name for p in (run_dir / "output").iterdir())
        second = sbatch(run_dir)
        jobs.append(second)
        second_log = run_dir / "logs" / second / "node0.log"
        wait_until(lambda: job_state(second) in TERMINAL or second_log.exists(), 600, f"job {second} to end")
        assert not second_log.exists(), "the second leader started a trainer"
        assert wait_for_job(second) == "FAILED"
        stop_lines = [
            line
            for line in (run_dir / "logs" / f"slurm-{second}.out").read_text().splitlines()
            if f"job {second} does not lead" in line
        ]
        assert len(stop_lines) == 1 and f"job {first} holds the lease" in stop_lines[0], stop_lines
        assert lease.read(run_dir)["token"] == lease_before["token"]
        assert not (run_dir / "output" / "quarantine").exists()
        assert set(output_before) <= {p.name for p in (run_dir / "output").iterdir()}  # nothing pruned or moved
        assert [r["job_id"] for r in attempts(run_dir)] == []  # the first's open attempt was not closed as lost
        assert shown_status(run_dir, tmp_path) == ("running", first)  # the refused job is not the run's job
        (run_dir / GATE_FILE).touch()
        assert wait_for_job(first) == "COMPLETED"
    finally:
        for job in jobs:
            subprocess.run(["scancel", job], check=False)
    [record] = attempts(run_dir)
    assert (record["job_id"], record["reason"], record["decision"]) == (first, "finished", "done"), record
    assert status(run_dir)["state"] == "finished"
    assert shown_status(run_dir, tmp_path) == ("finished", first)
    committed = sorted(p.name for p in (run_dir / "output").glob("checkpoint-*") if (p / MANIFEST).is_file())
    assert committed == ["checkpoint-30", "checkpoint-40"]  # keep_checkpoints=2, pruned by the leader only
    assert not (run_dir / "output" / "quarantine").exists()
