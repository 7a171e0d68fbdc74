"""A sweep directory: which points a `-m` sweep has, their overrides, run directories and jobs.

Every point of a Hydra multirun is composed once, planned and written by swiftslurm's own sweeper
(hydra_plugins/swiftslurm_sweeper, swiftslurm/sweep/sweeper.py) and recorded in `<sweep dir>/sweep.jsonl`, one line
per event, appended: `planned` when its run directory is written, then `submitted` with its job id (or why it
was skipped), and `resubmitted` with the new job id when `swiftslurm resume SWEEP_DIR` submits it again; each
line also holds the point's array_parallelism, which the resubmission keeps. The newest line of a run directory
is its state. Each point is an ordinary run with its own run directory, requeued and resumed on its own.
Running the same sweep again skips the points that are finished or still queued.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from swiftslurm.rundir.jsonio import append_jsonl, read_json, read_jsonl
from swiftslurm.rundir.layout import CONFIG, plan_file

SWEEP_FILE = "sweep.jsonl"  # in the sweep folder, beside its run directories: one line per recorded point


LEGACY_SWEEP_FILE = "sweep.json"  # what sweeps recorded before sweep.jsonl (rewritten whole per point); read only


def record_points(sweep_dir: Path, points: Iterable[dict[str, Any]]) -> None:
    """Append one line per point, then fsync once: a 1000-point sweep costs one write and one fsync per batch,
    not a rewrite of the whole record per point (quadratic). A point recorded again supersedes its older line."""
    now = time.time()
    stamped = [{**point, "at": now} for point in points]
    if not stamped:
        return
    sweep_dir.mkdir(parents=True, exist_ok=True)
    append_jsonl(sweep_dir / SWEEP_FILE, stamped)


def record_point(sweep_dir: Path, point: dict[str, Any]) -> None:
    record_points(sweep_dir, [point])


def record_resubmission(sweep_dir: Path, run_dir: Path, job_id: str) -> None:
    record_resubmissions(sweep_dir, [(run_dir, job_id)])


def record_resubmissions(sweep_dir: Path, jobs: list[tuple[Path, str]]) -> None:
    """Points resubmitted by `swiftslurm resume SWEEP_DIR` (run dir, new job id): each point's line again, with
    the job that now carries it and its array_parallelism, so the sweep's record never names a job the point has
    left; one append for all. A sweep recorded in the legacy sweep.json gets its points copied into sweep.jsonl
    first (read_points reads only sweep.jsonl once it exists)."""
    points = read_points(sweep_dir)
    by_run_dir = {Path(p["run_dir"]): p for p in points}
    lines = [
        {**point, "array_parallelism": array_parallelism(point), "job_id": job_id, "action": "resubmitted"}
        for run_dir, job_id in jobs
        if (point := by_run_dir.get(run_dir)) is not None
    ]
    if not lines:
        return
    if not (sweep_dir / SWEEP_FILE).is_file():
        record_points(sweep_dir, points)
    record_points(sweep_dir, lines)


def array_parallelism(point: dict[str, Any]) -> int:
    """The array_parallelism the point was submitted with (0: as its own job), which `resume SWEEP_DIR` submits
    it again with. Its line says; a sweep recorded by an older swiftslurm, whose lines do not, has it in the
    point's config.yaml (the config the point was planned from); neither readable: 0."""
    if "array_parallelism" in point:
        return int(point["array_parallelism"])
    import yaml

    try:
        config = yaml.safe_load((Path(point["run_dir"]) / CONFIG).read_text())
    except (OSError, yaml.YAMLError):
        return 0
    value = config.get("array_parallelism") if isinstance(config, dict) else None
    return value if isinstance(value, int) and value >= 0 else 0


def read_points(sweep_dir: Path) -> list[dict[str, Any]]:
    """Each run directory's newest line, in point order. A torn last line (a crash mid-append) is ignored:
    that point's older line still stands, and running the sweep again records it anew."""
    path = sweep_dir / SWEEP_FILE
    if not path.is_file():
        return list((read_json(sweep_dir / LEGACY_SWEEP_FILE) or {}).get("points", []))
    newest: dict[str, dict[str, Any]] = {}
    for point in read_jsonl(path):
        if point.get("run_dir"):
            newest[point["run_dir"]] = point
    return sorted(newest.values(), key=lambda p: p.get("num", 0))


def run_dirs(path: Path) -> list[Path]:
    """The run directories behind ``path``: a run dir itself, a sweep dir's points, or every run dir
    directly inside a folder (e.g. `runs/`)."""
    if plan_file(path).is_file():
        return [path]
    if is_sweep(path):
        return [Path(p["run_dir"]) for p in read_points(path)]
    return sorted(child for child in path.iterdir() if plan_file(child).is_file()) if path.is_dir() else []


def is_sweep(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file() or (path / LEGACY_SWEEP_FILE).is_file()
