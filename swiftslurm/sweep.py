"""A sweep directory: which points a `-m` sweep has, their overrides, run directories and jobs.

Every point of a Hydra multirun is planned and submitted by swiftslurm's own `run` (Hydra's basic launcher
calls it once per point, in this process, without waiting for jobs), and records itself in
`<sweep dir>/sweep.json`. Each point is an ordinary run with its own run directory, requeued and resumed
on its own. Running the same sweep again skips the points that are finished or still queued.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from swiftslurm.errors import SwiftSlurmError
from swiftslurm.node.ckpt.checkpoint import write_json_atomic
from swiftslurm.rundir import SUBMITIT, plan_file
from swiftslurm.runs import read_json

SWEEP_FILE = "sweep.json"  # in the sweep folder, beside its run directories
HYDRA_RECORD = "multirun.yaml"  # what Hydra writes into the sweep folder before the first point is planned
# Sweep folders this process started, each with the outermost folder Hydra had to create for it
# (SweepCallback.on_multirun_start); a sweep refused before any point was planned removes them again.
_STARTED: list[tuple[Path, Path | None]] = []


def record_point(sweep_dir: Path, point: dict[str, Any]) -> None:
    """Add or replace (by run dir) one point of the sweep. Points are recorded one after another by the
    process that launches the sweep, so a read-modify-write is safe; the write itself is atomic."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    path = sweep_dir / SWEEP_FILE
    data = read_json(path) or {"created": time.time(), "points": []}
    points = [p for p in data.get("points", []) if p.get("run_dir") != point["run_dir"]]
    data["points"] = sorted([*points, point], key=lambda p: p.get("num", 0))
    data["updated"] = time.time()
    write_json_atomic(path, data)


def run_dirs(path: Path) -> list[Path]:
    """The run directories behind ``path``: a run dir itself, a sweep dir's points, or every run dir
    directly inside a folder (e.g. `runs/`)."""
    if plan_file(path).is_file():
        return [path]
    sweep = read_json(path / SWEEP_FILE)
    if sweep is not None:
        return [Path(p["run_dir"]) for p in sweep.get("points", []) if p.get("run_dir")]
    return sorted(child for child in path.iterdir() if plan_file(child).is_file()) if path.is_dir() else []


def is_sweep(path: Path) -> bool:
    return (path / SWEEP_FILE).is_file()


def submit_planned(sweep_dir: Path, parallelism: int) -> list[str]:
    """Submit the points recorded as `planned` as job arrays (one per distinct allocation), record their
    job ids in each run dir and in sweep.json, and return them."""
    from swiftslurm import submit
    from swiftslurm.plan import JobPlan
    from swiftslurm.runs import record_submission

    data = read_json(sweep_dir / SWEEP_FILE) or {}
    planned = [p for p in data.get("points", []) if p.get("action") == "planned"]
    groups: dict[str, list[tuple[dict[str, Any], JobPlan]]] = {}
    for point in planned:
        plan = JobPlan.load(plan_file(Path(point["run_dir"])))
        groups.setdefault(submit.allocation_key(plan), []).append((point, plan))
    job_ids = []
    for members in groups.values():
        jobs = submit.submit_array([plan for _, plan in members], sweep_dir / SUBMITIT, parallelism)
        for (point, plan), job in zip(members, jobs, strict=True):
            record_submission(Path(plan.run_dir), str(job.job_id), plan.scheduler)
            record_point(sweep_dir, {**point, "job_id": str(job.job_id), "action": "submitted"})
            job_ids.append(str(job.job_id))
    if job_ids:
        print(f"submitted {len(job_ids)} point(s) as job array(s) {sorted({j.split('_')[0] for j in job_ids})}")
    return job_ids


def discard_unplanned_sweeps() -> None:
    """Remove what Hydra wrote for a sweep that was refused before any point was planned (no sweep.json):
    its multirun.yaml and the empty folders Hydra created for it. Nothing else is touched."""
    while _STARTED:
        sweep_dir, created = _STARTED.pop()
        if (sweep_dir / SWEEP_FILE).exists():
            continue
        (sweep_dir / HYDRA_RECORD).unlink(missing_ok=True)
        if created is None:
            continue
        for folder in (sweep_dir, *sweep_dir.parents):
            if not folder.is_dir() or any(folder.iterdir()):
                break
            folder.rmdir()
            if folder == created:
                break


def _first_missing(path: Path) -> Path | None:
    """The outermost folder of ``path`` that does not exist yet; None when ``path`` exists."""
    if path.exists():
        return None
    missing = path
    for parent in path.parents:
        if parent.exists():
            break
        missing = parent
    return missing


def _report_unsubmitted(sweep_dir: Path, err: Exception) -> None:
    """An array sbatch failed: name the points left unsubmitted and exit 2 (Hydra turns a callback's exception
    into a warning and exits 0, so the failure would go unseen)."""
    points = (read_json(sweep_dir / SWEEP_FILE) or {}).get("points", [])
    left = [str(p.get("run_name")) for p in points if p.get("action") == "planned"]
    print(
        f"swiftslurm: error: {str(err).rstrip('.')}. Not submitted: {', '.join(left) or 'none'}. "
        "HINT: fix the cause and run the same command again: it submits the points not submitted yet "
        "and leaves the others alone.",
        file=sys.stderr,
    )
    sys.exit(2)


class SweepCallback:
    """Hydra callback (conf/config.yaml), at the end of a `-m` sweep: submits the points planned for a job
    array (`array_parallelism=N`), then, with `wait=true`, waits for every point and prints the status
    table; exit status 1 if any point did not finish."""

    POLL_S = 5.0

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        _STARTED.append((sweep_dir, _first_missing(sweep_dir)))

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if config.get("dry_run"):
            return
        path = Path(config.hydra.sweep.dir).resolve()
        if config.get("array_parallelism"):
            try:
                submit_planned(path, int(config.array_parallelism))
            except SwiftSlurmError as err:
                _report_unsubmitted(path, err)
        if not config.get("wait"):
            return
        from swiftslurm.runs import FINAL_STATES
        from swiftslurm.status import collect, render

        while True:
            facts, slurm = collect(path)
            if all(f.state in FINAL_STATES for f in facts):
                break
            time.sleep(self.POLL_S)
        print(render(facts, slurm), flush=True)
        if any(f.state != "finished" for f in facts):
            sys.exit(1)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):  # Hydra calls every hook; only the end of a multirun matters here
            return lambda *args, **kwargs: None
        raise AttributeError(name)
