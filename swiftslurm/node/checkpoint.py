"""Finding checkpoints in ms-swift's output directory."""

from __future__ import annotations

import re
from pathlib import Path

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_step(path: Path) -> int | None:
    """The step N of a `checkpoint-N` folder, or None for anything else."""
    match = _CHECKPOINT.match(path.name)
    return int(match.group(1)) if match else None


def newest_checkpoint(output_dir: Path) -> Path | None:
    """The highest-step `checkpoint-N` that has its trainer_state.json (written at the end of a save)."""
    if not output_dir.is_dir():
        return None
    found = [
        (step, path)
        for path in output_dir.iterdir()
        if (step := checkpoint_step(path)) is not None and (path / "trainer_state.json").is_file()
    ]
    return max(found)[1] if found else None
