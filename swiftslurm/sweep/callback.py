"""The end of a `-m` sweep, for the user: the Hydra callback that waits and prints the table, the leftovers
of a refused sweep removed, the points not submitted named.

The sweep directory's records are swiftslurm/rundir/sweepdir.py's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from swiftslurm.errors import RunFailed, SubmitError
from swiftslurm.rundir.sweepdir import SWEEP_FILE, is_sweep

NAMES_SHOWN = 20  # points a failed submission names in its one line
HYDRA_RECORD = "multirun.yaml"  # what Hydra writes into the sweep folder before the first point is planned
# Sweep folders this process started, each with the outermost folder Hydra had to create for it
# (SweepCallback.on_multirun_start); a sweep refused before any point was planned removes them again.
_STARTED: list[tuple[Path, Path | None]] = []
# What a waited-for sweep's end found, for the command line to raise once Hydra returns: Hydra turns an
# exception raised in a callback into a warning (hydra/_internal/callbacks.py).
_UNFINISHED: list[RunFailed] = []


def discard_unplanned_sweeps() -> None:
    """Remove what Hydra wrote for a sweep that was refused before any point was planned (no sweep.json):
    its multirun.yaml and the empty folders Hydra created for it. Nothing else is touched."""
    while _STARTED:
        sweep_dir, created = _STARTED.pop()
        if is_sweep(sweep_dir):
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


def not_submitted(err: Exception, names: list[str], sweep_dir: Path) -> SubmitError:
    """The error for a submission that failed: its cause and the points left unsubmitted (the first NAMES_SHOWN
    of them, and where the rest are)."""
    shown = ", ".join(names[:NAMES_SHOWN]) or "none"
    if len(names) > NAMES_SHOWN:
        shown += f" and {len(names) - NAMES_SHOWN} more (recorded `planned` in {sweep_dir / SWEEP_FILE})"
    return SubmitError(
        f"{str(err).rstrip('.')}. Not submitted: {shown}. "
        "HINT: fix the cause and run the same command again: it submits the points not submitted yet "
        "and leaves the others alone."
    )


def raise_unfinished_sweep() -> None:
    """Raise what the sweep's end found (RunFailed: a point did not finish), once Hydra has returned."""
    if _UNFINISHED:
        raise _UNFINISHED.pop()


class SweepCallback:
    """Hydra callback (conf/config.yaml), at the end of a `-m` sweep (every point submitted by the sweeper): with
    `wait=true`, waits for every point (a line each time one changes state) and prints the status table; exit
    status 1 if any point did not finish."""

    POLL_S = 5.0

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        _STARTED.append((sweep_dir, _first_missing(sweep_dir)))

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if config.get("dry_run"):
            return
        path = Path(config.hydra.sweep.dir).resolve()
        # The points' run dirs are printed as they are submitted; the sweep dir that gathers them is not.
        print(f"sweep dir {path}: `python -m swiftslurm status {path}` (--plot, --json); `cancel` or `resume` it")
        if not config.get("wait"):
            return
        from swiftslurm.ops.follow import watch_points
        from swiftslurm.ops.status import collect, render

        facts, slurm = watch_points(path, collect, lambda: time.sleep(self.POLL_S))
        print(render(facts, slurm), flush=True)
        unfinished = [f for f in facts if f.state != "finished"]
        if unfinished:
            names = ", ".join(f.run_name for f in unfinished[:NAMES_SHOWN])
            _UNFINISHED.append(RunFailed(f"{len(unfinished)} of {len(facts)} sweep points did not finish: {names}."))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):  # Hydra calls every hook; only the end of a multirun matters here
            return lambda *args, **kwargs: None
        raise AttributeError(name)
