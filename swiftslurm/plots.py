"""PNG plots from what runs logged: loss and throughput per run, final loss per point of a sweep.

matplotlib (Agg, no display) is imported only here, only when a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swiftslurm.rundir import plan_file
from swiftslurm.runs import RunFacts, read_json, read_metrics
from swiftslurm.sweep import is_sweep, run_dirs


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_run(run_dir: Path) -> list[Path]:
    """loss.png and throughput.png in the run dir (nothing when no step was logged yet)."""
    metrics = read_metrics(run_dir)
    plan = read_json(plan_file(run_dir)) or {}
    name = str(plan.get("run_name", run_dir.name))
    written = []
    plt = _pyplot()
    for filename, series, label in (
        ("loss.png", metrics.losses, "training loss"),
        ("throughput.png", tuple((s, 1.0 / v) for s, v in metrics.speeds if v > 0), "steps / s"),
    ):
        if not series:
            continue
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([s for s, _ in series], [v for _, v in series], marker=".")
        ax.set(xlabel="step", ylabel=label, title=f"{name}: {label}")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(run_dir / filename, dpi=100)
        plt.close(fig)
        written.append(run_dir / filename)
    return written


def plot_sweep(sweep_dir: Path, facts: list[RunFacts]) -> Path | None:
    """final_loss.png: one bar per point (its latest loss), labelled by run name."""
    points = [f for f in facts if f.loss is not None]
    if not points:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(points)), 4.5))
    ax.bar(
        range(len(points)), [f.loss for f in points], color=["C0" if f.state == "finished" else "C1" for f in points]
    )
    ax.set_xticks(range(len(points)), [f.run_name for f in points], rotation=30, ha="right", fontsize=8)
    ax.set(ylabel="latest loss", title="sweep: latest loss per point (orange: not finished)")
    fig.tight_layout()
    path = sweep_dir / "final_loss.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_path(path: Path, facts: list[RunFacts]) -> list[Path]:
    written = [png for run_dir in run_dirs(path) for png in plot_run(run_dir)]
    if is_sweep(path) and (sweep_png := plot_sweep(path, facts)) is not None:
        written.append(sweep_png)
    return written
