"""One node's attempt as an explicit state machine; each phase is a small function that returns the next.

    PREPARE          allocation check (a refusal is recorded: conclude.record_refusal), tiny assets; leader:
                     take the run dir's lease (or stop: another job leads the run), close a lost attempt;
                     preflight (first attempt)
    AGREE_ON_RESUME  leader: restore, choose and publish the resume point; the others wait for it
    TRAIN | SKIP     run and watch the trainer (the leader ends it if another job takes the lease, and
                     then records nothing: DONE); SKIP when the resume point is the run's last step
    | SIGNALLED      (every node then writes its result); SIGNALLED when a stop signal came before the
                     resume point was published: no trainer starts, the leader tells the nodes still
                     waiting and concludes (preempted, timed out: requeue)
    | UNRESTORED     the object store could not be read and the local checkpoints are behind it: no trainer
                     starts; the leader concludes (infra: requeue with back-off)
    | STANDBY        a spare (`resilience.spare_nodes`: not on the attempt's roster): no trainer; it beats and
                     waits for the attempt's outcome and joins the next attempt when it is on its roster, stands by
                     again when it is still a spare, else DONE
    CONCLUDE         leader: classify, history, decide, attempts.jsonl and status.json; publish the outcome
    | AWAIT_OUTCOME  the others: wait for it (outcome.py); restart: the next attempt, else DONE
    FINISH_UPLOADS   leader with object storage: wait (bounded) for this attempt's uploads
    ACT              done or stop: return; requeue: the same SLURM job (a failed requeue is recorded: stop),
                     or (no SLURM) retry here; restart: the next attempt inside this allocation, on every
                     node (AGREE_ON_RESUME)
    DONE

The leader records the phase it enters in status.json ("phase"); a leader without the lease records nothing.
Observers named in SWIFTSLURM_PHASE_OBSERVERS (observers.py) are told of each phase as it is entered.
The wrapper records stop signals for its whole life (supervise.py installs one SignalLog before the first
phase); the phases consult it, and the leader alone decides what a signal means (conclude.py) and requeues
(requeue.py).
Other nodes always end with exit code 0: with `srun --kill-on-bad-exit` a failing follower would kill the
leader before it has decided.

The roster: the hosts an attempt trains on, in node-rank order. Without spares it is the whole allocation in
SLURM's order; with spares, the first attempt's is the first `cluster.nodes` hosts (SLURM's node 0 leads and
always trains) and a restart onto a spare names the next one (decide.swap_in_spares, outcome.py). Each node
sees its attempt through the roster (`Attempt.where`: node id = its rank there), the allocation as SLURM gave
it (`Attempt.allocation`) only to check it, for preflight and to find itself on the next roster.
"""

from __future__ import annotations

import enum
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from pathlib import Path

from swiftslurm.ckpt.checkpoint import ResumePoint, checkpoint_step, newest_committed
from swiftslurm.errors import NodeError, SlurmError, StorageError
from swiftslurm.node import decide, observers, outcome
from swiftslurm.node.conclude import (
    close_lost_attempt,
    conclude,
    job_times,
    record_refusal,
    record_requeue_failure,
    record_uploads,
    record_wrapper_failure,
    stop_after_preflight,
)
from swiftslurm.node.deadline import KILL_MARGIN_S
from swiftslurm.node.heartbeat import LeaderBeat
from swiftslurm.node.requeue import requeue
from swiftslurm.node.resume import Interrupted, Unrestored, agree_on_resume, publish_failure, publish_signalled
from swiftslurm.node.watch import Observed, node_log_path, nothing_to_train, train
from swiftslurm.plan import JobPlan
from swiftslurm.preflight import checks as preflight_checks
from swiftslurm.preflight import gather as preflight
from swiftslurm.rundir import lease, records
from swiftslurm.rundir.layout import (
    LEADER_BEAT,
    attempt_dir,
    node_log,
    node_result,
    nodes_with_results,
    resume_file,
)
from swiftslurm.signals import SignalLog
from swiftslurm.slurm_env import AttemptShape, SlurmEnv, check_allocation, first_roster, on_roster, own_host
from swiftslurm.storage.store import CheckpointStore
from swiftslurm.storage.sync import NodeSync, last_synced_step
from swiftslurm.tiny import build_tiny_assets


class Phase(enum.Enum):
    PREPARE = "prepare"
    AGREE_ON_RESUME = "agree_on_resume"
    TRAIN = "train"
    SKIP = "skip"
    SIGNALLED = "signalled"
    UNRESTORED = "unrestored"
    STANDBY = "standby"
    CONCLUDE = "conclude"
    AWAIT_OUTCOME = "await_outcome"
    FINISH_UPLOADS = "finish_uploads"
    ACT = "act"
    DONE = "done"


@dataclass(frozen=True)
class NodeResult:
    node_rank: int
    hostname: str
    exit_code: int
    log_path: str
    resumed_from: str | None
    decision: str | None = None  # leader only: done | requeue | stop
    why: str = ""


def attempt_id(where: SlurmEnv, restart: int = 0, retry: int = 0) -> str:
    """'<job id>' for a first attempt, '<job id>.r<N>' after the N-th requeue, 'local-<pid>' outside SLURM;
    then '.i<K>' for the K-th restart in place inside the allocation and '.retry<R>' for the R-th retry
    outside SLURM. The one place attempt ids are made: every node computes the same one."""
    base = str(where.job_id) if where.in_slurm else f"local-{where.job_id or os.getpid()}"
    requeued = f".r{where.restart_count}" if where.restart_count else ""
    return base + requeued + (f".i{restart}" if restart else "") + (f".retry{retry}" if retry else "")


@dataclass
class Attempt:
    """What this node knows about its attempt so far; each phase fills in its part."""

    run_dir: Path
    plan: JobPlan
    where: SlurmEnv  # this node on the attempt's roster (before PREPARE ends, and without spares: the allocation)
    id: str
    signals: SignalLog
    phase: Phase = Phase.PREPARE
    allocation: SlurmEnv | None = None  # this node as SLURM placed it (None: `where` until PREPARE has ended)
    spares: tuple[str, ...] = ()  # the hosts standing by during this attempt (resilience.spare_nodes)
    started: float = 0.0  # when this attempt began on this node
    retry: int = 0  # attempts retried in this process (no SLURM to requeue with)
    restarts: int = 0  # restarts in place inside this allocation (this process)
    resume: ResumePoint | None = None
    sync: NodeSync | None = None
    observed: Observed | None = None
    decision: decide.Decision | None = None
    result: NodeResult | None = None
    lease: lease.Lease | None = None  # leader: its lease on the run dir, checked before destructive steps
    entered: dict[str, float] = field(default_factory=dict)  # phase -> when this attempt entered it (the ledger)
    nonce: str | None = None  # this run of the SLURM job (lease.nonce), in resume.json
    recorded: bool = False  # the attempt's end is in the records already (a refusal, a failed conclude)

    @cached_property
    def shape(self) -> AttemptShape:
        """This attempt's size: the same for every attempt of this allocation (its nodes do not change)."""
        return AttemptShape.of(self.where, self.plan)

    @property
    def leader(self) -> bool:
        return self.where.node_id == 0

    def stopped(self) -> bool:
        """Whether a stop signal has come that this attempt has not acted on yet."""
        return bool(self.signals.received)

    @property
    def spare(self) -> bool:
        """Whether this node stands by in this attempt (it is not on the roster)."""
        return self.phase is Phase.STANDBY

    def entering(self) -> observers.PhaseEntered:
        """What the phase observers are told as this attempt enters its phase."""
        return observers.PhaseEntered(self.phase.value, self.id, self.where, self.stopped)


def run(run_dir: Path, plan: JobPlan, where: SlurmEnv, signals: SignalLog | None = None) -> NodeResult:
    """Step through the phases until the run is done, stopped, or requeued. ``signals``: the wrapper's, already
    installed (supervise.py); without it, one is installed for this call."""
    if signals is None:
        with SignalLog().installed() as installed:
            return run(run_dir, plan, where, installed)
    attempt = Attempt(run_dir, plan, where, attempt_id(where), signals, started=time.time(), nonce=lease.nonce(where))
    attempt.entered[Phase.PREPARE.value] = attempt.started
    watching = observers.load()  # SWIFTSLURM_PHASE_OBSERVERS (observers.py); none unless it is set
    try:
        while attempt.phase is not Phase.DONE:
            observers.notify(watching, attempt.entering())
            attempt.phase = PHASES[attempt.phase](attempt)
            attempt.entered.setdefault(attempt.phase.value, time.time())
            _record_phase(attempt)
    except Exception as err:  # the run dir must say how the run ended, whoever reads it (status, wait=true)
        _record_failure(attempt, err)
        raise
    assert attempt.result is not None  # every way to DONE sets it
    return attempt.result


def _record_failure(a: Attempt, error: Exception) -> None:
    """A phase raised (a bug, a filesystem error, an observer): node 0 records the attempt and the run as failed
    with the error, unless the phase recorded its end itself (a refusal, CONCLUDE), a lease lost means another
    job leads, or it never held the lease and another job leads."""
    if not a.leader:
        _record_peer_failure(a, error)
        return
    if a.spares:  # the spares wait for this attempt's outcome: it ends them
        _publish_end(a)
    if a.recorded or isinstance(error, lease.LeaseLost):
        return
    if a.lease is None and lease.led_elsewhere(a.run_dir, a.where) is not None:
        return
    record_wrapper_failure(a.run_dir, a.where, a.id, error, during=f"in phase {a.phase.value} of")


def _publish_end(a: Attempt) -> None:
    """Best effort: the word that ends the nodes waiting for this attempt's outcome."""
    try:
        outcome.publish(attempt_dir(a.run_dir, a.id), outcome.Outcome(outcome.END), a.nonce)
    except OSError as err:
        print(f"[swiftslurm] could not publish the end of attempt {a.id}: {err}", flush=True)


def _record_peer_failure(a: Attempt, error: Exception) -> None:
    """Another node's wrapper raised: srun will end the step, node 0 with it, often before node 0 records anything;
    this node's own record is then the run's word on how it ended (ops/runs.py reads it). Best effort."""
    try:
        here = attempt_dir(a.run_dir, a.id)
        records.write_wrapper_failure(here, a.where.node_id, socket.gethostname(), a.phase.value, error)
    except OSError as err:
        print(f"[swiftslurm] could not record the failure either: {err}", flush=True)


def _record_phase(a: Attempt) -> None:
    """status.json says which phase the leader's attempt has reached, so a reader sees where it is (the
    leader alone writes status.json; PREPARE is not recorded, it ends by writing the status afresh), and which
    hosts stand by as spares meanwhile (`status` reads their heartbeats)."""
    if a.leader and a.lease is not None:
        a.lease.check(f"record phase {a.phase.value}")  # also the heartbeat
        spares = {"spares": list(a.spares)} if a.spares else {}
        records.update_status(a.run_dir, phase=a.phase.value, **spares)


def _prepare(a: Attempt) -> Phase:
    try:
        check_allocation(a.where, a.plan)
    except NodeError as err:  # the job's log may be anywhere (sbatch by hand): the run dir must say why
        a.recorded = record_refusal(a.run_dir, a.where, a.id, str(err))
        raise
    if a.plan.tiny_cache:  # built on the login side already; this only checks (or builds if submitted by hand)
        build_tiny_assets(Path(a.plan.tiny_cache))
    if a.leader:
        try:
            why = _lead(a)
        except NodeError as err:  # the run dir cannot fence a leader (no hard links): it must say why
            a.recorded = record_refusal(a.run_dir, a.where, a.id, str(err))
            publish_failure(resume_file(a.run_dir, a.id), str(err), a.nonce)
            raise
        if why is not None:
            return _stopped(a, why)
    if a.leader and (why := close_lost_attempt(a.run_dir, a.plan, a.where, a.id, a.lease)) is not None:
        return _stopped(a, why)
    if a.leader and (why := _store_unreachable(a)) is not None:
        record_refusal(a.run_dir, a.where, a.id, why)
        publish_failure(resume_file(a.run_dir, a.id), why, a.nonce)
        return _stopped(a, why)
    # Once per job, not after a requeue: every node must take the same branch, and SLURM's restart count is
    # the one fact they all share before the run dir is known to be shared.
    if a.plan.preflight.enabled and a.where.restart_count == 0:
        failure = _preflight(a.run_dir, a.where, a.id)
        if failure is not None and a.leader:
            return _stopped(a, stop_after_preflight(a.run_dir, a.where, a.id, failure, a.nonce))
    if not _take_place(a, first_roster(a.where, a.plan), a.where.hosts[a.plan.topology.nodes :]):
        return _stand_down(a, "stopped before training") if a.stopped() else Phase.STANDBY
    return Phase.SIGNALLED if a.stopped() else Phase.AGREE_ON_RESUME


def _take_place(a: Attempt, roster: tuple[str, ...], spares: tuple[str, ...]) -> bool:
    """This node's place in an attempt on ``roster`` (with ``spares`` standing by): whether it trains there."""
    if a.allocation is None:
        a.allocation = a.where
    a.spares = spares if a.allocation.in_slurm else ()
    placed = on_roster(a.allocation, roster) if a.allocation.in_slurm else a.allocation
    if placed is not None:
        a.where = placed
    return placed is not None


def _stand_by(a: Attempt) -> Phase:
    """A spare: no trainer, no GPU memory; it waits (polling slowly) for node 0's word on the attempt."""
    host = own_host(a.allocation or a.where)
    print(f"[swiftslurm] attempt {a.id}: {host} stands by as a spare", flush=True)
    said = outcome.wait_as_spare(attempt_dir(a.run_dir, a.id), a.nonce, a.stopped, host)
    return _follow(a, said)


def _follow(a: Attempt, said: outcome.Outcome) -> Phase:
    """Node 0's word on the attempt, for a node other than node 0: restart (on this roster, or stand by
    again), or end."""
    if said.action != decide.Action.RESTART.value or said.next_attempt is None:
        return _stand_down(a, "node 0 ended the attempt without a restart") if a.spare else Phase.DONE
    if said.roster and not _take_place(a, said.roster, said.spares):
        # A lost host, or a straggler swapped out: it never trains again in this allocation, nor stands by (called
        # in for a lost node, a straggler would bring its slowness back); SLURM keeps the node until the job ends.
        if a.allocation is None or own_host(a.allocation) not in said.spares:
            return _stand_down(a, "taken off the roster by node 0")
        _next_attempt(a, said.next_attempt)
        return Phase.STANDBY
    return _next_attempt(a, said.next_attempt)


def _stand_down(a: Attempt, why: str) -> Phase:
    """A node that trains no more in this allocation (a spare at the run's end, a node taken off) ends, with 0."""
    where = a.allocation or a.where
    print(f"[swiftslurm] attempt {a.id}: {own_host(where) if where.in_slurm else 'this node'} ends: {why}", flush=True)
    a.result = a.result or NodeResult(where.node_id, socket.gethostname(), 0, "", None, why=why)
    return Phase.DONE


def _lead(a: Attempt) -> str | None:
    """Take the run dir's lease, or say why this leader stops: another job leads the run. Then nothing of
    the run is touched; only this attempt's own resume.json, so its other nodes stop waiting."""
    taken = lease.acquire(a.run_dir, a.where, a.id)
    if isinstance(taken, lease.Lease):
        a.lease = taken
        return None
    print(f"[swiftslurm] {taken}", flush=True)
    publish_failure(resume_file(a.run_dir, a.id), taken, a.nonce)
    return taken


def _store_unreachable(a: Attempt) -> str | None:
    """At the run's first attempt (nothing recorded, committed or uploaded yet), why node 0 cannot use the object
    store the login side reached when the run was submitted (None: it can, no storage, not the first attempt).
    An endpoint only the login node reaches (127.0.0.1, a name only it resolves) would otherwise train with every
    upload failing; later, the store being down is an outage (restore: requeue with back-off), not the input."""
    if a.plan.storage is None or a.where.restart_count or records.read_attempts(a.run_dir):
        return None
    if last_synced_step(a.run_dir) or newest_committed(a.plan.output_dir)[0] is not None:
        return None  # the run dir has trained or uploaded before: an unreachable store is an outage now
    try:
        CheckpointStore.quick(a.plan.storage).check_access()
    except StorageError as err:
        host = socket.gethostname()
        return (
            f"node 0 ({host}) cannot reach the object store {a.plan.storage.url} that the login node reached "
            f"when the run was submitted: {str(err).splitlines()[0]}; the run stops before training. HINT: set "
            "storage.endpoint_url to an address every node reaches (not 127.0.0.1 or localhost: that is each "
            "node's own loopback), see docs/storage.md, then rerun the same command"
        )
    return None


def _preflight(run_dir: Path, where: SlurmEnv, attempt: str) -> str | None:
    """Run the checks on every node; node 0 gets the first failure of the whole allocation (None: passed)."""
    result = preflight.run(preflight.context(run_dir, where, attempt, None, None))
    print(preflight.show(result), flush=True)  # the table goes to the wrapper's output; the verdict to the node log
    if not isinstance(result, preflight_checks.Report):
        return None
    records.note_in_log(node_log(attempt_dir(run_dir, attempt), where.node_id), preflight_checks.verdict(result))
    return result.first_failure()


def _stopped(a: Attempt, why: str) -> Phase:
    """The leader stops the run before training (no requeue)."""
    a.result = NodeResult(0, socket.gethostname(), 1, "", None, decide.Action.STOP.value, why)
    return Phase.DONE


def _agree_on_resume(a: Attempt) -> Phase:
    try:
        ranks = a.shape.reshard_ranks  # None unless the run may change size
        a.resume = agree_on_resume(a.plan, attempt_dir(a.run_dir, a.id), a.leader, a.lease, a.nonce, a.stopped, ranks)
    except Interrupted as why:
        print(f"[swiftslurm] attempt {a.id}, node {a.where.node_id}: {why}; no trainer starts", flush=True)
        return Phase.SIGNALLED
    except Unrestored as why:
        print(f"[swiftslurm] attempt {a.id}, node {a.where.node_id}: {why}; no trainer starts", flush=True)
        a.resume = replace(_standing_resume_point(a.plan.output_dir), restore_error=str(why))
        return Phase.UNRESTORED
    # With storage, local retention is NodeSync's (it knows what is uploaded), not the trainer's; a leader
    # that lost the run dir's lease neither uploads retention nor prunes (NodeSync asks `leads`).
    storage = a.plan.storage if a.leader else None
    leads = a.lease.holds if a.lease else None
    a.sync = (
        NodeSync(storage, a.run_dir, a.plan.output_dir, keep_local=a.plan.keep_checkpoints, leads=leads)
        if storage
        else None
    )
    # A run whose newest commit is its last step is complete (killed or signalled after that commit):
    # starting the trainer again would train past the plan.
    return Phase.SKIP if a.resume.complete else Phase.TRAIN


def _train(a: Attempt) -> Phase:
    assert a.resume is not None
    token, lost = (a.lease.token, a.lease.lost) if a.lease else (None, lambda: None)
    peer = _PeerFailed(attempt_dir(a.run_dir, a.id), a.where)
    ends = partial(job_times, a.where)  # node 0 asks when a stop signal comes (the save's deadline)
    room = (len(a.spares), a.plan.resilience.max_restarts - a.restarts)  # a straggler swapped for a spare (swap.py)
    with _beat_for_spares(a):
        a.observed = train(
            a.plan, a.where, a.run_dir, a.id, a.resume, a.sync, a.signals, token, peer.failed, lost, ends, room
        )
    return _trained(a, a.resume, a.observed)


@contextmanager
def _beat_for_spares(a: Attempt) -> Iterator[None]:
    """Node 0 beats through the training while spares stand by: they wait a whole attempt for its word, and its
    silence (not the length of the wait) tells them it is gone (outcome.wait_as_spare)."""
    if not (a.leader and a.spares):
        yield
        return
    with LeaderBeat(attempt_dir(a.run_dir, a.id) / LEADER_BEAT).running() as beat:
        beat.doing("training")
        yield


def _skip(a: Attempt) -> Phase:
    assert a.resume is not None
    a.observed = nothing_to_train()
    return _trained(a, a.resume, a.observed)


def _signalled(a: Attempt) -> Phase:
    """A stop signal came before training: the nodes still waiting for the resume point are told, nobody
    trains, and the leader concludes the attempt from the signal like any other (conclude.py)."""
    if a.leader:
        publish_signalled(resume_file(a.run_dir, a.id), a.nonce)
    a.resume = _standing_resume_point(a.plan.output_dir)
    a.observed = nothing_to_train(a.signals.received, a.started)
    return _trained(a, a.resume, a.observed)


def _unrestored(a: Attempt) -> Phase:
    """The store could not be restored from (resume.Unrestored): nobody trains; the leader concludes it as an
    infrastructure failure (a signal that came meanwhile counts first, as in SIGNALLED)."""
    assert a.resume is not None and a.resume.restore_error is not None
    a.observed = replace(nothing_to_train(a.signals.received, a.started), unrestored=a.resume.restore_error)
    return _trained(a, a.resume, a.observed)


def _standing_resume_point(output_dir: Path) -> ResumePoint:
    """No resume point was agreed: the newest commit stands (nothing set aside), so nothing counts as progress."""
    newest, _ = newest_committed(output_dir)
    return ResumePoint(newest, (checkpoint_step(newest) or 0) if newest else 0)


def _trained(a: Attempt, resume: ResumePoint, observed: Observed) -> Phase:
    """Every node writes its result (the leader learns from them which host went silent); only the leader
    goes on."""
    resumed_from = str(resume.checkpoint) if resume.checkpoint else None
    log = str(node_log_path(a.run_dir, a.id, a.where))
    a.result = NodeResult(a.where.node_id, socket.gethostname(), observed.exit_code, log, resumed_from)
    here = attempt_dir(a.run_dir, a.id)
    records.write_node_result(
        here,
        a.where.node_id,
        a.result.hostname,
        observed.exit_code,
        observed.ended_at,
        observed.ended_by,
        observed.leftovers,
    )
    if not a.leader:
        return Phase.AWAIT_OUTCOME
    if a.lease is not None and (why := a.lease.lost("conclude the attempt")) is not None:
        return _lost_lease(a, why)
    return Phase.CONCLUDE


def _lost_lease(a: Attempt, why: str) -> Phase:
    """Another job took the run dir's lease while this leader trained (its trainer was ended): it uploads
    nothing more and records nothing in the run dir, which is the new leader's now; only its own nodes are
    told, in this attempt's outcome.json, to end."""
    print(f"[swiftslurm] attempt {a.id} ends: {why}", flush=True)
    if a.sync is not None:
        a.sync.stop()
    outcome.publish(attempt_dir(a.run_dir, a.id), outcome.Outcome(outcome.END), a.nonce)
    a.lease = None  # a leader without the lease records nothing (_record_phase)
    assert a.result is not None
    a.result = replace(a.result, decision=decide.Action.STOP.value, why=why)
    return Phase.DONE


def _conclude(a: Attempt) -> Phase:
    assert a.resume is not None and a.observed is not None and a.result is not None
    here = attempt_dir(a.run_dir, a.id)
    with LeaderBeat(here / LEADER_BEAT).running() as beat:  # the others wait for the outcome meanwhile
        beat.doing("concluding the attempt")
        try:
            a.decision = conclude(
                a.plan, a.where, a.run_dir, a.id, a.resume, a.observed, a.restarts, a.entered, a.spares
            )
        except Exception as err:  # the run dir must still say how the attempt ended, and the others end too
            record_wrapper_failure(a.run_dir, a.where, a.id, err)
            a.recorded = True
            outcome.publish(here, outcome.Outcome(outcome.END, None), a.nonce)
            raise
    restart = a.decision.action is decide.Action.RESTART
    next_attempt = attempt_id(a.where, a.restarts + 1, a.retry) if restart else None
    said = outcome.Outcome(
        a.decision.action.value if restart else outcome.END, next_attempt, a.decision.roster, a.decision.spares
    )
    outcome.publish(here, said, a.nonce)
    a.result = replace(a.result, decision=a.decision.action.value, why=a.decision.why)
    return Phase.FINISH_UPLOADS if a.sync is not None else Phase.ACT


def _await_outcome(a: Attempt) -> Phase:
    """A follower whose trainer ended: node 0 says whether every node restarts in place or this node exits.
    A stop signal (preemption, time limit, scancel) reaches every node's task, and a signalled attempt is
    never restarted in place (decide.restart_in_place), so a signalled follower does not wait for the word."""
    if a.stopped():
        return Phase.DONE
    return _follow(a, outcome.wait_for(attempt_dir(a.run_dir, a.id), a.nonce))


def _finish_uploads(a: Attempt) -> Phase:
    """Wait (bounded) for this attempt's uploads and put the outcome into status.json. Before a requeue the
    wait ends ahead of SLURM's end time, or the job would be killed before it is requeued; what is left is
    uploaded by the next attempt. A stop signal during the wait cuts it to what SLURM's end time then allows."""
    assert a.sync is not None and a.decision is not None and a.observed is not None
    budget = a.plan.storage.wait_at_exit_s if a.plan.storage else 0.0
    times = job_times(a.where)[0] if a.decision.action is decide.Action.REQUEUE else None
    if times is not None and times.limit_ends is not None:
        budget = min(budget, times.limit_ends - time.time() - KILL_MARGIN_S)
    a.sync.drain(budget, _DrainCut(a.where, a.signals, len(a.observed.signals)).left_s)
    if a.lease is not None:
        a.lease.check("record the uploads in status.json")
    record_uploads(a.run_dir, a.plan.output_dir, a.decision, a.sync.state())
    return Phase.ACT


def _act(a: Attempt) -> Phase:
    assert a.decision is not None
    if a.decision.action is decide.Action.RESTART:
        return _restart(a)
    if a.decision.action is not decide.Action.REQUEUE:
        return Phase.DONE
    if a.where.in_slurm:
        try:
            requeue(a.where, a.plan, a.decision)
        except SlurmError as err:  # SLURM did not take the job back after its retries: the run stops, recorded
            return _stopped(a, record_requeue_failure(a.run_dir, a.where, a.id, a.decision, err))
    time.sleep(a.decision.delay_s)  # no SLURM to requeue with: the next attempt starts here
    assert a.observed is not None
    a.signals.forget(len(a.observed.signals))  # acted on; one that came since is the next attempt's
    a.started = time.time()
    a.entered = {}  # the next attempt's phases (it starts at AGREE_ON_RESUME)
    a.retry += 1
    a.id = attempt_id(a.where, a.restarts, a.retry)
    return Phase.AGREE_ON_RESUME


def _restart(a: Attempt) -> Phase:
    """The leader starts the next attempt in this allocation (the others do on its published outcome): no
    requeue, no back-off; it is opened like a new job's (attempt_open.json, status.json "running"). A restart
    onto spares trains on the decision's roster (node 0 keeps its place)."""
    assert a.decision is not None
    if a.decision.roster:
        _take_place(a, a.decision.roster, a.decision.spares)
    _next_attempt(a, attempt_id(a.where, a.restarts + 1, a.retry))
    if (why := close_lost_attempt(a.run_dir, a.plan, a.where, a.id, a.lease)) is not None:
        return _stopped(a, why)
    return Phase.AGREE_ON_RESUME


def _next_attempt(a: Attempt, next_id: str) -> Phase:
    """Every node, on a restart in place: the next attempt, with the signals the last one acted on forgotten
    (one that came since is the next attempt's: it ends that one before it trains)."""
    print(f"[swiftslurm] attempt {a.id}, node {a.where.node_id}: restarting in place as {next_id}", flush=True)
    a.signals.forget(len(a.observed.signals) if a.observed else 0)  # a spare acted on none
    a.restarts += 1
    a.id, a.started = next_id, time.time()
    a.entered = {}  # the next attempt's phases (it starts at AGREE_ON_RESUME)
    a.resume = a.observed = a.decision = None
    return Phase.AGREE_ON_RESUME


@dataclass
class _PeerFailed:
    """Whether another node's trainer of this attempt ended with a failure (its node result says so). The
    trainers form one static world: once one is gone, the others can only fail or hang in their next
    collective, so each node ends its own at once and the outcome (a restart in place) is not held up."""

    attempt_dir: Path
    where: SlurmEnv

    def failed(self) -> bool:
        # Asked at every poll of the trainer: only the results that are there are read (one listing, not a stat
        # of each peer's file: that was N(N-1) operations per poll on the shared run dir over all nodes).
        peers = nodes_with_results(self.attempt_dir) - {self.where.node_id}
        return any(records.read_node_exit_code(node_result(self.attempt_dir, n)) not in (None, 0) for n in peers)


@dataclass
class _DrainCut:
    """Seconds left to the upload drain (Uploader.drain asks): unbounded until a stop signal comes after the
    ``seen`` ones the attempt was concluded with; then what SLURM's end time allows, KILL_MARGIN_S before it
    (a preemption moves it to the end of the grace time), or nothing when SLURM cannot say (or, outside SLURM,
    a person stopped the run)."""

    where: SlurmEnv
    signals: SignalLog
    seen: int
    ends: float = float("inf")

    def left_s(self) -> float:
        if len(self.signals.received) > self.seen:
            self.seen = len(self.signals.received)
            self.ends = min(self.ends, _kill_time(self.where) - KILL_MARGIN_S)
        return self.ends - time.time()


def _kill_time(where: SlurmEnv) -> float:
    """When SLURM ends this job as things stand (infinity: no end); now + KILL_MARGIN_S when it cannot say."""
    times, unknown = job_times(where)
    if times is not None:
        return float("inf") if times.kill_at is None else times.kill_at
    if unknown:
        print(f"[swiftslurm] after a stop signal, {unknown}", flush=True)
    return time.time() + KILL_MARGIN_S


PHASES: dict[Phase, Callable[[Attempt], Phase]] = {
    Phase.PREPARE: _prepare,
    Phase.AGREE_ON_RESUME: _agree_on_resume,
    Phase.TRAIN: _train,
    Phase.SKIP: _skip,
    Phase.SIGNALLED: _signalled,
    Phase.UNRESTORED: _unrestored,
    Phase.STANDBY: _stand_by,
    Phase.CONCLUDE: _conclude,
    Phase.AWAIT_OUTCOME: _await_outcome,
    Phase.FINISH_UPLOADS: _finish_uploads,
    Phase.ACT: _act,
}
