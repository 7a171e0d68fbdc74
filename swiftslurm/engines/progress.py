"""Training progress: "step K of N" lines followed in a file (which file and pattern: the engine adapter's
ProgressSource), ms-swift's end-of-training summary in logging.jsonl, and the pause line the ranks print
before a save, an evaluation or an epoch boundary (swiftslurm/node/hang.py keeps such gaps out of its window)."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from swiftslurm.rundir.layout import METRICS


@dataclass
class ProgressWatch:
    """Follows a file from where it ends now (earlier attempts may have written to it): the newest step
    and when it was first seen (for the hang watchdog). ``pattern`` has two groups: step, last step."""

    log_path: Path
    started: float
    pattern: re.Pattern[str]
    step: int | None = None
    max_steps: int | None = None
    first_step_at: float | None = None
    last_change_at: float | None = None
    _offset: int = field(init=False)

    def __post_init__(self) -> None:
        self._offset = self.log_path.stat().st_size if self.log_path.is_file() else 0

    def poll(self, now: float | None = None) -> None:
        now = time.time() if now is None else now
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._offset)
                chunk = log.read().decode(errors="replace")
        except FileNotFoundError:
            return
        matches = list(self.pattern.finditer(chunk))
        if matches:
            # Only complete matches advance the offset: a line still being written is read again.
            self._offset += len(chunk[: matches[-1].end()].encode(errors="replace"))
            step, total = int(matches[-1].group(1)), int(matches[-1].group(2))
            if step != self.step:
                self.step, self.max_steps, self.last_change_at = step, total, now
                self.first_step_at = self.first_step_at or now

    def stalled_for(self, now: float) -> float:
        """Seconds since the last new step (since the start while none was seen yet)."""
        return now - (self.last_change_at or self.started)


@dataclass
class LineFollower:
    """New matches of ``pattern`` in a file as it grows, from where it ended when the follower was made. Reads
    complete lines only ('\\n' or '\\r' ends one: progress bars), so a line still being written is read once
    it is whole, and each byte is read once however rarely the pattern occurs."""

    path: Path
    pattern: re.Pattern[str]
    _offset: int = field(init=False)

    def __post_init__(self) -> None:
        self._offset = self.path.stat().st_size if self.path.is_file() else 0

    def new_matches(self) -> list[re.Match[str]]:
        try:
            with open(self.path, "rb") as log:
                log.seek(self._offset)
                chunk = log.read()
        except FileNotFoundError:
            return []
        whole = max(chunk.rfind(b"\n"), chunk.rfind(b"\r")) + 1
        self._offset += whole
        return list(self.pattern.finditer(chunk[:whole].decode(errors="replace")))


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


# What the ranks print (global rank 0) at the end of a step that a long pause follows: the save, the
# evaluation or the epoch boundary that follows it. hooks.py prints it; the leader follows it in node 0's log.
PAUSE_LINE = "[swiftslurm] pause after step {step}: {kinds}"


PAUSE_PATTERN = re.compile(r"\[swiftslurm\] pause after step (\d+): ([a-z, ]+)")
