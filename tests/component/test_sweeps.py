"""`-m` sweeps (issue 15, item 4): each point composed once, every point planned before anything is written,
points recorded append-only, the same configs and run dirs as Hydra's own multirun gave. Dry runs: nothing is
submitted (the submission and its failures are in tests/cluster/test_refused_submission.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from swiftslurm.sweep.workers import PARALLEL_FROM
from swiftslurm.testing import cli
from tests.conftest import REPO

PROBE = Path(__file__).resolve().parent / "compose_probe"


def swiftslurm(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The command line with compose_probe importable and the runs under ``cwd``."""
    path = os.pathsep.join([str(REPO), str(PROBE), os.environ.get("PYTHONPATH", "")])
    extra = {"PYTHONPATH": path, "SWIFTSLURM_RUNS": str(cwd / "runs"), **(env or {})}
    return cli.swiftslurm(*args, cwd=cwd, timeout=300, env=extra)


def run_names(cwd: Path) -> list[str]:
    return sorted(p.name for p in (cwd / "runs").iterdir() if p.name != "sweeps")


def test_each_point_is_composed_once_and_points_choosing_the_same_groups_share_a_composition(tmp_path: Path) -> None:
    (tmp_path / "probe" / "probe").mkdir(parents=True)
    (tmp_path / "probe" / "probe" / "count.yaml").write_text("# @package _global_\n{}\n")
    log = tmp_path / "compositions.log"
    done = swiftslurm(
        "-m",
        f"hydra.searchpath=[probe://{tmp_path / 'probe'}]",
        "+probe=count",
        "+cluster=a100x16",
        "strategy=ddp,zero2",
        "seed=1,2,3",
        "dry_run=true",
        cwd=tmp_path,
        env={"SWIFTSLURM_COMPOSE_LOG": str(log)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(run_names(tmp_path)) == 6
    # Hydra composes twice before any sweeper runs (to read the run mode, then the sweep's config); then its own
    # multirun composed every point twice (validated, then launched): 2 + 12. Here: one per strategy chosen.
    assert len(log.read_text().splitlines()) == 2 + 2


def test_a_point_gets_the_config_and_plan_a_single_run_with_its_overrides_gets(tmp_path: Path) -> None:
    swept = swiftslurm(
        "-m",
        "+cluster=a100x16",
        "strategy=ddp,zero2",
        "seed=1,2",
        "swift.learning_rate=3e-4",
        "dry_run=true",
        cwd=tmp_path,
    )
    assert swept.returncode == 0, swept.stderr[-3000:]
    [point] = [p for p in run_names(tmp_path) if "seed=2" in p and "zero2" in p]
    assert point == "tiny-sft-zero2-a100x16-seed=2,strategy=zero2"  # what varies, as Hydra's override_dirname
    single = tmp_path / "runs" / point  # the same run dir, planned as one run: nothing may differ
    before = {name: (single / name).read_text() for name in ("config.yaml", "plan.json", "job.sbatch")}
    again = swiftslurm(
        "+cluster=a100x16",
        "strategy=zero2",
        "seed=2",
        "swift.learning_rate=3e-4",
        f"run_name='{point}'",
        f"run_dir='{single}'",
        "dry_run=true",
        cwd=tmp_path,
    )
    assert again.returncode == 0, again.stderr[-3000:]
    config = before["config.yaml"].replace("run_name: null", f"run_name: {point}")
    assert (single / "config.yaml").read_text().replace(f"run_dir: {single}\n", "run_dir: null\n") == config
    assert (single / "job.sbatch").read_text() == before["job.sbatch"]


def test_a_point_is_named_after_what_varies_not_after_the_constants(tmp_path: Path) -> None:
    done = swiftslurm("-m", "+cluster=a100x16", "swift.learning_rate=1e-4,2e-4", "seed=3", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert run_names(tmp_path) == [f"tiny-sft-ddp-a100x16-learning_rate={lr}" for lr in ("0.0001", "0.0002")]


def test_points_told_apart_only_by_keys_names_leave_out_still_get_their_own_run_dirs(tmp_path: Path) -> None:
    # preflight= is left out of names (conf/config.yaml: override_dirname.exclude_keys), the seed is a constant:
    # named after what varies without the excluded keys, both points would be `...-seed=3`, one run dir.
    done = swiftslurm("-m", "+cluster=a100x16", "preflight=true,false", "seed=3", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert run_names(tmp_path) == ["tiny-sft-ddp-a100x16-preflight=False", "tiny-sft-ddp-a100x16-preflight=True"]
    again = swiftslurm("-m", "+cluster=a100x16", "seed=4,4", "dry_run=true", cwd=tmp_path / "runs")
    assert again.returncode == 0, again.stderr[-3000:]
    assert run_names(tmp_path / "runs") == ["tiny-sft-ddp-a100x16-seed=4,0", "tiny-sft-ddp-a100x16-seed=4,1"]


def test_a_run_name_in_a_sweep_names_the_points_runs_each_with_what_varies(tmp_path: Path) -> None:
    done = swiftslurm("-m", "+cluster=a100x16", "run_name=mine", "seed=1,2", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert run_names(tmp_path) == ["mine-seed=1", "mine-seed=2"]  # was: both points in runs/mine, one run


def test_points_that_would_share_a_run_dir_refuse_the_sweep_and_write_nothing(tmp_path: Path) -> None:
    args = ("-m", "+cluster=a100x16", f"run_dir={tmp_path / 'mine'}", "seed=1,2", "dry_run=true")
    done = swiftslurm(*args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert "sweep points #0 (seed=1) and #1 (seed=2) would share the run dir" in done.stderr
    assert "HINT: leave run_dir unset in a sweep" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mine").exists()


def test_a_refused_later_point_refuses_the_whole_sweep_and_writes_nothing(tmp_path: Path) -> None:
    done = swiftslurm("-m", "+cluster=a100x16", "cluster.gpus_per_node=8,-1", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stderr.startswith("swiftslurm: error: sweep point #1 (cluster.gpus_per_node=-1): ")
    assert "0 or more" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()  # not even the first point's run dir, nor Hydra's sweep folder


def test_a_large_sweep_is_planned_in_workers_with_the_same_result_and_the_same_refusal(tmp_path: Path) -> None:
    n = PARALLEL_FROM + 6
    (tmp_path / "ok").mkdir()
    done = swiftslurm("-m", "+cluster=a100x16", f"seed=range(0,{n})", "dry_run=true", cwd=tmp_path / "ok")
    assert done.returncode == 0, done.stderr[-3000:]
    names = run_names(tmp_path / "ok")
    assert len(names) == n and done.stdout.count("Nothing submitted (dry_run=true)") == n
    plan = json.loads((tmp_path / "ok" / "runs" / f"tiny-sft-ddp-a100x16-seed={n - 1}" / "plan.json").read_text())
    assert plan["run_name"] == f"tiny-sft-ddp-a100x16-seed={n - 1}"
    (tmp_path / "bad").mkdir()
    # The first refused point comes after every good one: a worker finds it, and this process says it.
    refused = swiftslurm(
        "-m",
        "+cluster=a100x16",
        "cluster.gpus_per_node=8,-1",
        f"seed=range(0,{n})",
        "dry_run=true",
        cwd=tmp_path / "bad",
    )
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert refused.stderr.startswith(f"swiftslurm: error: sweep point #{n} (cluster.gpus_per_node=-1 seed=0): ")
    assert len(refused.stderr.splitlines()) == 1
    assert not (tmp_path / "bad" / "runs").exists()
