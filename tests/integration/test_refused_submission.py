"""A submission SLURM refuses is never silent: a sweep whose job-array sbatch fails exits 2 and names the points
it did not submit (issue 14, item 10). Real sbatch on the local SLURM cluster; nothing runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slurm]


def test_a_sweep_whose_array_sbatch_fails_exits_2_naming_the_points_not_submitted(
    tmp_path: Path, slurm_cluster: None
) -> None:
    args = [
        "-m",
        "+cluster=local-slurm",
        "array_parallelism=2",
        "swift.learning_rate=1e-4,2e-4",
        "cluster.sbatch.reservation=swiftslurm-no-such-reservation",  # sbatch: "Requested reservation is invalid"
    ]
    done = subprocess.run(
        [sys.executable, "-m", "swiftslurm", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SWIFTSLURM_RUNS": str(tmp_path / "runs")},
    )
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    error = [line for line in done.stderr.splitlines() if line.startswith("swiftslurm: error: ")]
    assert len(error) == 1, done.stderr
    assert "reservation" in error[0].lower() and "run the same command again" in error[0]
    [sweep_dir] = (tmp_path / "runs" / "sweeps").iterdir()
    points = json.loads((sweep_dir / "sweep.json").read_text())["points"]
    assert [p["action"] for p in points] == ["planned", "planned"]
    for point in points:
        assert point["run_name"] in error[0]
        assert not (Path(point["run_dir"]) / "job.json").exists()
