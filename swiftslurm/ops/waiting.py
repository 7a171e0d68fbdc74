"""What a run is waiting for right now, in one line, and a narrator that says it while a command waits:
`wait=true` (launch.wait_for) prints a line whenever the wait changes (in the queue, nodes starting, restoring,
model loading, training, saving, uploading, concluding) and again every REPEAT_S while it does not, with the
time spent and the progress where there is a count, so no wait over a few seconds is silent.

Everything comes from the run dir (the leader's phase in status.json, node 0's heartbeat while it restores,
global rank 0's step beat, sync.json) and from what the caller learned of the queue.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from swiftslurm.ops.runs import RunFacts
from swiftslurm.rundir import beat
from swiftslurm.rundir.beat import describe_leader_beat, read_leader_beat
from swiftslurm.rundir.layout import LEADER_BEAT, attempt_dir, progress_file
from swiftslurm.rundir.records import read_status

REPEAT_S = 15.0  # a wait that has not changed is said again this often, with the time spent
_FIGURES = re.compile(r"\d+(?:\.\d+)?")


@dataclass(frozen=True)
class QueueSpot:
    """Where a pending job stands: SLURM's reason (Resources, Priority, BeginTime...), its place among the
    partition's pending jobs (1 = next), how many are pending."""

    reason: str
    position: int | None = None
    pending: int | None = None

    def describe(self) -> str:
        place = f"{self.position} of {self.pending} pending in its partition" if self.position else ""
        reason = f"SLURM: {self.reason}" if self.reason and self.reason != "None" else ""  # None: not yet judged
        return ", ".join(part for part in (reason, place) if part)


def waiting_for(run_dir: Path, facts: RunFacts, queue: QueueSpot | None = None) -> str:
    """What the run waits for now, e.g. 'in the queue (SLURM: Resources, 2 of 3 pending in its partition)',
    'restoring: downloading checkpoint-40 from s3://b/p/ (1.2 of 3.4 GiB)', 'training: step 26 of 40'."""
    if facts.state in ("pending", "requeued"):
        what = "in the queue" if facts.state == "pending" else "requeued, waiting to start again"
        return f"{what} ({queue.describe()})" if queue and queue.describe() else what
    status = read_status(run_dir) or {}
    phase, attempt = str(status.get("phase") or "prepare"), status.get("attempt")
    here = attempt_dir(run_dir, str(attempt)) if attempt else None
    if phase == "finish_uploads":  # the run's end is recorded already: the last uploads are awaited
        pending = (facts.storage or {}).get("pending", [])
        return f"uploading: {len(pending)} checkpoint(s) still to upload" if pending else "uploading"
    if facts.state != "running":
        return f"{facts.state}; waiting for the job to end"
    if phase == "prepare":
        return "starting on the nodes (allocation check, lease, preflight)"
    if phase == "agree_on_resume":
        leader = read_leader_beat(here / LEADER_BEAT) if here else None
        return f"restoring: {describe_leader_beat(leader)}" if leader else "choosing the resume point"
    if phase == "train":
        return _training(here)
    return {
        "conclude": "concluding the attempt",
        "await_outcome": "waiting for node 0's decision",
        "signalled": "stopping (a stop signal came before training)",
        "unrestored": "stopping (the object store could not be read)",
    }.get(phase, phase.replace("_", " "))


def _training(here: Path | None) -> str:
    step = beat.read_beat(progress_file(here)) if here else None
    if step is None:
        return "loading the model and data (no training step yet)"
    of = f" of {step.max_steps}" if step.max_steps else ""
    doing = {beat.SAVE: "saving a checkpoint", beat.EVAL: "evaluating", beat.EPOCH: "starting an epoch"}
    if step.phase in doing:
        return f"{doing[step.phase]} after step {step.step}{of}"
    return f"training: step {step.step}{of}"


@dataclass
class Narrator:
    """Says the wait when it changes, and again every REPEAT_S while it lasts ('still ...', with the time)."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    clock: Callable[[], float] = time.monotonic
    said: str = ""
    since: float = 0.0
    last_said: float = 0.0

    def __call__(self, what: str) -> None:
        """A new kind of wait is said at once; new figures of the same wait (the step, the bytes) and the same
        wait unchanged, at most every REPEAT_S."""
        now = self.clock()
        if _kind(what) != _kind(self.said):
            self.said, self.since, self.last_said = what, now, now
            self.say(what)
        elif now - self.last_said >= REPEAT_S:
            still = what == self.said
            self.said, self.last_said = what, now
            self.say(f"still {what} ({now - self.since:.0f} s)" if still else what)

    def begin(self, text: str, what: str) -> None:
        """Say ``text`` now as the start of the wait ``what`` (a fuller first line, e.g. with its bound): from
        here ``what`` goes on as if just said, its new figures and repeats every REPEAT_S."""
        self.said, self.since = what, self.clock()
        self.last_said = self.since
        self.say(text)

    def say(self, text: str) -> None:
        """One line now, in the narrator's form, without changing the wait it repeats."""
        print(f"{time.strftime('%H:%M:%S')}  {text}", file=self.out, flush=True)


def _kind(what: str) -> str:
    """The wait without its figures: 'training: step # of #'."""
    return _FIGURES.sub("#", what)
