"""What the engine's own output says of training: ms-swift's end-of-training summary in logging.jsonl, and the
end of a log. (Progress while it trains is global rank 0's heartbeat: rundir/beat.py.)"""

from __future__ import annotations

import json
from pathlib import Path

from swiftslurm.rundir.layout import METRICS


def finished_steps(output_dir: Path) -> tuple[int, int] | None:
    """(global step, max steps) from ms-swift's end-of-training summary in logging.jsonl, if training
    ended (normally, or after a graceful stop); None while it runs or if it died."""
    path = output_dir / METRICS
    if not path.is_file():
        return None
    summary = None
    for line in path.read_text(errors="replace").splitlines():
        if '"train_runtime"' in line and '"global_step/max_steps"' in line:
            summary = line
    if summary is None:
        return None
    try:
        done, total = json.loads(summary)["global_step/max_steps"].split("/")
    except (ValueError, KeyError, json.JSONDecodeError):
        return None
    return int(done), int(total)


def tail(path: Path, lines: int = 200) -> str:
    """The last ``lines`` lines of a log (progress bars split on '\\r' so they do not drown the rest)."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])
