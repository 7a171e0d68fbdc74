"""When the wrapper kills a trainer still running after a stop signal (pure: no clock, no SLURM, no files).

SLURM kills the job at its end time as things stand: the end of the time limit, or, once it preempts the job,
the end of the partition's GraceTime (SLURM moves EndTime there when it signals). The save may use all of it
but a margin: node 0 still has to classify the attempt, record it and requeue before that kill. When the end
time is not SLURM's answer to this signal (a USR2 sent by hand long before the time limit, a cancel, which
SLURM ends after KillWait, or no end time known), the save has `signal_lead_s`, as the user sized it, and never
goes past the end time less the margin either.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

KILL_MARGIN_S = 30.0  # what node 0 keeps for itself before SLURM's kill: conclude, record, requeue
SIGNAL_EARLY_S = 60  # SLURM sends --signal=USR2@N up to 60 s earlier than N (sbatch(1))

SLURM_END = "slurm_end_time"  # SLURM's kill time less the margin
LEAD = "signal_lead_s"  # the first signal plus signal_lead_s


@dataclass(frozen=True)
class EndTimes:
    """What is known of SLURM's end of this job when a stop signal comes, in seconds since the epoch."""

    kill_at: float | None  # when SLURM kills it as things stand (EndTime; None: no end, or not known)
    limit_ends: float | None  # when its time limit ends (StartTime + TimeLimit; a preemption does not move it)
    source: str | None  # where they come from: "scontrol", "SLURM_JOB_END_TIME"; None: nowhere


@dataclass(frozen=True)
class SaveDeadline:
    """When a trainer still running after a stop signal is killed, and why then."""

    at: float
    basis: str  # SLURM_END or LEAD
    kill_at: float | None = None  # SLURM's kill time it was measured against
    source: str | None = None  # where that kill time came from (EndTimes.source)

    def as_dict(self) -> dict[str, Any]:
        return {name: round(value, 3) if isinstance(value, float) else value for name, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SaveDeadline | None:
        """A deadline node 0 published (None: not one)."""
        at, basis = data.get("at"), data.get("basis")
        if not isinstance(at, (int, float)) or basis not in (SLURM_END, LEAD):
            return None
        return cls(float(at), str(basis), data.get("kill_at"), data.get("source"))


def save_deadline(signalled_at: float, lead_s: float, ends: EndTimes) -> SaveDeadline:
    """The deadline for a save asked for at ``signalled_at``: SLURM's kill time less KILL_MARGIN_S (or less half
    of what is left, when that is less than twice the margin) when SLURM ends the job because of this signal;
    else ``signalled_at + lead_s``, never later than the kill time less the margin."""
    kill_at = ends.kill_at
    if kill_at is None or kill_at <= signalled_at:  # no end; or a cancelled job, whose EndTime is its cancel
        return SaveDeadline(signalled_at + lead_s, LEAD, kill_at, ends.source)
    if _slurm_ends_it(signalled_at, lead_s, kill_at, ends.limit_ends):
        margin = min(KILL_MARGIN_S, (kill_at - signalled_at) / 2)
        return SaveDeadline(kill_at - margin, SLURM_END, kill_at, ends.source)
    return SaveDeadline(min(signalled_at + lead_s, kill_at - KILL_MARGIN_S), LEAD, kill_at, ends.source)


def _slurm_ends_it(signalled_at: float, lead_s: float, kill_at: float, limit_ends: float | None) -> bool:
    """Whether SLURM kills the job soon after this signal: a preemption moved its end before the time limit's,
    or the signal is the time limit's warning (within lead_s plus SLURM's earliness of the end)."""
    preempted = limit_ends is not None and kill_at < limit_ends
    return preempted or kill_at - signalled_at <= lead_s + SIGNAL_EARLY_S


def earliest(current: SaveDeadline | None, new: SaveDeadline) -> SaveDeadline:
    """A later signal (a preemption after a USR2 by hand) can only bring the deadline forward."""
    return new if current is None or new.at < current.at else current
