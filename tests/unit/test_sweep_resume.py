"""`swiftslurm resume SWEEP_DIR` resubmits a sweep's points as the sweep submitted them: one job array per
allocation with the sweep's array_parallelism, one job per point where it had none. submitit's executor is a
fake that records each sbatch it would run (tests/cluster/test_operations.py submits for real)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from swiftslurm import slurm as slurm_cli
from swiftslurm.ops import control as ops
from swiftslurm.ops.runs import SlurmView, submission
from swiftslurm.rundir.layout import CANCELLED, STATUS
from swiftslurm.rundir.sweepdir import SWEEP_FILE, read_points

MODEL = ["model=qwen3-8b", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]"]  # no tiny model to build here


@dataclass(frozen=True)
class Sbatch:
    """One sbatch the fake executor stands in for: submitit's parameters and the run dirs it carries."""

    parameters: dict[str, Any]
    run_dirs: list[str]

    def allocation(self) -> dict[str, Any]:
        """The parameters without the job name (an array is named after its first run)."""
        return {k: v for k, v in self.parameters.items() if k != "name"}


@pytest.fixture
def sbatches(monkeypatch: pytest.MonkeyPatch) -> list[Sbatch]:
    """submitit.AutoExecutor replaced: each submit or map_array is recorded, and answered with job ids as SLURM
    gives them (`<array>_<i>` for an array's tasks)."""
    import submitit

    made: list[Sbatch] = []

    class FakeExecutor:
        def __init__(self, folder: Path, cluster: str, **kwargs: Any) -> None:
            self.parameters: dict[str, Any] = {}

        def update_parameters(self, **parameters: Any) -> None:
            self.parameters.update(parameters)

        def submit(self, function: Any, run_dir: str) -> SimpleNamespace:
            made.append(Sbatch(dict(self.parameters), [run_dir]))
            return SimpleNamespace(job_id=str(600 + len(made)))

        def map_array(self, function: Any, run_dirs: list[str]) -> list[SimpleNamespace]:
            made.append(Sbatch(dict(self.parameters), list(run_dirs)))
            return [SimpleNamespace(job_id=f"{600 + len(made)}_{i}") for i in range(len(run_dirs))]

    monkeypatch.setattr(submitit, "AutoExecutor", FakeExecutor)
    monkeypatch.setattr(slurm_cli, "partitions", lambda: {"gpu"})
    return made


def swiftslurm(*args: str, monkeypatch: pytest.MonkeyPatch) -> int:
    """`python -m swiftslurm ARGS`, in this process: its exit status."""
    from swiftslurm.__main__ import main

    monkeypatch.setattr(sys, "argv", ["swiftslurm", *args])
    try:
        main()
    except SystemExit as stop:
        return int(stop.code or 0)
    return 0


def submitted_sweep(tmp_path: Path, parallelism: int, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Six points, two allocations (1 and 2 nodes) x three seeds, submitted: the sweep dir."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("SWIFTSLURM_RUNS", raising=False)
    sweep = ["-m", "+cluster=a100x16", *MODEL, "cluster.nodes=1,2", "seed=1,2,3", f"array_parallelism={parallelism}"]
    assert swiftslurm(*sweep, f"hydra.sweep.dir={tmp_path / 'sweep'}", monkeypatch=monkeypatch) == 0
    return tmp_path / "sweep"


# What each point's first job has become: finished, failed, cancelled, still running, failed, still waiting.
STATES = ["COMPLETED", "FAILED", "CANCELLED", "RUNNING", "FAILED", "PENDING"]
RESUMED = [1, 2, 4]


def where_the_jobs_are(run_dirs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = [str(submission(d)["job_id"]) for d in run_dirs]
    (run_dirs[0] / STATUS).write_text(json.dumps({"state": "finished", "why": "trained", "job_id": jobs[0]}))
    (run_dirs[2] / CANCELLED).write_text("{}")
    monkeypatch.setattr(ops, "ask_slurm", lambda ids: SlurmView(True, dict(zip(jobs, STATES, strict=True))))


@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "sweep recorded before array_parallelism"])
@pytest.mark.parametrize("parallelism", [2, 0])
def test_a_resumed_sweep_is_resubmitted_as_the_arrays_it_was_submitted_as(
    parallelism: int,
    recorded: bool,
    tmp_path: Path,
    sbatches: list[Sbatch],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It was: each point resubmitted as its own job, so a sweep submitted as `%8` came back unthrottled."""
    sweep_dir = submitted_sweep(tmp_path, parallelism, monkeypatch)
    first = list(sbatches)
    assert len(first) == (2 if parallelism else 6)  # one array per allocation, or a job per point
    run_dirs = [Path(p["run_dir"]) for p in read_points(sweep_dir)]
    if not recorded:  # as a sweep submitted before the record had array_parallelism
        lines = [json.loads(line) for line in (sweep_dir / SWEEP_FILE).read_text().splitlines()]
        text = "".join(json.dumps({k: v for k, v in line.items() if k != "array_parallelism"}) + "\n" for line in lines)
        (sweep_dir / SWEEP_FILE).write_text(text)
    where_the_jobs_are(run_dirs, monkeypatch)
    capsys.readouterr()

    assert ops.main(["resume", str(sweep_dir)]) == 0

    resumed = {str(run_dirs[i]) for i in RESUMED}
    again = [Sbatch(s.parameters, [d for d in s.run_dirs if d in resumed]) for s in first]
    assert [(s.allocation(), s.run_dirs) for s in sbatches[len(first) :]] == [
        (s.allocation(), s.run_dirs) for s in again if s.run_dirs
    ]
    assert all(s.parameters.get("slurm_array_parallelism") == (parallelism or None) for s in sbatches)
    new_jobs = {Path(p["run_dir"]): p["job_id"] for p in read_points(sweep_dir) if p["action"] == "resubmitted"}
    assert sorted(map(str, new_jobs)) == sorted(resumed)
    assert all(submission(d)["job_id"] == job for d, job in new_jobs.items())  # each run dir names its new job
    assert not (run_dirs[2] / CANCELLED).exists()
    said = capsys.readouterr().out.splitlines()
    assert [line.split(": ", 1)[0] for line in said] == [d.name for d in run_dirs]  # one line a point, in order
    assert [i for i, line in enumerate(said) if ": resubmitted as job " in line] == RESUMED
    assert "finished; nothing to resume" in said[0] and "running as job" in said[3] and "pending as job" in said[5]
