"""The goodput ledger: where a run's allocated GPU-hours went (pure functions of facts; no I/O).

Allocated device-seconds are SLURM's: each run of each of the run's jobs (one row of `sacct --duplicates`: a
requeue starts a new one) held `width` devices (nodes × GPUs per node, or CPU processes per node) from its
Start to its End. That time is split by marks: a mark says from which moment the time goes to which category,
until the next mark. The allocation's Start opens start-up; each attempt adds its own marks, from the
attempt's record (when the wrapper entered each phase, node/attempt.py) and from its trainer's timeline
(global rank 0: training loop begun, each save and commit, loop ended; rundir/timeline.py):

    startup      job start -> the wrapper's attempt (allocation check, lease, preflight)
    restore      choosing the resume point (quarantine; the restore from object storage; converting a ZeRO
                 checkpoint for another number of ranks, engines/zero_reshard.py)
    load         the trainer's start -> its training loop (ms-swift start-up, model and checkpoint load)
    committed    training whose steps a later commit of the same attempt covers
    lost         training after the attempt's last commit, up to the last sign of training (the steps a
                 preemption, a crash or a hang lost)
    save         saving checkpoints (the step's end -> every rank has written it; the last commit at the end)
    restart      after the last commit (or, when the loop never ended, the last sign of training) of an
                 attempt that is requeued or restarted: noticing the failure, the trainer's exit, the decision,
                 the requeue, SLURM ending the job run (and a next attempt's preparation in the same allocation)
    finish       the same after the run's last attempt (done, or stopped for good)
    uncommitted  training since the last commit of the attempt still running (lost if it ended now)
    spares       the spare nodes' share (`resilience.spare_nodes`) of each row SLURM accounts, idle while they
                 stand by; a `--no-kill` job that lost a node is resized by SLURM (sacct: a RESIZING row, then
                 the job on the nodes left): both rows are one job run, whose marks go on across the resize

Queue wait (Start - Submit of each job run) is not allocated, so it is shown beside the split, not in it;
so is the requeue hold (a requeued job run's End -> its return to the queue: SLURM's KillWait, during which
the nodes are held but not accounted).

Every allocated second is in exactly one category: the split counts only what lies between SLURM's Start and
End of the job run. SLURM keeps those in whole seconds, cut down, while the records are node 0's clock to the
millisecond, so an attempt's records may reach up to a second past End (and, where node 0's clock runs ahead
of slurmctld's, begin before Start). That time is not counted in any category; `outside` says how much there
was, beside the split. `unaccounted` (allocated minus the categories) is what no mark covers: never negative.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from swiftslurm.rundir.timeline import COMMITTED, SAVE, TRAIN_BEGIN, TRAIN_END

if TYPE_CHECKING:
    from swiftslurm.rundir.records import AttemptRecord

CATEGORIES = (
    "startup",
    "restore",
    "load",
    "committed",
    "lost",
    "save",
    "restart",
    "finish",
    "uncommitted",
    "spares",
)
LABELS = {
    "startup": "start-up",
    "restore": "restore",
    "load": "model/checkpoint load",
    "committed": "training, committed",
    "lost": "training lost since the last commit",
    "save": "checkpoint save",
    "restart": "requeue/restart delay",
    "finish": "finish (after the last attempt)",
    "uncommitted": "training not yet committed",
    "spares": "spare nodes standing by",
}
SLACK_S = 2.0  # sacct's times are whole seconds: an attempt may seem to begin or end that much outside its job run
FINAL_DECISIONS = ("done", "stop")


@dataclass(frozen=True)
class Mark:
    """From ``at`` on, the allocation's time goes to ``category`` (until the next mark)."""

    at: float
    category: str


@dataclass(frozen=True)
class Allocation:
    """One run of a SLURM job (a row of `sacct --duplicates`), or an attempt's own span where SLURM cannot say."""

    job_id: str
    start: float
    end: float | None  # None: still running
    width: int  # devices held: nodes × GPUs (or CPU processes) per node
    submit: float | None = None
    from_slurm: bool = True
    raw_id: str | None = None  # sacct's JobIDRaw where it differs from job_id: an array task's own id
    # SLURM resized the job at this row's End (sacct: RESIZING; a `--no-kill` job that lost a node): the job's next
    # row, from that moment on the nodes left, continues the same job run.
    resized: bool = False

    def carries(self, job_id: str) -> bool:
        """Whether ``job_id`` names this job: sacct's name (`11_2` for an array task) or its raw id (`14`: what
        SLURM_JOB_ID, and so the attempt's record, says inside the task)."""
        return job_id in (self.job_id, self.raw_id)


@dataclass(frozen=True)
class AttemptMarks:
    """One attempt: which job it ran in, when it began and ended (None: no record, lost or running), its marks."""

    attempt: str
    job_id: str | None
    began: float
    ended: float | None
    marks: tuple[Mark, ...]
    hosts: int = 1
    spares: int = 0  # nodes of its allocation standing by as spares (`resilience.spare_nodes`)


@dataclass(frozen=True)
class Ledger:
    """Device-seconds per category, the allocated total, and the waits beside it (wall seconds)."""

    unit: str  # "GPU" or "CPU process": what `width` counts
    allocated_s: float
    spent_s: dict[str, float] = field(default_factory=dict)
    queue_wait_s: float = 0.0
    requeue_hold_s: float = 0.0
    job_runs: int = 0
    own_spans: int = 0  # job runs SLURM could not account for (a local run): allocated the attempt's own span
    outside_s: float = 0.0  # device-seconds of the records outside their job run's Start..End: in no category

    @property
    def from_slurm(self) -> bool:
        return self.own_spans == 0

    @property
    def allocated_from(self) -> str:
        """Where the allocated time comes from, in words."""
        if self.own_spans == 0:
            return "SLURM accounting"
        if self.own_spans >= self.job_runs:
            return "the attempts' own spans (no SLURM accounting)"
        return "SLURM accounting and the attempts' own spans"

    @property
    def accounted_s(self) -> float:
        return sum(self.spent_s.values())

    @property
    def unaccounted_s(self) -> float:
        """Allocated time no category holds. The split never counts more than the allocation (split), so a
        negative difference is floating-point dust, shown as 0."""
        return max(0.0, self.allocated_s - self.accounted_s)

    @property
    def goodput(self) -> float | None:
        return self.spent_s.get("committed", 0.0) / self.allocated_s if self.allocated_s > 0 else None

    def plus(self, other: Ledger) -> Ledger:
        """Two ledgers together (a sweep's total); mixed units are counted as "device"."""
        return Ledger(
            self.unit if self.unit == other.unit else "device",
            self.allocated_s + other.allocated_s,
            {c: self.spent_s.get(c, 0.0) + other.spent_s.get(c, 0.0) for c in CATEGORIES},
            self.queue_wait_s + other.queue_wait_s,
            self.requeue_hold_s + other.requeue_hold_s,
            self.job_runs + other.job_runs,
            self.own_spans + other.own_spans,
            self.outside_s + other.outside_s,
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "allocated_s": round(self.allocated_s, 1),
            "spent_s": {c: round(self.spent_s.get(c, 0.0), 1) for c in CATEGORIES},
            "unaccounted_s": round(self.unaccounted_s, 1),
            "outside_s": round(self.outside_s, 1),
            "goodput": None if self.goodput is None else round(self.goodput, 4),
            "queue_wait_s": round(self.queue_wait_s, 1),
            "requeue_hold_s": round(self.requeue_hold_s, 1),
            "job_runs": self.job_runs,
            "allocated_from": self.allocated_from,
        }


# ---------------------------------------------------------------- an attempt's marks


def attempt_marks(record: AttemptRecord, events: Sequence[Mapping[str, Any]], running: bool = False) -> AttemptMarks:
    """The marks of one attempt from its record (attempts.jsonl, or attempt_open.json while it runs) and its
    trainer's timeline events."""
    phases = record.phases or {}
    lost = not running and record.end is None  # closed by the next attempt: it died without a record
    began = _first_number(phases.get("prepare"), phases.get("agree_on_resume"), record.start) or 0.0
    marks = [Mark(began, "lost" if lost else "startup")]
    marks += _phase_marks(record, phases)
    after_commit = "uncommitted" if running else "lost"
    marks += training_marks(events, after_commit) or _estimated_training(record, after_commit)
    marks += _tail_marks(record, phases, events)
    ended = record.end if isinstance(record.end, (int, float)) else None
    hosts = len(record.hosts) or 1
    return AttemptMarks(record.attempt, _job(record), began, ended, tuple(marks), hosts, len(record.spares))


def _phase_marks(record: AttemptRecord, phases: Mapping[str, float]) -> list[Mark]:
    marks = []
    if "agree_on_resume" in phases:
        marks.append(Mark(phases["agree_on_resume"], "restore"))
    if "train" in phases:
        marks.append(Mark(phases["train"], "load"))
    elif not phases and isinstance(record.start, (int, float)) and record.end is not None:
        marks.append(Mark(record.start, "load"))  # a record from before phases were recorded: trainer start
    return marks


def training_marks(events: Sequence[Mapping[str, Any]], after_commit: str = "lost") -> list[Mark]:
    """Marks of the trainer's timeline: training up to the attempt's last committed save is committed (a
    checkpoint holds every step before it), training after it is ``after_commit``; saves are saves."""
    begin = next((e["t"] for e in events if e.get("event") == TRAIN_BEGIN), None)
    if begin is None:
        return []
    saves = [e for e in events if e.get("event") == SAVE]
    committed = {e.get("step") for e in events if e.get("event") == COMMITTED}
    last = max((i for i, s in enumerate(saves) if s.get("step") in committed), default=-1)
    marks = [Mark(begin, "committed" if last >= 0 else after_commit)]
    for i, save in enumerate(saves):
        marks.append(Mark(float(save.get("started", save["t"])), "save"))
        marks.append(Mark(save["t"], "committed" if i < last else after_commit))
    end = next((e for e in events if e.get("event") == TRAIN_END), None)
    if end is not None:
        marks.append(Mark(float(end.get("started", end["t"])), "save"))  # waiting for the commit in flight
    return marks


def _estimated_training(record: AttemptRecord, after_commit: str) -> list[Mark]:
    """Without a trainer timeline (records written before it existed): training from the first logged step,
    split into committed and lost by the share of steps committed, at the attempt's average pace."""
    first = record.first_step_at
    end = _first_number((record.phases or {}).get("conclude"), record.end)
    resumed, last = record.resume_step or 0, record.last_step or 0
    committed = record.committed_step or 0
    if not isinstance(first, (int, float)) or end is None or last <= resumed:
        return []
    share = max(0.0, min(1.0, (committed - resumed) / (last - resumed)))
    return [Mark(first, "committed"), Mark(first + share * (end - first), after_commit)]


def _tail_marks(record: AttemptRecord, phases: Mapping[str, float], events: Sequence[Mapping[str, Any]]) -> list[Mark]:
    """From the trainer's last commit (or its exit) to the record and beyond: restart, or finish."""
    if record.decision is None:
        return []  # running, or lost: what follows is not known
    tail = "finish" if record.decision in FINAL_DECISIONS else "restart"
    end = next((e["t"] for e in events if e.get("event") == TRAIN_END), None)
    broken = _last_progress(record, events) if end is None else None
    stopped = _first_number(phases.get("signalled"), phases.get("skip"))
    exited = _first_number(phases.get("conclude"), record.end)
    return [Mark(at, tail) for at in (end, broken, stopped, exited) if at is not None]


def _last_progress(record: AttemptRecord, events: Sequence[Mapping[str, Any]]) -> float | None:
    """The last sign of training in an attempt whose loop never ended (a worker crashed, a rank hung, the
    trainer was killed): the newest logged step node 0 saw (`last_step_at`), save, or the loop's begin. What
    follows is the failure being noticed and the trainer torn down: the restart's, not lost training. Steps
    after the last logged one count to the restart too (ms-swift logs every `logging_steps`)."""
    if not any(e.get("event") == TRAIN_BEGIN for e in events):
        return None  # the trainer never trained (or kept no timeline): nothing to tell apart
    seen = [record.last_step_at, *(e["t"] for e in events if e.get("event") in (TRAIN_BEGIN, SAVE))]
    return max(float(v) for v in seen if isinstance(v, (int, float)))


def _first_number(*values: Any) -> float | None:
    return next((float(v) for v in values if isinstance(v, (int, float))), None)


def _job(record: AttemptRecord) -> str | None:
    job = record.job_id
    return None if job is None else str(job)


# ---------------------------------------------------------------- the ledger


def compute(
    allocations: Sequence[Allocation],
    attempts: Sequence[AttemptMarks],
    devices_per_node: int,
    unit: str,
    now: float,
) -> Ledger:
    """Split every allocation's device-seconds by the marks of the attempts that ran in it. An attempt that
    no allocation holds (SLURM could not say, a local run) gets an allocation of its own span."""
    held: dict[int, list[AttemptMarks]] = {i: [] for i in range(len(allocations))}
    own: list[Allocation] = []
    for attempt in attempts:
        index = _holder(allocations, attempt, now)
        if index is None:
            own.append(_own_allocation(attempt, devices_per_node, now))
            held[len(allocations) + len(own) - 1] = [attempt]
        else:
            held[index].append(attempt)
    every = [*allocations, *own]
    spent = dict.fromkeys(CATEGORIES, 0.0)
    allocated = outside = 0.0
    for group in _job_runs(every):
        ran = [attempt for i in group for attempt in held.get(i, [])]
        marks = _merged_marks(every[group[0]], ran)
        for i in group:
            allocation = every[i]
            end = now if allocation.end is None else allocation.end
            spare_width = _spare_width(allocation, ran, devices_per_node, now)
            trained_width = allocation.width - spare_width  # the marks tell what the training nodes' time went to
            allocated += max(0.0, end - allocation.start) * allocation.width
            spent["spares"] += max(0.0, end - allocation.start) * spare_width
            for category, seconds in split(marks, allocation.start, end).items():
                spent[category] += seconds * trained_width
        first, last = every[group[0]], every[group[-1]]
        early, late = _outside(marks, first.start, now if last.end is None else last.end)
        outside += early * first.width + late * last.width
    queue, hold = _waits(allocations)
    return Ledger(unit, allocated, spent, queue, hold, len(every), len(own), outside)


def _job_runs(allocations: Sequence[Allocation]) -> list[list[int]]:
    """The allocations' indices by job run: a resized row together with the rows that continue it (one job
    run whose marks go on across the resize), every other row on its own."""
    order = sorted(
        range(len(allocations)), key=lambda i: (allocations[i].raw_id or allocations[i].job_id, allocations[i].start)
    )
    groups: list[list[int]] = []
    for i in order:
        before = allocations[groups[-1][-1]] if groups else None
        continues = (
            before is not None
            and before.resized
            and (before.raw_id or before.job_id) == (allocations[i].raw_id or allocations[i].job_id)
        )
        if continues:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _spare_width(allocation: Allocation, attempts: Sequence[AttemptMarks], devices_per_node: int, now: float) -> int:
    """The devices of this allocation that stood by as spares (`resilience.spare_nodes`): beyond the training nodes
    of the attempts with spares that ran in it (0 without spares; 0 on the nodes SLURM left after a resize)."""
    end = now if allocation.end is None else allocation.end
    ran = [a for a in attempts if a.spares and a.began < end and (a.ended is None or a.ended > allocation.start)]
    beyond = (min(a.spares * devices_per_node, max(0, allocation.width - a.hosts * devices_per_node)) for a in ran)
    return max(beyond, default=0)


def _merged_marks(allocation: Allocation, attempts: Iterable[AttemptMarks]) -> list[Mark]:
    """The allocation's marks in time order: its Start opens start-up, then every attempt's own."""
    marks = [Mark(allocation.start, "startup")]
    for n, attempt in enumerate(sorted(attempts, key=lambda a: a.began)):
        # A later attempt in the same allocation (a restart in place, a local retry) prepares as part of
        # the restart, not as the job's start-up.
        marks += [Mark(m.at, "restart") if n and m.category == "startup" else m for m in attempt.marks]
    return sorted(marks, key=lambda m: m.at)


def split(marks: Sequence[Mark], start: float, end: float) -> dict[str, float]:
    """Wall seconds per category between ``start`` and ``end``: each mark's category holds until the next mark
    (the last one until ``end``), counted only inside start..end, so the categories sum to end - start: each
    second in one category. What the marks say of the time outside (records past SLURM's whole-second End, a
    node clock ahead of slurmctld's) is in none: _outside measures it."""
    seconds: dict[str, float] = {}
    for mark, following in zip(marks, [*marks[1:], Mark(max(end, marks[-1].at), "")], strict=True):
        inside = max(0.0, min(following.at, end) - max(mark.at, start))
        seconds[mark.category] = seconds.get(mark.category, 0.0) + inside
    return seconds


def _outside(marks: Sequence[Mark], start: float, end: float) -> tuple[float, float]:
    """How far the marks reach outside start..end (wall seconds): before Start, and past End."""
    return max(0.0, start - marks[0].at), max(0.0, marks[-1].at - end)


def _holder(allocations: Sequence[Allocation], attempt: AttemptMarks, now: float) -> int | None:
    for i, allocation in enumerate(allocations):
        end = now if allocation.end is None else allocation.end
        same_job = attempt.job_id is None or allocation.carries(attempt.job_id)
        if same_job and allocation.start - SLACK_S <= attempt.began <= end + SLACK_S:
            return i
    return None


def _own_allocation(attempt: AttemptMarks, devices_per_node: int, now: float) -> Allocation:
    end = attempt.ended if attempt.ended is not None else max([now, *(m.at for m in attempt.marks)])
    width = attempt.hosts * devices_per_node
    return Allocation(attempt.job_id or attempt.attempt, attempt.began, end, width, None, from_slurm=False)


def _waits(allocations: Sequence[Allocation]) -> tuple[float, float]:
    """Queue wait (Submit -> Start of each job run) and requeue hold (a job run's End -> the next run's Submit)."""
    queue = sum(max(0.0, a.start - a.submit) for a in allocations if a.submit is not None)
    hold = 0.0
    ordered = sorted(allocations, key=lambda a: (a.job_id, a.start))
    for before, after in itertools.pairwise(ordered):
        if before.job_id == after.job_id and before.end is not None and after.submit is not None:
            hold += max(0.0, after.submit - before.end)
    return queue, hold
