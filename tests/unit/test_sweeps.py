"""`-m` sweeps (issue 15, item 4): each point composed once, every point planned before anything is written,
points recorded append-only, the same configs and run dirs as Hydra's own multirun gave. Dry runs: nothing is
submitted (the submission and its failures are in tests/cluster/test_refused_submission.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from swiftslurm.rundir.sweepdir import LEGACY_SWEEP_FILE, SWEEP_FILE, read_points, record_points, run_dirs


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
    from swiftslurm.errors import report
    from swiftslurm.sweep.callback import not_submitted

    names = [f"run-{i}" for i in range(count)]
    with pytest.raises(SystemExit) as stop:  # as the command line ends on it (__main__.compose_and_run)
        sys.exit(report(not_submitted(RuntimeError("sbatch: error: Batch job submission failed."), names, Path("/s"))))
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


def point_names_of(*args: str) -> list[str]:
    """The run-name suffixes the sweeper gives the points of ``args`` (Hydra's default override_dirname)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from swiftslurm.sweep.sweeper import expand, point_names

    dirname = {"kv_sep": "=", "item_sep": ",", "exclude_keys": []}
    master = OmegaConf.create({"hydra": {"job": {"config": {"override_dirname": dirname}}}})
    return point_names(master, expand(OverridesParser.create().parse_overrides(list(args))))


def test_a_float_range_names_its_points_by_the_values_not_their_float_reprs() -> None:
    """range(5e-5,1e-4,1e-5) adds up to 7.000000000000001e-05: the run is named learning_rate=7e-05."""
    assert point_names_of("swift.learning_rate=range(5e-5,1e-4,1e-5)") == [
        f"learning_rate={v}e-05" for v in (5, 6, 7, 8, 9)
    ]
    assert point_names_of("x=range(0.1,0.5,0.1)") == ["x=0.1", "x=0.2", "x=0.3", "x=0.4"]


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["swift.learning_rate=7e-5,1e-4"], ["learning_rate=7e-05", "learning_rate=0.0001"]),
        (["x=2.0,0.5", "seed=1"], ["seed=1,x=2.0", "seed=1,x=0.5"]),
        (["x=1.0000000000001,1.0000000000002"], ["x=1.0000000000001", "x=1.0000000000002"]),
    ],
    ids=["typed short", "whole floats", "apart only past 12 digits"],
)
def test_a_float_point_keeps_the_name_hydra_gives_it_where_that_is_short(args: list[str], names: list[str]) -> None:
    """A run's dir and storage prefix follow its name: a sweep run again must find the runs it made before,
    and two points never share a name."""
    assert point_names_of(*args) == names
