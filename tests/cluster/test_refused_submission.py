"""A submission SLURM refuses is never silent: a sweep whose sbatch fails (its job array's, or a point's own)
exits 2 and names the points it did not submit (issue 14, item 10; issue 15, item 4). Real sbatch on the local
SLURM cluster; nothing runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftslurm.rundir.sweepdir import read_points
from swiftslurm.testing.cli import swiftslurm

pytestmark = [pytest.mark.slurm]


@pytest.mark.parametrize("parallelism", ["2", "0"], ids=["one array", "a job per point"])
def test_a_sweep_whose_sbatch_fails_exits_2_naming_the_points_not_submitted(
    parallelism: str, tmp_path: Path, slurm_cluster: None
) -> None:
    args = [
        "-m",
        "+cluster=local-slurm",
        f"array_parallelism={parallelism}",
        "swift.learning_rate=1e-4,2e-4",
        "cluster.sbatch.reservation=swiftslurm-no-such-reservation",  # sbatch: "Requested reservation is invalid"
    ]
    done = swiftslurm(*args, cwd=tmp_path, timeout=300, env={"SWIFTSLURM_RUNS": str(tmp_path / "runs")})
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    error = [line for line in done.stderr.splitlines() if line.startswith("swiftslurm: error: ")]
    assert len(error) == 1, done.stderr
    assert "reservation" in error[0].lower() and "run the same command again" in error[0]
    [sweep_dir] = (tmp_path / "runs" / "sweeps").iterdir()
    points = read_points(sweep_dir)
    assert [p["action"] for p in points] == ["planned", "planned"]
    for point in points:
        assert point["run_name"] in error[0]
        assert not (Path(point["run_dir"]) / "job.json").exists()
    shown = swiftslurm("status", str(sweep_dir), cwd=tmp_path)
    assert "dry run" not in shown.stdout and shown.stdout.count("submission refused at ") == 2, shown.stdout
    assert "reservation" in shown.stdout.lower()


def test_a_run_whose_partition_does_not_exist_is_refused_and_leaves_nothing(
    tmp_path: Path, slurm_cluster: None
) -> None:
    """Issue 26, item 2: a refused submission left a run dir that `status` called "never submitted (dry run)"."""
    run_dir = tmp_path / "runs" / "r"
    done = swiftslurm("+cluster=local-slurm", "cluster.partition=nosuchpartition", f"run_dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 2 and "Partition 'nosuchpartition' does not exist" in done.stderr, done.stderr
    assert not run_dir.exists()


def test_a_run_sbatch_refuses_says_so_in_its_run_dir(tmp_path: Path, slurm_cluster: None) -> None:
    """sbatch itself refuses after the run dir is written (a reservation that does not exist): status says the
    submission was refused and why, not that the run is a dry run."""
    run_dir = tmp_path / "runs" / "r"
    args = ("+cluster=local-slurm", f"run_dir={run_dir}", "dry_run=false")
    refused = swiftslurm(*args, "cluster.sbatch.reservation=swiftslurm-no-such-reservation", cwd=tmp_path)
    assert refused.returncode == 2 and "reservation" in refused.stderr.lower(), refused.stderr
    shown = swiftslurm("status", str(run_dir), cwd=tmp_path)
    assert "dry run" not in shown.stdout and "submission refused at " in shown.stdout, shown.stdout
    assert "reservation" in shown.stdout.lower()
