"""PNG plots from what runs logged: loss and throughput per run; for a sweep, one figure that answers "which
point is best, and how did each train": every point's loss curve, and its final loss on an axis zoomed to the
points' values (6.609 and 6.568 apart, not two bars from 0), the best point marked. Points are labelled by the
overrides that differ between them (sweep.jsonl), not by run names that repeat what every point shares.

matplotlib (Agg, no display) is imported only here, only when a plot is asked for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swiftslurm.ops.runs import RunFacts
from swiftslurm.plan import PlanGlance
from swiftslurm.rundir.metrics import read_metrics
from swiftslurm.rundir.sweepdir import is_sweep, read_points, run_dirs

TITLE_CHARS = 80  # per title line: what fits the figures' width at the title's font size


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _fit(title: str) -> str:
    """At most two lines that fit: a long run name is broken, and only a very long one loses its middle (its
    end, where a sweep point's overrides are, stays)."""
    if len(title) <= TITLE_CHARS:
        return title
    if len(title) <= 2 * TITLE_CHARS:
        return title[:TITLE_CHARS] + "\n" + title[TITLE_CHARS:]
    return title[:TITLE_CHARS] + "\n…" + title[-(TITLE_CHARS - 1) :]


def plot_run(run_dir: Path) -> list[Path]:
    """loss.png and throughput.png (samples/s, as `status` shows it) in the run dir (none before a step)."""
    name = PlanGlance.read(run_dir).run_name or run_dir.name
    return [_line_plot(run_dir / file, series, label, name) for file, (series, label) in run_series(run_dir).items()]


def run_series(run_dir: Path) -> dict[str, tuple[tuple[tuple[int, float], ...], str]]:
    """What each run plot shows: file name -> ((step, value), ...), axis label; a file without values is left out."""
    metrics = read_metrics(run_dir)
    plan_batch = PlanGlance.read(run_dir).batch
    batch = plan_batch.global_ if plan_batch else None
    speed = tuple((s, batch / v) for s, v in metrics.speeds if v > 0) if batch else ()
    wanted = {"loss.png": (metrics.losses, "training loss"), "throughput.png": (speed, "samples/s")}
    return {file: (series, label) for file, (series, label) in wanted.items() if series}


def _line_plot(path: Path, series: tuple[tuple[int, float], ...], label: str, name: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([s for s, _ in series], [v for _, v in series], marker=".")
    ax.set(xlabel="step", ylabel=label)
    ax.set_title(_fit(name), fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def varying_labels(points: list[dict[str, Any]]) -> dict[str, str]:
    """Each point's run dir -> the overrides in which it differs from the other points (`learning_rate=2e-4
    strategy=zero2`); a key is shortened to its last part where that stays unambiguous."""
    values = [_override_values(p.get("overrides", [])) for p in points]
    keys = list(dict.fromkeys(k for v in values for k in v))  # in the command's order
    varying = [k for k in keys if len({v.get(k) for v in values}) > 1]
    short = {k: k.rsplit(".", 1)[-1] for k in varying}
    names = {k: short[k] if list(short.values()).count(short[k]) == 1 else k for k in varying}
    return {
        str(p["run_dir"]): " ".join(f"{names[k]}={v[k]}" for k in varying if k in v) or str(p.get("run_name", ""))
        for p, v in zip(points, values, strict=True)
    }


def _override_values(overrides: list[str]) -> dict[str, str]:
    """`++swift.lr=1e-4` -> {'swift.lr': '1e-4'} (a deletion `~key` counts as the value '~')."""
    pairs = (o.lstrip("+").partition("=") for o in overrides)
    return {key.lstrip("~"): (value if sep else "~") for key, sep, value in pairs}


def best_point(points: list[RunFacts]) -> RunFacts:
    """The lowest final loss among the finished points (among all of them while none has finished)."""
    finished = [f for f in points if f.state == "finished"] or points
    return min(finished, key=lambda f: f.loss if f.loss is not None else float("inf"))


def plot_sweep(sweep_dir: Path, facts: list[RunFacts]) -> Path | None:
    """final_loss.png in the sweep dir (None while no point has logged a loss)."""
    fig = sweep_figure(sweep_dir, facts)
    if fig is None:
        return None
    path = sweep_dir / "final_loss.png"
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)
    return path


def sweep_figure(sweep_dir: Path, facts: list[RunFacts]) -> Any | None:
    """The loss curve of every point (left) and each point's final loss (right), the best one marked."""
    points = [f for f in facts if f.loss is not None]
    if not points:
        return None
    labels = varying_labels(read_points(sweep_dir))
    label = {f.run_dir: labels.get(f.run_dir) or f.run_name for f in points}
    fig, (curves, finals) = _pyplot().subplots(1, 2, figsize=(12, max(4.0, 1.5 + 0.35 * len(points))))
    best = best_point(points)
    _curves(curves, points, label, best)
    _finals(finals, points, label, best)
    fig.suptitle(_fit(f"sweep {sweep_dir.name}: lower loss is better"), fontsize=11)
    fig.tight_layout()
    return fig


def _curves(ax: Any, points: list[RunFacts], label: dict[str, str], best: RunFacts) -> None:
    for i, f in enumerate(points):  # point i has colour Ci in both panels
        losses = read_metrics(Path(f.run_dir)).losses
        steps, values = [s for s, _ in losses], [v for _, v in losses]
        ax.plot(steps, values, color=f"C{i}", label=label[f.run_dir], lw=2.5 if f is best else 1)
    ax.set(xlabel="step", ylabel="training loss")
    ax.set_title("how each point trained", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _finals(ax: Any, points: list[RunFacts], label: dict[str, str], best: RunFacts) -> None:
    """One dot per point on an axis zoomed to the values; unfinished points hollow, the best one a star."""
    rows = range(len(points))
    for row, f in zip(rows, points, strict=True):
        done = f.state == "finished"
        marker, size = ("*", 16) if f is best else ("o", 8)
        ax.plot(f.loss, row, marker, ms=size, color=f"C{row}", mfc=None if done else "white")
        note = f"{f.loss:.4f}" + ("  best" if f is best else "") + ("" if done else f"  ({f.state})")
        ax.annotate(note, (f.loss, row), xytext=(10, -4), textcoords="offset points", fontsize=8)
    ax.set_yticks(list(rows), [label[f.run_dir] for f in points], fontsize=8)
    ax.invert_yaxis()  # point 0 on top, as in `status`
    losses = [f.loss for f in points if f.loss is not None]  # every point here has one (sweep_figure)
    low, high = min(losses), max(losses)
    pad = (high - low) * 0.15 or abs(high) * 0.01 or 0.01  # equal losses still get a readable axis
    ax.set_xlim(low - pad, high + 3 * pad)  # room on the right for the values
    ax.set(xlabel="final loss (axis zoomed to the points; hollow: not finished)")
    ax.set_title("which point is best", fontsize=10)
    ax.grid(alpha=0.3, axis="x")


def plot_path(path: Path, facts: list[RunFacts]) -> list[Path]:
    written = [png for run_dir in run_dirs(path) for png in plot_run(run_dir)]
    if is_sweep(path) and (sweep_png := plot_sweep(path, facts)) is not None:
        written.append(sweep_png)
    return written
