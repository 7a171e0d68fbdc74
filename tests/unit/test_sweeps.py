"""`-m` sweeps (issue 15, item 4): each point composed once, every point planned before anything is written,
points recorded append-only, the same configs and run dirs as Hydra's own multirun gave. Dry runs: nothing is
submitted (the submission and its failures are in tests/integration/test_refused_submission.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from swiftslurm.rundir.sweepdir import LEGACY_SWEEP_FILE, SWEEP_FILE, read_points, record_points, run_dirs
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


def test_points_are_recorded_append_only_and_the_newest_line_of_a_run_dir_wins(tmp_path: Path) -> None:
    record_points(tmp_path, [{"num": i, "run_dir": f"/r{i}", "action": "planned"} for i in (1, 0)])
    record_points(tmp_path, [{"num": 0, "run_dir": "/r0", "job_id": "7_0", "action": "submitted"}])
    lines = (tmp_path / SWEEP_FILE).read_text().splitlines()
    assert len(lines) == 3  # nothing rewritten
    with open(tmp_path / SWEEP_FILE, "a") as torn:
        torn.write('{"num": 1, "run_dir": "/r1", "act')  # a crash mid-append
    points = read_points(tmp_path)
    assert [(p["run_dir"], p["action"], p.get("job_id")) for p in points] == [
        ("/r0", "submitted", "7_0"),
        ("/r1", "planned", None),
    ]
    assert run_dirs(tmp_path) == [Path("/r0"), Path("/r1")]


def test_a_sweep_recorded_before_sweep_jsonl_is_still_read(tmp_path: Path) -> None:
    legacy = {"created": 0, "points": [{"num": 0, "run_dir": "/r0", "job_id": "5", "action": "submitted"}]}
    (tmp_path / LEGACY_SWEEP_FILE).write_text(json.dumps(legacy))
    assert run_dirs(tmp_path) == [Path("/r0")]
    assert read_points(tmp_path)[0]["job_id"] == "5"


@pytest.mark.parametrize("count", [3, 40])
def test_a_failed_submission_names_at_most_a_screenful_of_points(
    count: int, capsys: pytest.CaptureFixture[str]
) -> None:
    from swiftslurm.sweep.callback import report_unsubmitted

    names = [f"run-{i}" for i in range(count)]
    with pytest.raises(SystemExit) as stop:
        report_unsubmitted(RuntimeError("sbatch: error: Batch job submission failed."), names, Path("/s"))
    assert stop.value.code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("swiftslurm: error: sbatch: error: Batch job submission failed. Not submitted: ")
    shown = [n for n in names if any(f"{n}{end}" in line for end in (",", ".", " "))]
    assert len(shown) == min(count, 20)
    assert ("/s/sweep.jsonl" in line) == (count > 20)


@pytest.mark.parametrize(
    "args",
    [
        ["a=1,2", "b=x,y", "c=3"],
        ["++swift.learning_rate=1e-4,2e-4", "seed=range(0,5)", "+cluster=a100x16"],
        ["x=range(0.1,0.5,0.1)", "y='1e-4','a,b'", "z=[1,2]", "w={k:v}"],
        ["a=1,2", "a=3,4", "strategy=ddp,zero2", "~foo"],
        ["s=choice(a,b)", "t=' spaced '", "u=null", "v=true,false"],
    ],
    ids=["choices", "range and package", "floats quotes lists dicts", "repeated key", "choice null bool"],
)
def test_points_are_the_ones_hydras_basic_sweeper_makes_in_its_order(args: list[str]) -> None:
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from swiftslurm.sweep.sweeper import expand

    parser = OverridesParser.create()
    [hydras] = BasicSweeper.split_arguments(parser.parse_overrides(args), max_batch_size=None)
    ours = expand(parser.parse_overrides(args))
    assert [[o.input_line for o in point] for point in ours] == hydras
    # and each of our overrides is what parsing Hydra's line gives
    for point, lines in zip(ours, hydras, strict=True):
        assert [(o.key_or_group, o.value(), o.type) for o in point] == [
            (o.key_or_group, o.value(), o.type) for o in parser.parse_overrides(lines)
        ]


def test_a_submitted_sweep_names_its_sweep_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each point's run dir is printed as it is submitted; the sweep dir (what `status`, `cancel` and `resume`
    take, under runs/sweeps/<date>_<time>) must be said too, or a newcomer has to go looking for it."""
    from omegaconf import OmegaConf

    from swiftslurm.sweep.callback import SweepCallback

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "sweeps" / "s1")}}, "wait": False})
    SweepCallback().on_multirun_end(config)
    said = capsys.readouterr().out
    assert f"sweep dir {tmp_path / 'sweeps' / 's1'}: `python -m swiftslurm status {tmp_path / 'sweeps' / 's1'}`" in said
    SweepCallback().on_multirun_end(OmegaConf.merge(config, {"dry_run": True}))
    assert capsys.readouterr().out == ""  # a dry run submitted nothing
