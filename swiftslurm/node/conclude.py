"""The leader's account of an attempt: how it ended (classified from the facts), the run's history with it,
the decision (decide.py, pure), and the records: attempts.jsonl and status.json. Also the attempts that
never train: one that was lost without a record, one whose preflight failed, and one the wrapper refused
(the allocation or the run dir does not match the plan); and a requeue that SLURM did not carry out."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from swiftslurm import slurm as slurm_cli
from swiftslurm.ckpt.checkpoint import (
    ResumePoint,
    checkpoint_step,
    committed_bytes,
    newest_committed,
    quarantine_newer_than,
    unfinished_save,
)
from swiftslurm.engines.progress import tail
from swiftslurm.engines.registry import engine_for
from swiftslurm.errors import SlurmError, SwiftSlurmError
from swiftslurm.node import decide, swap
from swiftslurm.node.resume import publish_failure
from swiftslurm.node.watch import Observed, hang_line, node_log_path
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import lease, records
from swiftslurm.rundir.beat import STALE_S, spare_silences
from swiftslurm.rundir.layout import QUARANTINE, attempt_dir, node_log, plan_file, preflight_report, resume_file
from swiftslurm.rundir.lease import Lease, job_alive
from swiftslurm.rundir.records import CONCLUDED_KEYS, AttemptRecord, is_cancelled
from swiftslurm.signals import SAVE_SIGNAL
from swiftslurm.slurm_env import AttemptShape, SlurmEnv, configured_exclusions, least_nodes

# Healthy nodes write their result as soon as their trainer exits; those still without one after this wait
# are the suspects, which SLURM is then asked about.
SILENT_HOST_WAIT_S = 10.0
# A host that wrote no result is blamed only once SLURM says it is down; SLURM notices after SlurmdTimeout
# (and then ends the job after KillWait: the state is seen within one poll of that), so the leader keeps
# asking for a while. A host that is merely slow (a peer still inside a collective timeout, a shared file
# system's attribute cache) is never blamed.
NODE_STATE_WAIT_S = 60.0
NODE_STATE_POLL_S = 2.0


def conclude(
    plan: JobPlan,
    where: SlurmEnv,
    run_dir: Path,
    attempt: str,
    resume: ResumePoint,
    observed: Observed,
    restarts: int = 0,
    phases: Mapping[str, float] | None = None,
    spares: tuple[str, ...] = (),
) -> decide.Decision:
    """Leader: classify the attempt, fold it into the run's history, decide, and write it all down.
    ``restarts``: the restarts in place this allocation has made so far; ``phases``: when the attempt entered
    each phase (attempt.py), recorded for the goodput ledger; ``spares``: the hosts standing by
    (`resilience.spare_nodes`); ``where``: this node on the attempt's roster (its hosts train)."""
    signal_reason, unknown_end = _signal_reason(observed, where, plan)
    # scancel / Ctrl-C, or `swiftslurm cancel` (its mark also covers a stop that looked like a preemption)
    cancelled = (bool(observed.signals) and signal_reason is None) or is_cancelled(run_dir)
    hosts = where.hosts or (socket.gethostname(),)
    blamed = _blame(attempt_dir(run_dir, attempt), hosts, observed)  # waits (bounded) for every node's result
    failed = blamed[0] if blamed else None
    first = _first_failure(attempt_dir(run_dir, attempt), hosts, observed)
    facts = _facts(plan, where, run_dir, attempt, resume, observed, signal_reason, failed, first)
    reason, explanation = decide.classify(facts, plan.resilience.user_error_window_s)
    if reason is decide.Reason.UNKNOWN_STOP:
        explanation = f"{explanation} ({unknown_end})"
    if first is not None:  # the nodes' earliest failure, which made the others fail or end theirs
        explanation = f"{first.named()} failed first: {explanation}"
    elif observed.peer_failed:  # the wrapper killed it: its exit code says nothing of the cause
        explanation = f"{explanation}; ended by its wrapper after another node's trainer failed"
    if reason is decide.Reason.INFRA and observed.hang is not None:  # the watchdog's verdict (decide.classify)
        explanation = f"{explanation}: {hang_line(observed.hang)}"
    committed, _ = newest_committed(plan.output_dir)
    committed_step = checkpoint_step(committed) if committed else 0
    set_aside: list[Path] = []
    if reason is decide.Reason.DISK_FULL:  # nothing resumes from it; the next start deletes it (ckpt.reclaim)
        set_aside = quarantine_newer_than(plan.output_dir, committed_step or 0, attempt)
        kept = f"{committed.name} is kept" if committed else "no committed checkpoint to keep"
        moved = ", ".join(f"{QUARANTINE}/{path.name}" for path in set_aside)
        explanation = f"{explanation}; set aside as {moved}, {kept}"
    # resilience.straggler_action=exclude, and a straggler swapped out (swap): a requeue avoids it
    slow = [s["host"] for s in observed.stragglers if s.get("exclude") or s.get("swap")]
    history = _history(run_dir, reason, (committed_step or 0) > resume.step, failed, slow)
    # Never restarted in place after an outage of the store: a requeue's back-off gives it time to come back.
    here = attempt_dir(run_dir, attempt)
    swapped = swap.hosts(observed.swap) if observed.swap else ()
    allocation = (
        None
        if observed.unrestored
        else _allocation(here, hosts, reason, blamed, restarts, spares, observed.started, swapped)
    )
    slack = _partition_slack(plan)
    decision = decide.decide(reason, explanation, history, _budget(plan), time.time(), slack, allocation)
    shape = AttemptShape.of(where, plan)
    if shape.may_shrink:
        decision = _with_node_count(plan, decision)
    cancelled = cancelled and reason is not decide.Reason.FINISHED  # a cancel after the last step changes nothing
    if cancelled:  # scancel / Ctrl-C / swiftslurm cancel: a person stopped it; never requeue
        how = "swiftslurm cancel" if is_cancelled(run_dir) else "TERM/INT"
        decision = decide.cancelled(how, reason, explanation, facts.steps_done)
        reason = decision.reason
    record = _record(where, attempt, resume, observed, decision, committed_step, failed)
    record = replace(
        record,
        quarantined=(*record.quarantined, *(str(p) for p in set_aside)),
        failed_host_evidence=blamed[1] if blamed else None,
        end_time_error=unknown_end,
        phases={name: round(at, 3) for name, at in (phases or {}).items()},
        leftovers=_leftovers(here, hosts, observed),
        spares=spares,
        swaps=_swaps(hosts, decision.roster),
        swap_why=("straggler" if reason is decide.Reason.STRAGGLER else "lost") if decision.roster else None,
        stragglers=observed.stragglers,
    )
    if shape.may_shrink:  # the node count of this attempt, and the one the next asks for
        record = replace(record, nodes=shape.nodes, next_nodes=decision.nodes)
    records.close_attempt(run_dir, record)
    records.write_status(
        run_dir,
        _state(decision, cancelled),
        reason=reason.value,
        why=decision.why,
        job_id=where.job_id,
        attempt=attempt,
        committed_step=committed_step,
    )
    print(f"[swiftslurm] attempt {attempt}: {decision.why}", flush=True)
    return decision


def record_uploads(run_dir: Path, output_dir: Path, decision: decide.Decision, storage: Mapping[str, Any]) -> None:
    """After the upload drain: the storage state into status.json (``storage``: NodeSync.state()). A finished
    run whose last checkpoint is committed but not uploaded stays finished (training is complete, and SLURM's
    end may have cut the drain), but its `why` says so, and what uploads it: a run that restores from the
    store would otherwise find an older checkpoint, or none."""
    newest, _ = newest_committed(output_dir)
    last = checkpoint_step(newest) if newest else None
    if decision.action is not decide.Action.DONE or last is None or last not in storage.get("pending", ()):
        records.update_status(run_dir, storage=dict(storage))
        return
    failure = storage.get("last_failure") or "the upload wait ended first"
    why = (
        f"{decision.why}, but checkpoint-{last}, the last, is not uploaded to {storage.get('url')} ({failure}); "
        f"it is committed in {newest}. HINT: `python -m swiftslurm.ops.storage_cli upload --run-dir {run_dir}` "
        "uploads it"
    )
    records.update_status(run_dir, storage=dict(storage), why=why)
    print(f"[swiftslurm] {why}", flush=True)


def job_times(where: SlurmEnv) -> tuple[slurm_cli.JobTimes | None, str | None]:
    """When this job's time limit ends and when SLURM ends it (slurm.JobTimes), or None outside SLURM and when
    SLURM could not say; then also why it could not (else None). The node side's one reader of both."""
    if not where.in_slurm or where.job_id is None:
        return None, None
    try:
        return slurm_cli.job_times(where.job_id), None
    except SlurmError as err:
        tries = "1 try" if err.tries == 1 else f"{err.tries} tries"
        return None, f"the time limit could not be read after {tries}: {err.said or err}"


def close_lost_attempt(
    run_dir: Path,
    plan: JobPlan,
    where: SlurmEnv,
    attempt: str,
    held: Lease | None = None,
    alive: Callable[[str], bool] = job_alive,
) -> str | None:
    """Record an attempt that ended without a record (its node died, or SLURM killed everything), and
    say why the run stops here if the budget says so (None: go on). Marks this attempt as open.

    Only the lease's holder does this (``held`` is checked first), and an open attempt of another job is
    lost only once SLURM no longer holds that job: one that still runs stops this leader instead."""
    if held is not None:
        held.check("close a lost attempt")
    if (running := _still_running(records.read_open_attempt(run_dir), where, alive)) is not None:
        return running
    lost = records.open_attempt(run_dir, AttemptRecord(attempt, where.job_id, start=time.time()))
    records.write_status(run_dir, "running", job_id=where.job_id, attempt=attempt)
    if lost is None:
        return None
    reason = decide.Reason.INFRA
    why = f"attempt {lost.attempt} ended without a record (a node was lost, or the job was killed)"
    history = _history(run_dir, reason, False, None)
    decision = decide.decide(reason, why, history, _budget(plan), time.time(), _partition_slack(plan))
    closed = replace(lost, reason=reason.value, decision=decision.action.value, why=decision.why, progressed=False)
    records.append_attempt(run_dir, replace(closed, end=None, keep_keys=(*closed.keep_keys, "end")))  # end: null
    if decision.action is not decide.Action.STOP:
        return None
    records.write_status(run_dir, "failed", reason=reason.value, why=decision.why, job_id=where.job_id)
    return decision.why


def _still_running(opened: AttemptRecord | None, where: SlurmEnv, alive: Callable[[str], bool]) -> str | None:
    """Why the open attempt is not lost: SLURM still holds its job, another one than this (None: it is lost,
    or it is this job's, or there is none; outside SLURM nobody can be asked)."""
    job = str(opened.job_id or "") if opened else ""
    if opened is None or not where.in_slurm or not job or job == str(where.job_id) or not alive(job):
        return None
    return (
        f"attempt {opened.attempt} of job {job} is still open and SLURM still holds job {job}: it is not "
        f"lost, and job {where.job_id} stops. HINT: one job per run dir: wait for job {job}, or `scancel {job}`."
    )


def stop_after_preflight(run_dir: Path, where: SlurmEnv, attempt: str, failure: str, nonce: str | None = None) -> str:
    """Record the failed preflight as this attempt (no training ran, no requeue) and tell the other nodes.
    Returns why the run stops."""
    why = f"preflight failed: {failure} (report: {preflight_report(run_dir, attempt)})"
    reason = decide.Reason.INFRA.value
    now = round(time.time(), 3)
    stop = decide.Action.STOP.value
    record = _unstarted(where, attempt, now, reason=reason, decision=stop, why=why)
    records.close_attempt(run_dir, replace(record, preflight="failed"))
    records.write_status(run_dir, "failed", reason=reason, why=why, job_id=where.job_id, attempt=attempt)
    publish_failure(resume_file(run_dir, attempt), why, nonce)  # the others stop waiting
    print(f"[swiftslurm] attempt {attempt}: {why}", flush=True)
    return why


def record_requeue_failure(
    run_dir: Path, where: SlurmEnv, attempt: str, decision: decide.Decision, err: SlurmError
) -> str:
    """`scontrol requeue` failed for good after the attempt was recorded as requeued: its row is amended
    (decision `stop`, `requeue_error`) and status.json says `failed`, with the reason kept. Nothing brings the
    job back now, so the run stops here until a person resubmits it. Returns why."""
    tries = "1 try" if err.tries == 1 else f"{err.tries} tries"
    said = err.said or str(err)
    why = (
        f"{decision.why}; but SLURM did not requeue job {where.job_id} after {tries}: {said}; "
        f"the run stops here. HINT: once `scontrol ping` answers, {decide.RESUBMIT}"
    )
    stop = decide.Action.STOP.value
    records.amend_attempt(run_dir, attempt, decision=stop, why=why, requeue_error=decide.one_line(said))
    facts = {k: v for k, v in (records.read_status(run_dir) or {}).items() if k not in ("state", "updated")}
    records.write_status(run_dir, "failed", **{**facts, "why": why, "requeue_error": decide.one_line(said)})
    print(f"[swiftslurm] attempt {attempt}: {why}", flush=True)
    return why


def record_wrapper_failure(
    run_dir: Path, where: SlurmEnv, attempt: str, error: BaseException, during: str = "while concluding"
) -> None:
    """Node 0's wrapper failed (a bug, a filesystem error) ``during`` a step of the attempt: the attempt still
    gets a row and the run a final state, `failed` with the error, so the run dir says how it ended; nothing
    requeues it (the wrapper exits with the error). Best effort: a second error here is only printed."""
    why = f"swiftslurm's wrapper failed {during} attempt {attempt}: {error!r}; rerun the same command to resume"
    try:
        record = _unstarted(where, attempt, round(time.time(), 3), reason="infra", decision="stop", why=why)
        records.append_attempt(run_dir, record)
        records.write_status(run_dir, "failed", reason="infra", why=why, job_id=where.job_id, attempt=attempt)
    except OSError as err:
        print(f"[swiftslurm] could not record the failure either: {err}", flush=True)


def record_refusal(
    run_dir: Path, where: SlurmEnv, attempt: str, why: str, alive: Callable[[str], bool] | None = None
) -> bool:
    """Node 0: the wrapper refuses to start this attempt (a wrong node count, a changed plan.json): record it in
    attempts.jsonl and status.json (`failed`, reason user_error, ``why``), so the run dir says why, whoever
    submitted the job; the job's log may be anywhere. Not while another job leads the run: a refused job beside
    one that runs changes nothing. It does not take the lease either (a fixed resubmission may start while this
    job is still completing). False when nothing was recorded (not node 0, not a run dir, another job leads)."""
    if where.node_id != 0 or not plan_file(run_dir).is_file():
        return False
    if (elsewhere := lease.led_elsewhere(run_dir, where, alive)) is not None:
        print(f"[swiftslurm] not recorded in {run_dir}: {elsewhere}", flush=True)
        return False
    reason, stop = decide.Reason.USER_ERROR.value, decide.Action.STOP.value
    record = _unstarted(where, attempt, round(time.time(), 3), reason=reason, decision=stop, why=why)
    records.append_attempt(run_dir, replace(record, refused=True))
    records.write_status(run_dir, "failed", reason=reason, why=why, job_id=where.job_id, attempt=attempt)
    return True


def _unstarted(where: SlurmEnv, attempt: str, now: float, reason: str, decision: str, why: str) -> AttemptRecord:
    """The record of an attempt that ended before training began: it started and ended ``now``."""
    hosts = where.hosts or (socket.gethostname(),)
    return AttemptRecord(
        attempt,
        where.job_id,
        hosts=hosts,
        start=now,
        end=now,
        progressed=False,
        reason=reason,
        decision=decision,
        why=why,
    )


def _facts(
    plan: JobPlan,
    where: SlurmEnv,
    run_dir: Path,
    attempt: str,
    resume: ResumePoint,
    observed: Observed,
    signal_reason: decide.Reason | None,
    failed: str | None,
    first: decide.NodeEnd | None = None,
) -> decide.AttemptFacts:
    """What node 0 observed; with ``first`` (the node that failed first, of several) that node's exit code and
    log instead of node 0's own."""
    return decide.AttemptFacts(
        exit_code=first.exit_code if first else observed.exit_code,
        signal_reason=signal_reason,
        steps_done=max(0, (observed.watch.step or 0) - resume.step),
        reached_last_step=_reached_last_step(plan),
        hung=observed.hung,
        log_tail=first.log_tail if first else tail(node_log_path(run_dir, attempt, where)),
        elapsed_s=time.time() - observed.started,
        failed_host=failed,
        unrestored=observed.unrestored,
        trained_before=_trained_before(run_dir, resume),
        restored_from=resume.restored,
        save_space=_save_space(plan, observed),
        straggler=swap.line(observed.swap) if observed.swap else None,
    )


def _trained_before(run_dir: Path, resume: ResumePoint) -> bool:
    """Whether the run trained before this attempt: it resumes a committed checkpoint, or an earlier attempt
    logged a training step."""
    return resume.step > 0 or any(past.first_step_at is not None for past in records.read_attempts(run_dir))


def _save_space(plan: JobPlan, observed: Observed) -> decide.SaveSpace | None:
    """The disk as the trainer left it when its newest checkpoint is unfinished (else None), and what a
    checkpoint needs: the newest committed one's size, or the plan's estimate before the first commit."""
    unfinished = unfinished_save(plan.output_dir)
    if unfinished is None or observed.disk_free is None:
        return None
    newest, _ = newest_committed(plan.output_dir)
    if newest is not None:
        needed, basis = committed_bytes(newest), f"the size of {newest.name}"
    else:
        needed, basis = int(plan.preflight.min_free_gb * 1e9), "the plan's estimate of one checkpoint"
    return decide.SaveSpace(str(unfinished), observed.disk_free, needed, basis)


def _signal_reason(observed: Observed, where: SlurmEnv, plan: JobPlan) -> tuple[decide.Reason | None, str | None]:
    """USR2: preempted or timed out, by how close the time limit was; an unknown stop when SLURM cannot say
    when that is (not a preemption: those are requeued without limit). A TERM without USR2 is a cancel,
    unless it came at the time limit itself (SLURM's warning was missed): that is a time-out too.
    Also returns why the end time is unknown, if it is."""
    if not observed.signals:
        return None, None
    times, unknown = job_times(where)
    ends = times.limit_ends if times else None
    usr2 = next((t for s, t in observed.signals if s == SAVE_SIGNAL), None)
    if usr2 is not None and unknown:
        return decide.Reason.UNKNOWN_STOP, unknown
    if usr2 is not None:
        return decide.classify_signal(usr2, ends, plan.resilience.signal_lead_s), None
    first = observed.signals[0][1]
    if ends is not None and decide.classify_signal(first, ends, 0) is decide.Reason.TIMED_OUT:
        return decide.Reason.TIMED_OUT, None
    return None, unknown


def _blame(attempt_dir: Path, hosts: tuple[str, ...], observed: Observed) -> tuple[str, str] | None:
    """The host that failed this attempt and the evidence, when there is positive evidence (decide.blame)."""
    if observed.exit_code == 0 or observed.signals or observed.swap:  # a stop: nothing failed
        return None
    own = {h: f for i, h in enumerate(hosts) if (f := decide.own_fault(tail(node_log(attempt_dir, i))))}
    silent = _silent_hosts_states(attempt_dir, hosts, 0.0 if own else NODE_STATE_WAIT_S) if len(hosts) > 1 else {}
    return decide.blame(silent, own)


def _first_failure(attempt_dir: Path, hosts: tuple[str, ...], observed: Observed) -> decide.NodeEnd | None:
    """Of several nodes, the one whose trainer failed first (decide.first_failure), from every node's result
    and log, node 0's own from what it observed. None on one node, after a stop signal or a hang (those are
    node 0's verdicts), and when the attempt did not fail."""
    if len(hosts) < 2 or observed.signals or observed.swap or observed.hung or observed.exit_code == 0:
        return None
    own = records.TrainerEnd(0, hosts[0], observed.exit_code, observed.ended_at, observed.ended_by)
    others = (records.read_node_result(attempt_dir, node) for node in range(1, len(hosts)))
    ends = [_node_end(attempt_dir, hosts, result) for result in (own, *others) if result is not None]
    return decide.first_failure(ends)


def _leftovers(attempt_dir: Path, hosts: tuple[str, ...], observed: Observed) -> tuple[str, ...]:
    """Every node's trainer processes that outlived their KILL (launch.py), node 0's as it observed them, the
    others' from their results: what the next attempt on those nodes may find still holding GPUs or files."""
    others = (records.read_node_result(attempt_dir, node) for node in range(1, len(hosts)))
    found = [(0, observed.leftovers), *((r.node, r.leftovers) for r in others if r is not None)]
    return tuple(f"node{node}: {process}" for node, processes in found for process in processes)


def _node_end(attempt_dir: Path, hosts: tuple[str, ...], result: records.TrainerEnd) -> decide.NodeEnd:
    """A node's result with its log's last lines (read only for a trainer that failed by itself)."""
    own_failure = result.exit_code != 0 and result.ended_by is None
    log_tail = tail(node_log(attempt_dir, result.node)) if own_failure else ""
    host = hosts[result.node] if result.node < len(hosts) else result.host
    return decide.NodeEnd(result.node, host, result.exit_code, result.ended_at, result.ended_by is not None, log_tail)


def _silent_hosts_states(attempt_dir: Path, hosts: tuple[str, ...], patience_s: float) -> dict[str, str]:
    """SLURM's state of each host that wrote no result, asked again while none is reported down, for up to
    `patience_s`."""
    silent = records.silent_hosts(attempt_dir, hosts, SILENT_HOST_WAIT_S)
    deadline = time.time() + patience_s
    while silent:
        states = _node_states(silent)
        if any(decide.node_down(state) for state in states.values()) or time.time() >= deadline:
            return states
        time.sleep(NODE_STATE_POLL_S)
        silent = records.silent_hosts(attempt_dir, hosts, 0)
    return {}


def _node_states(hosts: list[str]) -> dict[str, str]:
    try:
        return slurm_cli.node_states(hosts)
    except SwiftSlurmError as err:  # SLURM cannot say: no evidence against anyone
        return dict.fromkeys(hosts, f"unknown ({decide.one_line(str(err), 120)})")


def _allocation(
    attempt_dir: Path,
    hosts: tuple[str, ...],
    reason: decide.Reason,
    blamed: tuple[str, str] | None,
    restarts: int,
    spares: tuple[str, ...],
    since: float,
    swapped: tuple[str, ...] = (),
) -> decide.Allocation | None:
    """What a restart in place needs to know (None when it cannot be one: not a SWAPPABLE reason). Every
    node is alive when none is blamed and each wrote its result: its wrapper is there to start the next
    attempt (a peer's trainer ends at once when another's fails: watch.py). With spares, the blamed host is
    lost when it is the only one without a result (or wrote one: its own GPU fault): a spare may take its place,
    if SLURM does not report it down and its wrapper has beaten lately (since ``since``, the attempt's start); so
    is each straggler ``swapped`` out (swap.py): alive, but it trains no more in this allocation."""
    if reason not in decide.SWAPPABLE:
        return None
    if reason is decide.Reason.STRAGGLER:  # every other node must be there to restart (a silent one: requeue)
        silent = records.silent_hosts(attempt_dir, hosts, SILENT_HOST_WAIT_S)
        lost = tuple(host for host in swapped if host in hosts) if set(silent) <= set(swapped) else ()
        if not lost:
            return decide.Allocation(not silent, restarts, hosts, spares, lost)
        live, quiet = _callable_spares(attempt_dir, spares, since)
        return decide.Allocation(not silent, restarts, hosts, live, lost, silent_spares=quiet)
    # A blamed host was found after the results had SILENT_HOST_WAIT_S to come (`_blame`): no second wait.
    silent = records.silent_hosts(attempt_dir, hosts, 0.0 if blamed else SILENT_HOST_WAIT_S)
    alive = blamed is None and not silent
    lost = (blamed[0],) if spares and blamed and set(silent) <= {blamed[0]} else ()
    if not lost:
        return decide.Allocation(all_alive=alive, restarts=restarts, roster=hosts, spares=spares)
    live, quiet = _callable_spares(attempt_dir, spares, since)
    return decide.Allocation(alive, restarts, hosts, live, lost, silent_spares=quiet)


def _callable_spares(
    attempt_dir: Path, spares: tuple[str, ...], since: float
) -> tuple[tuple[str, ...], tuple[tuple[str, float], ...]]:
    """The spares node 0 may call in (SLURM does not report them down, their wrappers beat lately), and those
    skipped as silent."""
    up = _spares_up(spares)
    return decide.live_spares(up, spare_silences(attempt_dir, up, time.time(), since), STALE_S)


def _spares_up(spares: tuple[str, ...]) -> tuple[str, ...]:
    """The spares SLURM does not report down (when SLURM cannot say, all of them): a node that is down takes
    its spare's wrapper with it; one that is up may have lost it all the same (its heartbeat says)."""
    if not spares:
        return ()
    states = _node_states(list(spares))
    return tuple(host for host in spares if not decide.node_down(states.get(host, "")))


def _swaps(roster: tuple[str, ...], next_roster: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """(lost host, the spare in its place) for each node rank a restart onto spares gives another host."""
    if not next_roster:
        return ()
    return tuple((old, new) for old, new in zip(roster, next_roster, strict=True) if old != new)


def _partition_slack(plan: JobPlan) -> int:
    """Nodes of the partition beyond those the job asks for (spares included) and those the cluster config
    excludes already: how many hosts may be excluded without making the job unschedulable (0 when SLURM cannot
    say). A run that may shrink needs only `resilience.min_nodes`."""
    partition = plan.slurm.partition if plan.slurm else None
    configured = configured_exclusions(plan)
    try:
        size = slurm_cli.partition_size(partition)
    except SwiftSlurmError:
        return 0
    return size - len(configured) - least_nodes(plan) - plan.resilience.spare_nodes


def _with_node_count(plan: JobPlan, decision: decide.Decision) -> decide.Decision:
    """The decision with the node count a requeue asks for, from the partition's healthy nodes (SLURM does not
    report them down or drained): busy nodes count, since they come free; a lost one does not."""
    if decision.action is not decide.Action.REQUEUE:
        return decision
    partition = plan.slurm.partition if plan.slurm else None
    try:
        states = slurm_cli.partition_node_states(partition)
        healthy: list[str] | None = [node for node, state in states.items() if not decide.node_down(state)]
    except SwiftSlurmError as err:  # SLURM cannot say: ask for the planned count, as without min_nodes
        print(f"[swiftslurm] could not read the partition's nodes, not shrinking: {err}", flush=True)
        healthy = None
    excluded = {*configured_exclusions(plan), *decision.exclude_hosts}
    return decide.with_node_count(decision, plan.topology.nodes, least_nodes(plan), healthy, excluded)


def _reached_last_step(plan: JobPlan) -> bool:
    return engine_for(plan.launcher).reached_last_step(plan.output_dir, plan.swift_argv)


def _budget(plan: JobPlan) -> decide.Budget:
    """The node side's copy of the run's budgets: Budget's fields, taken from the plan's Resilience."""
    return decide.Budget(**{f.name: getattr(plan.resilience, f.name) for f in fields(decide.Budget)})


def _history(
    run_dir: Path, reason: decide.Reason, progressed: bool, failed: str | None, slow: Iterable[str] = ()
) -> decide.History:
    past = decide.history_of(records.read_attempts(run_dir))
    return decide.history_after(past, reason, progressed, failed, time.time(), slow)


def _state(decision: decide.Decision, cancelled: bool) -> str:
    if cancelled:
        return "cancelled"
    return {"done": "finished", "requeue": "requeued", "restart": "restarting", "stop": "failed"}[decision.action.value]


def _record(
    where: SlurmEnv,
    attempt: str,
    resume: ResumePoint,
    observed: Observed,
    decision: decide.Decision,
    committed_step: int | None,
    failed: str | None,
) -> AttemptRecord:
    watch = observed.watch
    return AttemptRecord(
        attempt=attempt,
        job_id=where.job_id,
        restart_count=where.restart_count,
        hosts=where.hosts or (socket.gethostname(),),
        start=round(observed.started, 3),
        end=round(time.time(), 3),
        exit_code=observed.exit_code,
        signals=tuple((signal.Signals(s).name, round(t, 3)) for s, t in observed.signals),
        first_step_at=watch.first_step_at,
        last_step=watch.step,
        last_step_at=watch.last_change_at,
        max_steps=watch.max_steps,
        resumed_from=str(resume.checkpoint) if resume.checkpoint else None,
        resume_step=resume.step,
        quarantined=tuple(str(p) for p in resume.quarantined),
        rejected=tuple(resume.rejected),
        restore_error=resume.restore_error,
        restored_from=resume.restored,
        removed=tuple(str(p) for p in resume.removed),
        committed_step=committed_step,
        progressed=(committed_step or 0) > resume.step,
        failed_host=failed,
        reason=decision.reason.value,
        decision=decision.action.value,
        why=decision.why,
        delay_s=decision.delay_s,
        exclude_hosts=tuple(decision.exclude_hosts),
        hang=observed.hang,
        stop=observed.stop,
        keep_keys=CONCLUDED_KEYS,
    )
