"""The plots (swiftslurm/ops/plots.py) answer "which point is best, how did each train": points labelled by what varies,
the final-loss axis zoomed to the values, the best point marked, titles that fit, throughput in samples/s."""

from __future__ import annotations

import json
from pathlib import Path

from swiftslurm.ops import plots, status
from swiftslurm.rundir import records
from swiftslurm.rundir.records import record_submission
from swiftslurm.rundir.sweepdir import record_point

CONSTANT = ["+cluster=local-slurm", "++swift.max_steps=20", "wait=true"]


def write_point(sweep_dir: Path, num: int, overrides: list[str], losses: list[float], state: str = "finished") -> Path:
    """A point as a sweep leaves it: plan.json, ms-swift's logging.jsonl, the leader's status, sweep.jsonl."""
    run_dir = sweep_dir.parent / f"tiny-sft-ddp-local-slurm-{','.join(overrides)}"
    (run_dir / "output").mkdir(parents=True)
    plan = {"run_name": run_dir.name, "batch": {"micro": 1, "grad_accum": 2, "data_parallel": 2}}
    (run_dir / "plan.json").write_text(json.dumps(plan))
    lines = [
        {"loss": loss, "global_step/max_steps": f"{i + 1}/20", "train_speed(s/it)": 0.5 + 0.1 * num}
        for i, loss in enumerate(losses)
    ]
    (run_dir / "output" / "logging.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    records.write_status(run_dir, state, why="")
    record_submission(run_dir, str(num + 1), "slurm")
    record_point(sweep_dir, {"num": num, "run_dir": str(run_dir), "overrides": [*CONSTANT, *overrides]})
    return run_dir


def fixture_sweep(sweep_dir: Path) -> None:
    """2 learning rates x 2 strategies; their final losses 0.04 apart at most; one point still running."""
    curves = {0: [10.2, 8.1, 6.9, 6.609], 1: [10.2, 7.9, 6.8, 6.568], 2: [10.2, 8.3, 7.1, 6.641], 3: [10.2, 8.0, 6.7]}
    for num, (lr, strategy) in enumerate([(lr, s) for lr in ("1e-4", "2e-4") for s in ("ddp", "zero2")]):
        state = "running" if num == 3 else "finished"
        write_point(sweep_dir, num, [f"swift.learning_rate={lr}", f"strategy={strategy}"], curves[num], state)


def test_points_are_labelled_by_the_overrides_that_differ(tmp_path: Path) -> None:
    fixture_sweep(tmp_path / "sweep")
    from swiftslurm.rundir.sweepdir import read_points

    assert list(plots.varying_labels(read_points(tmp_path / "sweep")).values()) == [
        "learning_rate=1e-4 strategy=ddp",
        "learning_rate=1e-4 strategy=zero2",
        "learning_rate=2e-4 strategy=ddp",
        "learning_rate=2e-4 strategy=zero2",
    ]


def test_the_sweep_figure_zooms_to_the_values_marks_the_best_and_fits_its_titles(tmp_path: Path) -> None:
    fixture_sweep(tmp_path / "sweep")
    facts, _ = status.collect(tmp_path / "sweep", use_slurm=False)
    fig = plots.sweep_figure(tmp_path / "sweep", facts)
    curves, finals = fig.axes
    low, high = finals.get_xlim()
    assert 6.5 < low < 6.568 and 6.641 < high < 6.9  # 6.609 and 6.568 are far apart on this axis
    assert [t.get_text() for t in finals.get_yticklabels()][1] == "learning_rate=1e-4 strategy=zero2"
    notes = [t.get_text() for t in finals.texts]
    assert notes[1] == "6.5680  best" and notes[3] == "6.7000  (running)"  # the running point is not best
    assert len(curves.get_lines()) == 4 and len(fig._suptitle.get_text()) <= plots.TITLE_CHARS
    assert plots.plot_sweep(tmp_path / "sweep", facts) == tmp_path / "sweep" / "final_loss.png"


def test_a_long_run_name_is_broken_into_lines_that_fit_keeping_its_end() -> None:
    name = "tiny-sft-ddp-local-slurm-" + ",".join(f"swift.option_{i}=value" for i in range(12)) + ",seed=7"
    lines = plots._fit(name).splitlines()
    assert len(lines) == 2 and all(len(line) <= plots.TITLE_CHARS for line in lines) and lines[1].endswith("seed=7")


def test_run_throughput_is_samples_per_second_as_status_shows_it(tmp_path: Path) -> None:
    run_dir = write_point(tmp_path / "sweep", 0, ["seed=1"], [3.0, 2.0])
    series, label = plots.run_series(run_dir)["throughput.png"]
    facts, _ = status.collect(run_dir, use_slurm=False)
    assert label == "samples/s" and series[-1][1] == facts[0].samples_per_s == 4 / 0.5
