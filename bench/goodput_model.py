"""A small model of the goodput ledger's committed-training share under faults on a schedule (issue 29, part 4).

Pure arithmetic, no I/O. An allocation of ``horizon_s`` seconds sees a preemption every ``preempt_every_s`` and
a worker crash every ``crash_every_s``; between faults the run trains and saves a checkpoint after every
``save_every_s`` of training. What each event costs comes from measurements (`bench/goodput_faults.py`
measures them on the local cluster from the ledger of real runs):

    preemption, warned (signal_lead_s > the stop save): the stop save, the requeue, SLURM's start of the
        next job run, the restore and the load; no training is lost (the stop save commits the step).
    preemption, warning too short: the save is killed at the lead's end, so the training since the last
        commit is lost (half a save interval on average) and the lead itself; then as above.
    crash: the training since the last commit (half a save interval on average), noticing the crash, then
        either a restart in place (the restart delay, restore, load: no new job run) or a requeue (as a
        preemption's requeue, start-up, restore, load).

What is left of the horizon is training and periodic saves in the ratio save_every_s : save_s. The share is
committed training ÷ allocation, as the ledger's `goodput`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Costs:
    """Seconds per event, as measured (per node: the ledger's device-seconds ÷ the devices)."""

    startup_s: float  # SLURM's Start of a job run -> the wrapper chooses the resume point (a requeue's)
    restore_s: float  # choosing the resume point (each attempt)
    load_s: float  # the trainer's start -> its training loop (each attempt)
    requeue_s: float  # a preempted or requeued attempt's last commit -> SLURM's End of its job run
    crash_restart_s: float  # a crashed attempt's last sign of training -> its next attempt prepares, in place
    stop_save_s: float  # a warned preemption: the stop save (the step in progress, write, commit)
    save_s: float  # one periodic save (every rank has written it)
    first_start_s: float = 0.0  # the run's first start-up, restore and load (once; 0 for a long run's rate)
    finish_s: float = 0.0  # after the run's last commit (once; 0 for a long run's rate)

    @property
    def relaunch_s(self) -> float:
        """A new job run: SLURM's start-up, the restore and the load."""
        return self.startup_s + self.restore_s + self.load_s


@dataclass(frozen=True)
class Settings:
    """What the user chooses, and the fault schedule."""

    save_every_s: float  # training seconds between periodic saves (save_steps × step time)
    preempt_every_s: float
    crash_every_s: float
    restart_in_place: bool = True  # resilience.max_restarts > 0
    warned: bool = True  # cluster.signal_lead_s leaves the stop save its time
    lead_s: float = 0.0  # what a too-short warning wastes before the kill (only when not warned)


@dataclass(frozen=True)
class Projection:
    """Seconds of the horizon per category, and the committed share."""

    horizon_s: float
    spent_s: dict[str, float]

    @property
    def share(self) -> float:
        return self.spent_s["committed"] / self.horizon_s


def preemption_cost(costs: Costs, settings: Settings) -> dict[str, float]:
    """Seconds one preemption costs, by the ledger's categories."""
    if settings.warned:
        return {"save": costs.stop_save_s, "restart": costs.requeue_s, **_relaunch(costs)}
    lost = settings.save_every_s / 2 + settings.lead_s
    return {"lost": lost, "restart": costs.requeue_s, **_relaunch(costs)}


def crash_cost(costs: Costs, settings: Settings) -> dict[str, float]:
    """Seconds one crash costs, by the ledger's categories."""
    lost = {"lost": settings.save_every_s / 2}
    if settings.restart_in_place:
        return {**lost, "restart": costs.crash_restart_s, "restore": costs.restore_s, "load": costs.load_s}
    return {**lost, "restart": costs.crash_restart_s + costs.requeue_s, **_relaunch(costs)}


def _relaunch(costs: Costs) -> dict[str, float]:
    return {"startup": costs.startup_s, "restore": costs.restore_s, "load": costs.load_s}


def project(
    costs: Costs, settings: Settings, horizon_s: float, preemptions: float | None = None, crashes: float | None = None
) -> Projection:
    """The horizon's seconds by category. ``preemptions`` and ``crashes`` default to the schedule's expected
    counts (horizon ÷ interval); a measured run passes the counts it saw."""
    n_preempt = horizon_s / settings.preempt_every_s if preemptions is None else preemptions
    n_crash = horizon_s / settings.crash_every_s if crashes is None else crashes
    spent = dict.fromkeys(("startup", "restore", "load", "committed", "lost", "save", "restart", "finish"), 0.0)
    _add(spent, _relaunch(replace(costs, startup_s=costs.first_start_s, restore_s=0.0, load_s=0.0)))
    spent["finish"] += costs.finish_s
    for count, cost in ((n_preempt, preemption_cost(costs, settings)), (n_crash, crash_cost(costs, settings))):
        _add(spent, {category: count * seconds for category, seconds in cost.items()})
    left = max(0.0, horizon_s - sum(spent.values()))
    # What is left trains and saves in turn; the lost training above is training too, whose saves it paid.
    trained = left * settings.save_every_s / (settings.save_every_s + costs.save_s)
    spent["committed"] += trained
    spent["save"] += left - trained
    return Projection(horizon_s, spent)


def _add(spent: dict[str, float], more: dict[str, float]) -> None:
    for category, seconds in more.items():
        spent[category] += seconds


def best_save_every(costs: Costs, settings: Settings, horizon_s: float, candidates: list[float]) -> float:
    """The save interval among ``candidates`` with the highest share."""
    return max(candidates, key=lambda every: project(costs, replace(settings, save_every_s=every), horizon_s).share)


def relaunch_budget(costs: Costs, settings: Settings, horizon_s: float, target: float) -> float:
    """The start-up + load per relaunch (split as measured) at which the share reaches ``target``: the share
    falls linearly as they grow, so two projections give the line. Negative: unreachable even with none."""
    base = costs.startup_s + costs.load_s
    startup_part = costs.startup_s / base if base else 1.0

    def share_at(total: float) -> float:
        scaled = replace(costs, startup_s=total * startup_part, load_s=total * (1 - startup_part))
        return project(scaled, settings, horizon_s).share

    at_zero, at_one = share_at(0.0), share_at(1.0)
    if at_zero == at_one:
        return float("inf") if at_zero >= target else -1.0
    return (at_zero - target) / (at_zero - at_one)
