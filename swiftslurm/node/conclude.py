"""The leader's account of an attempt: how it ended (classified from the facts), the run's history with it,
the decision (decide.py, pure), and the records: attempts.jsonl and status.json. Also the two attempts
that never train: one that was lost without a record, and one whose preflight failed."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

from swiftslurm import slurm_cli
from swiftslurm.errors import SwiftSlurmError
from swiftslurm.node import decide, records
from swiftslurm.node.ckpt.checkpoint import ResumePoint, checkpoint_step, newest_committed
from swiftslurm.node.engines.registry import engine_for
from swiftslurm.node.progress import tail
from swiftslurm.node.resume import publish_failure
from swiftslurm.node.signals import SAVE_SIGNAL
from swiftslurm.node.slurm_env import SlurmEnv
from swiftslurm.node.watch import Observed, node_log_path
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import attempt_dir, preflight_report, resume_file
from swiftslurm.runs import is_cancelled

# Healthy nodes write their result as soon as their trainer exits; this must stay well under SLURM's own
# reaction to a dead node (SlurmdTimeout + KillWait), or the leader is killed before it names the host.
SILENT_HOST_WAIT_S = 10.0


def conclude(
    plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt: str, resume: ResumePoint, observed: Observed
) -> decide.Decision:
    """Leader: classify the attempt, fold it into the run's history, decide, and write it all down."""
    signal_reason = _signal_reason(observed, where, plan)
    # scancel / Ctrl-C, or `swiftslurm cancel` (its mark also covers a stop that looked like a preemption)
    cancelled = (bool(observed.signals) and signal_reason is None) or is_cancelled(run_dir)
    hosts = where.hosts or (socket.gethostname(),)
    failed = _failed_host(attempt_dir(run_dir, attempt), hosts, observed)
    facts = _facts(plan, where, run_dir, attempt, resume, observed, signal_reason, failed)
    reason, explanation = decide.classify(facts, plan.resilience.user_error_window_s)
    committed, _ = newest_committed(plan.output_dir)
    committed_step = checkpoint_step(committed) if committed else 0
    history = _history(run_dir, reason, (committed_step or 0) > resume.step, failed)
    decision = decide.decide(reason, explanation, history, _budget(plan))
    cancelled = cancelled and reason is not decide.Reason.FINISHED  # a cancel after the last step changes nothing
    if cancelled:  # scancel / Ctrl-C / swiftslurm cancel: a person stopped it; never requeue
        how = "swiftslurm cancel" if is_cancelled(run_dir) else "TERM/INT"
        reason = decide.Reason.CANCELLED
        decision = decide.Decision(decide.Action.STOP, reason, f"cancelled ({how}); {explanation}")
    records.append_attempt(run_dir, _record(where, attempt, resume, observed, decision, committed_step, failed))
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


def end_time(where: SlurmEnv) -> float | None:
    """When SLURM ends this job (None outside SLURM, or when SLURM cannot say)."""
    if not where.in_slurm or where.job_id is None:
        return None
    try:
        return slurm_cli.job_end_time(where.job_id)
    except SwiftSlurmError:
        return None


def close_lost_attempt(run_dir: Path, plan: JobPlan, where: SlurmEnv, attempt: str) -> str | None:
    """Record an attempt that ended without a record (its node died, or SLURM killed everything), and
    say why the run stops here if the budget says so (None: go on). Marks this attempt as open."""
    lost = records.open_attempt(run_dir, {"attempt": attempt, "job_id": where.job_id, "start": time.time()})
    records.write_status(run_dir, "running", job_id=where.job_id, attempt=attempt)
    if lost is None:
        return None
    reason = decide.Reason.INFRA
    why = f"attempt {lost['attempt']} ended without a record (a node was lost, or the job was killed)"
    decision = decide.decide(reason, why, _history(run_dir, reason, False, None), _budget(plan))
    records.append_attempt(
        run_dir,
        {
            **lost,
            "reason": reason.value,
            "decision": decision.action.value,
            "why": decision.why,
            "progressed": False,
            "end": None,
        },
    )
    if decision.action is not decide.Action.STOP:
        return None
    records.write_status(run_dir, "failed", reason=reason.value, why=decision.why, job_id=where.job_id)
    return decision.why


def stop_after_preflight(run_dir: Path, where: SlurmEnv, attempt: str, failure: str) -> str:
    """Record the failed preflight as this attempt (no training ran, no requeue) and tell the other nodes.
    Returns why the run stops."""
    why = f"preflight failed: {failure} (report: {preflight_report(run_dir, attempt)})"
    reason = decide.Reason.INFRA.value
    now = round(time.time(), 3)
    hosts = list(where.hosts) or [socket.gethostname()]
    record: dict[str, object] = {"attempt": attempt, "job_id": where.job_id, "hosts": hosts}
    record |= {"start": now, "end": now, "preflight": "failed", "progressed": False, "reason": reason}
    records.append_attempt(run_dir, {**record, "decision": decide.Action.STOP.value, "why": why})
    records.write_status(run_dir, "failed", reason=reason, why=why, job_id=where.job_id, attempt=attempt)
    publish_failure(resume_file(run_dir, attempt), why)  # the others stop waiting
    print(f"[swiftslurm] attempt {attempt}: {why}", flush=True)
    return why


def _facts(
    plan: JobPlan,
    where: SlurmEnv,
    run_dir: Path,
    attempt: str,
    resume: ResumePoint,
    observed: Observed,
    signal_reason: decide.Reason | None,
    failed: str | None,
) -> decide.AttemptFacts:
    return decide.AttemptFacts(
        exit_code=observed.exit_code,
        signal_reason=signal_reason,
        steps_done=max(0, (observed.watch.step or 0) - resume.step),
        reached_last_step=_reached_last_step(plan),
        hung=observed.hung,
        log_tail=tail(node_log_path(run_dir, attempt, where)),
        elapsed_s=time.time() - observed.started,
        failed_host=failed,
    )


def _signal_reason(observed: Observed, where: SlurmEnv, plan: JobPlan) -> decide.Reason | None:
    """USR2: preempted or timed out, by how close the time limit was. A TERM without USR2 is a cancel,
    unless it came at the time limit itself (SLURM's warning was missed): that is a time-out too."""
    if not observed.signals:
        return None
    ends = end_time(where)
    usr2 = next((t for s, t in observed.signals if s == SAVE_SIGNAL), None)
    if usr2 is not None:
        return decide.classify_signal(usr2, ends, plan.resilience.signal_lead_s)
    first = observed.signals[0][1]
    if ends is not None and decide.classify_signal(first, ends, 0) is decide.Reason.TIMED_OUT:
        return decide.Reason.TIMED_OUT
    return None


def _failed_host(attempt_dir: Path, hosts: tuple[str, ...], observed: Observed) -> str | None:
    if observed.exit_code == 0 or observed.signals or len(hosts) < 2:
        return None
    silent = records.silent_hosts(attempt_dir, hosts, SILENT_HOST_WAIT_S)
    return silent[0] if silent else None


def _reached_last_step(plan: JobPlan) -> bool:
    return engine_for(plan.launcher).reached_last_step(plan.output_dir)


def _budget(plan: JobPlan) -> decide.Budget:
    r = plan.resilience
    return decide.Budget(r.max_attempts, r.max_timeouts, r.max_consecutive_failures, r.backoff_base_s, r.backoff_max_s)


def _history(run_dir: Path, reason: decide.Reason, progressed: bool, failed: str | None) -> decide.History:
    return decide.history_after(decide.history_of(records.read_attempts(run_dir)), reason, progressed, failed)


def _state(decision: decide.Decision, cancelled: bool) -> str:
    if cancelled:
        return "cancelled"
    return {"done": "finished", "requeue": "requeued", "stop": "failed"}[decision.action.value]


def _record(
    where: SlurmEnv,
    attempt: str,
    resume: ResumePoint,
    observed: Observed,
    decision: decide.Decision,
    committed_step: int | None,
    failed: str | None,
) -> dict[str, object]:
    watch = observed.watch
    return {
        "attempt": attempt,
        "job_id": where.job_id,
        "restart_count": where.restart_count,
        "hosts": list(where.hosts) or [socket.gethostname()],
        "start": round(observed.started, 3),
        "end": round(time.time(), 3),
        "exit_code": observed.exit_code,
        "signals": [[signal.Signals(s).name, round(t, 3)] for s, t in observed.signals],
        "first_step_at": watch.first_step_at,
        "last_step": watch.step,
        "max_steps": watch.max_steps,
        "resumed_from": str(resume.checkpoint) if resume.checkpoint else None,
        "resume_step": resume.step,
        "quarantined": [str(p) for p in resume.quarantined],
        "rejected": list(resume.rejected),
        "committed_step": committed_step,
        "progressed": (committed_step or 0) > resume.step,
        "failed_host": failed,
        "reason": decision.reason.value,
        "decision": decision.action.value,
        "why": decision.why,
        "delay_s": decision.delay_s,
        "exclude_hosts": list(decision.exclude_hosts),
    }
