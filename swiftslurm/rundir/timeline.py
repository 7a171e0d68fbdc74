"""The trainer's own account of its time, for the goodput ledger (swiftslurm/ops/ledger.py).

Global rank 0 appends one JSON line per event to logs/<attempt>/trainer.jsonl (the wrapper passes the path in
TIMELINE_ENV): when the training loop began (model and checkpoint loaded), each save (from the end of the step
it saves until every rank has written it), each commit, and when the loop ended and the last commit was waited
for. Each line is one write to a file opened for appending, so a rank killed at any moment leaves every event
before its death and at most one torn last line (skipped by the reader). Nothing is buffered: the events are a
few per save, never one per step.

Only the standard library here: every training rank imports it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from swiftslurm.rundir.jsonio import append_jsonl, read_jsonl

TIMELINE_ENV = "SWIFTSLURM_TIMELINE"  # set by the wrapper (watch.py): where rank 0 writes the events

TRAIN_BEGIN = "train_begin"  # the training loop begins: start-up and loading are over
SAVE = "save"  # a save: "started" (the end of the step it saves), "t" (every rank has written it)
COMMITTED = "committed"  # a checkpoint's manifest is written
TRAIN_END = "train_end"  # "started": the loop ended; "t": the last commit was waited for


class TimelineWriter:
    """Appends events to the file named in TIMELINE_ENV; does nothing without it (the trainer started by hand)
    or on any rank but global rank 0. A failed write is reported once and never stops training."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self.step_ended_at: float | None = None  # the end of the newest step: where a save that follows began

    @classmethod
    def from_environ(cls, rank_zero: bool) -> TimelineWriter:
        return cls(os.environ.get(TIMELINE_ENV) if rank_zero else None)

    def step_ended(self) -> None:
        """Every step: only remembered (no I/O), so that a save knows when it began."""
        self.step_ended_at = time.time()

    def event(self, kind: str, **facts: Any) -> None:
        if self.path is None:
            return
        try:
            append_jsonl(self.path, [{"event": kind, "t": round(time.time(), 3), **facts}], durable=False)
        except OSError as err:
            print(f"[swiftslurm] the trainer timeline {self.path} cannot be written ({err}); not recorded", flush=True)
            self.path = None

    def saved(self, step: int) -> None:
        """After every rank has written checkpoint ``step``: the save began when that step ended."""
        started = self.step_ended_at if self.step_ended_at is not None else time.time()
        self.event(SAVE, step=step, started=round(started, 3))


def read_timeline(path: Path) -> list[dict[str, Any]]:
    """The events of one attempt's trainer, oldest first ([] without a file); a torn last line is skipped."""
    return [event for event in read_jsonl(path) if isinstance(event.get("t"), (int, float))]
