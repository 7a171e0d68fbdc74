"""What a run is waiting for right now, in one line, and a narrator that says it while a command waits:
`wait=true` (wait_for, below) prints a line whenever the wait changes (in the queue, nodes starting, restoring,
model loading, training, saving, uploading, concluding) and again every REPEAT_S while it does not, with the
time spent and the progress where there is a count, so no wait over a few seconds is silent.

Everything comes from the run dir (the leader's phase in status.json, node 0's heartbeat while it restores,
global rank 0's step beat, sync.json) and from what the caller learned of the queue.
"""

from __future__ import annotations

import math
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import RunFailed, SwiftSlurmError, report
from swiftslurm.ops.runs import ACTIVE_STATES, RunFacts, SlurmView, facts_of, gather
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import beat
from swiftslurm.rundir import layout as rundir
from swiftslurm.rundir.beat import describe_leader_beat, read_leader_beat
from swiftslurm.rundir.layout import LEADER_BEAT, attempt_dir, progress_file
from swiftslurm.rundir.records import read_status
from swiftslurm.submit.report import result_summary

if TYPE_CHECKING:
    import submitit

POLL_S = 2.0  # how often wait=true reads the run dir
QUEUE_POLL_S = 10.0  # and asks SLURM where a pending job stands in the queue
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


# ------------------------------------------------------------------ wait=true

_LOSS = re.compile(r"\{'loss': '([^']+)'.*?'global_step/max_steps': '([^']+)'")
END_SETTLE_S = 30.0  # once submitit says the job ended: how long SLURM's accounting may take to say so too


@dataclass
class LossLines:
    """Each new loss line ms-swift logged on node 0, as `step N  loss L`."""

    run_dir: Path
    seen: dict[Path, int] = field(default_factory=dict)

    def print_new(self) -> None:
        for log in sorted(rundir.leader_logs(self.run_dir)):
            text = log.read_text(errors="replace")
            for match in _LOSS.finditer(text, self.seen.get(log, 0)):
                print(f"  step {match.group(2)}  loss {match.group(1)}", flush=True)
                self.seen[log] = match.end()  # a line still being written is matched next time


@dataclass
class QueueWatch:
    """A pending job's place in its partition's queue, asked at most every QUEUE_POLL_S (one squeue)."""

    partition: str | None
    asked_at: float = -math.inf
    spot: QueueSpot | None = None

    def where(self, job_id: str) -> QueueSpot | None:
        if time.monotonic() - self.asked_at >= QUEUE_POLL_S:
            self.asked_at = time.monotonic()
            self.spot = queue_spot(job_id, self.partition)
        return self.spot


def queue_spot(job_id: str, partition: str | None) -> QueueSpot | None:
    """SLURM's reason and the job's place among the partition's pending jobs; None if SLURM cannot say."""
    try:
        pending = slurm_cli.pending_queue(partition)
    except SwiftSlurmError:
        return None
    ids = [job for job, _ in pending]
    if job_id not in ids:
        return None
    return QueueSpot(pending[ids.index(job_id)][1], ids.index(job_id) + 1, len(ids))


def wait_for(job: submitit.Job[Any], plan: JobPlan) -> int:
    """Wait for the job, saying what the run waits for (waiting_for) and each loss ms-swift logs; then its
    end as `status` tells it (ops/runs.py), one line with the reason and the logs when it did not finish.
    Exit status 0 only if the run finished."""
    run_dir, job_id = Path(plan.run_dir), str(job.job_id)
    narrate, losses = Narrator(), LossLines(run_dir)
    queue = QueueWatch(plan.slurm.partition if plan.slurm else None)
    while not job.done():
        facts = gather(run_dir, SlurmView(available=True, states={job_id: job.state}))  # submitit's view: no call
        narrate(waiting_for(run_dir, facts, queue.where(job_id) if facts.state in ("pending", "requeued") else None))
        losses.print_new()
        time.sleep(POLL_S)
    losses.print_new()
    state, why, attempts = ended(job, run_dir)
    summary = result_summary(plan, state, why, attempts)
    if state == "finished":
        print(f"job {job_id} finished.\n{summary}")
        return 0
    logs = f"`python -m swiftslurm logs {run_dir}` (the wrapper's own output: {job.paths.stdout})"
    report(RunFailed(f"job {job_id} {state}: {why or 'no reason recorded'}. Logs: {logs}"))
    print(summary, file=sys.stderr)
    return 1


def ended(job: submitit.Job[Any], run_dir: Path) -> tuple[str, str, int]:
    """The run's state, why, and its attempts once its job has ended, as `status` tells it: asked again while
    SLURM's accounting still shows the job queued or running (it lags behind the job's end), at most
    END_SETTLE_S; a job that ended is never reported as running."""
    deadline = time.monotonic() + END_SETTLE_S
    facts = facts_of(run_dir)
    while facts.state in ACTIVE_STATES and time.monotonic() < deadline:
        time.sleep(POLL_S)
        facts = facts_of(run_dir)
    if facts.state in ACTIVE_STATES:
        return (
            "failed",
            f"the job ended (submitit: {job.state}) without a final record from the wrapper",
            facts.attempts,
        )
    return facts.state, facts.why, facts.attempts
