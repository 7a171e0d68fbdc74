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
