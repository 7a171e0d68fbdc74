"""The on-node wrapper: plan.json + SLURM environment -> ms-swift on this node -> what happens next.

Every node: pick the newest committed checkpoint, start ms-swift with USR2 ignored by `swift`/torchrun,
record stop signals and forward USR2 to the training workers (they save at the current step and exit),
and write this node's result. Node 0 (the leader) also watches progress (a hung run is killed), then
classifies how the attempt ended, decides (decide.py, pure) and acts: done, stop, or requeue the same
SLURM job (excluding failed hosts, after a back-off). Other nodes always exit 0: with
`srun --kill-on-bad-exit` a failing follower would kill the leader before it has decided.
"""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import signal
import socket
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from swiftslurm import slurm_cli
from swiftslurm.errors import NodeError, SwiftSlurmError
from swiftslurm.node import decide, preflight, preflight_checks, records
from swiftslurm.node.ckpt.checkpoint import (
    ResumePoint,
    checkpoint_step,
    newest_committed,
    prepare_resume,
    read_manifest,
    write_json_atomic,
)
from swiftslurm.node.engines.registry import engine_for
from swiftslurm.node.launch import Trainer
from swiftslurm.node.progress import ProgressWatch, tail
from swiftslurm.node.signals import SAVE_SIGNAL, SignalLog
from swiftslurm.node.slurm_env import SlurmEnv, check_allocation, expand_hostlist, rank_env
from swiftslurm.node.storage.sync import NodeSync, restore
from swiftslurm.plan import JobPlan
from swiftslurm.render import swift_command
from swiftslurm.rundir import RESUME, attempt_dir, node_log, plan_file, preflight_report, resume_file
from swiftslurm.runs import is_cancelled
from swiftslurm.storage_spec import StorageSpec
from swiftslurm.tiny import build_tiny_assets

POLL_S = 0.5
REFORWARD_S = 5.0  # a worker that had not installed its handler yet gets the signal again
# Healthy nodes write their result as soon as their trainer exits; this must stay well under SLURM's own
# reaction to a dead node (SlurmdTimeout + KillWait), or the leader is killed before it names the host.
SILENT_HOST_WAIT_S = 10.0
RESUME_WAIT_S = 900.0  # restoring a large checkpoint from object storage can take a while
KILL_MARGIN_S = 30.0  # uploads before a requeue stop this long before SLURM's end time


@dataclass(frozen=True)
class NodeResult:
    node_rank: int
    hostname: str
    exit_code: int
    log_path: str
    resumed_from: str | None
    decision: str | None = None  # leader only: done | requeue | stop
    why: str = ""


class TrainingFailed(RuntimeError):
    """The run stopped for good (raised for submitit, which then marks the job failed)."""


@dataclass
class Observed:
    """How one trainer run went, as seen from its node."""

    exit_code: int
    signals: list[tuple[int, float]]
    hung: bool
    watch: ProgressWatch
    started: float


def load_plan(run_dir: Path) -> JobPlan:
    path = plan_file(run_dir)
    if not path.is_file():
        raise NodeError(
            f"{path} does not exist. HINT: prepare the run directory with `python -m swiftslurm ... "
            "dry_run=true run_dir=DIR` (it writes plan.json and job.sbatch), then submit that directory."
        )
    return JobPlan.load(path)


def attempt_id(where: SlurmEnv) -> str:
    """'<job id>' for a first attempt, '<job id>.r<N>' after the N-th requeue, 'local-<pid>' outside SLURM."""
    base = str(where.job_id) if where.in_slurm else f"local-{where.job_id or os.getpid()}"
    return f"{base}.r{where.restart_count}" if where.restart_count else base


def run_node(run_dir_arg: str) -> NodeResult:
    """Run this node's share of the run until the run is done, stopped, or requeued."""
    run_dir = Path(run_dir_arg).resolve()
    plan = load_plan(run_dir)
    _log_to_stdout()
    where = SlurmEnv.from_environ(os.environ)
    check_allocation(where, plan)
    if plan.tiny_cache:  # built on the login side already; this only checks (or builds if submitted by hand)
        build_tiny_assets(Path(plan.tiny_cache))
    leader = where.node_id == 0
    if leader and (stopped := _close_lost_attempt(run_dir, plan, where)) is not None:
        return stopped
    attempt = attempt_id(where)
    # Once per job, not after a requeue: every node must take the same branch, and SLURM's restart count is
    # the one fact they all share before the run dir is known to be shared.
    if plan.preflight.enabled and where.restart_count == 0:
        failure = _preflight(run_dir, where, attempt)
        if failure is not None and leader:
            return _stop_after_preflight(run_dir, where, attempt, failure)
    for retry in range(1, 1 << 30):
        resume = _agree_on_resume(plan, attempt_dir(run_dir, attempt), leader)
        sync = NodeSync(plan.storage, run_dir, plan.output_dir) if leader and plan.storage else None
        # A run whose newest commit is its last step is complete (killed or signalled after that commit):
        # starting the trainer again would train past the plan.
        observed = _nothing_to_train() if resume.complete else _train(plan, where, run_dir, attempt, resume, sync)
        result = NodeResult(
            where.node_id,
            socket.gethostname(),
            observed.exit_code,
            str(_log(run_dir, attempt, where)),
            str(resume.checkpoint) if resume.checkpoint else None,
        )
        records.write_node_result(attempt_dir(run_dir, attempt), where.node_id, result.hostname, observed.exit_code)
        if not leader:
            return result
        decision = _conclude(plan, where, run_dir, attempt, resume, observed)
        result = replace(result, decision=decision.action.value, why=decision.why)
        if sync is not None:
            _finish_uploads(sync, plan, where, run_dir, decision)
        if decision.action is not decide.Action.REQUEUE:
            return result
        if where.in_slurm:
            _requeue(where, plan, decision)
        time.sleep(decision.delay_s)  # no SLURM to requeue with: the next attempt starts here
        attempt = f"{attempt_id(where)}.retry{retry}"
    raise AssertionError("unreachable")


def _agree_on_resume(plan: JobPlan, attempt_dir: Path, leader: bool) -> ResumePoint:
    """The leader picks the resume point (and sets aside what is newer) and publishes it; the other nodes
    wait for that choice, so every rank loads the same checkpoint even while the leader is still
    quarantining or restoring."""
    path = attempt_dir / RESUME
    if leader:
        if plan.storage is not None:
            _restore_or_tell(plan.storage, plan.output_dir, path)
        point = prepare_resume(plan.output_dir, tag=attempt_dir.name, move=True)
        attempt_dir.mkdir(parents=True, exist_ok=True)
        chosen = {"checkpoint": str(point.checkpoint) if point.checkpoint else None, "step": point.step}
        write_json_atomic(path, {**chosen, "complete": point.complete})
        return point
    deadline = time.time() + RESUME_WAIT_S
    while not path.is_file():
        if time.time() > deadline:
            raise NodeError(f"node 0 did not publish {path} within {RESUME_WAIT_S:.0f} s; is node 0 alive?")
        time.sleep(POLL_S)
    chosen = json.loads(path.read_text())
    if chosen.get("error"):
        raise NodeError(f"node 0 could not prepare the resume point: {chosen['error']}")
    checkpoint = Path(chosen["checkpoint"]) if chosen["checkpoint"] else None
    return ResumePoint(checkpoint, chosen["step"], complete=bool(chosen.get("complete")))


def _restore_or_tell(spec: StorageSpec, output_dir: Path, resume_file: Path) -> None:
    """Fetch the remote checkpoint when the store is ahead (a wiped disk, a new cluster). If the store cannot
    be read, fail the attempt rather than resume behind it; the other nodes learn it from the resume file."""
    try:
        restore(spec, output_dir)
    except SwiftSlurmError as err:
        resume_file.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(resume_file, {"checkpoint": None, "step": 0, "error": str(err)})
        raise


def _log(run_dir: Path, attempt: str, where: SlurmEnv) -> Path:
    return node_log(attempt_dir(run_dir, attempt), where.node_id)


def _trainer_env(plan: JobPlan, where: SlurmEnv, run_dir: Path) -> dict[str, str]:
    return {
        **os.environ,
        **dict(plan.env),
        **rank_env(where, plan),
        "SWIFTSLURM_RUN_DIR": str(run_dir),
        "SWIFTSLURM_KEEP_CHECKPOINTS": str(plan.keep_checkpoints),
    }


def _train(
    plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt: str, resume: ResumePoint, sync: NodeSync | None
) -> Observed:
    """Run ms-swift once; forward stop signals to its workers; the leader kills it if it hangs and hands
    each newly committed checkpoint to the background uploader."""
    engine = engine_for(plan.launcher)
    extra = engine.resume_args(resume.checkpoint, plan.swift_argv) if resume.checkpoint else ()
    log_path = _log(run_dir, attempt, where)
    started = time.time()
    cpu_before = _own_cpu_s()
    watch = ProgressWatch(engine.progress.path(plan.output_dir, log_path), started, engine.progress.pattern)
    with SignalLog().installed() as signals:
        trainer = Trainer(swift_command(plan, extra), _trainer_env(plan, where, run_dir), log_path, cwd=run_dir)
        hung, forwarded_at = False, 0.0
        while (code := trainer.poll()) is None:
            time.sleep(POLL_S)
            now = time.time()
            if (
                signals.received
                and now - forwarded_at >= REFORWARD_S
                and not _saved_since(plan, signals.received[0][1])
            ):
                # Whatever stop signal came (USR2 from SLURM, TERM from scancel), the workers get USR2: it
                # makes them save and exit, and torchrun ignores it (TERM would make it SIGKILL them 30 s on).
                # Re-sent until a checkpoint is committed, but only to processes that handle it and have not
                # had it yet (a worker still loading); a second one would kill a rank that saved and is exiting.
                trainer.forward(SAVE_SIGNAL, engine.stop_recipients)
                forwarded_at = now
            watch.poll(now)
            if sync is not None:
                sync.poll(now)
            if where.node_id == 0 and not signals.received and _hung(watch, plan, now):
                hung = True
                trainer.kill()
            if signals.received and now - signals.received[0][1] > plan.resilience.signal_lead_s:
                # The save had its whole lead time; something (e.g. torchrun's exit barrier waiting for a
                # peer that is gone) keeps the trainer alive: end it rather than hold the allocation.
                trainer.kill()
        # What watching costs: the trainer's cores are not this process's, but say it (bench/gpu_overhead.py).
        print(wrapper_cost_line(_own_cpu_s() - cpu_before, time.time() - started), flush=True)
        return Observed(code, list(signals.received), hung, watch, started)


def _nothing_to_train() -> Observed:
    now = time.time()
    return Observed(0, [], False, ProgressWatch(Path(os.devnull), now, re.compile("(?!)")), now)


def wrapper_cost_line(cpu_s: float, wall_s: float) -> str:
    """The log line that says what watching the trainer cost (bench/gpu_overhead.py reads it)."""
    return f"[swiftslurm] wrapper: {cpu_s:.2f} CPU-s while training ran {wall_s:.0f} s"


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # this process only, not the trainer (a child)
    return usage.ru_utime + usage.ru_stime


def _finish_uploads(sync: NodeSync, plan: JobPlan, where: SlurmEnv, run_dir: Path, decision: decide.Decision) -> None:
    """Wait (bounded) for this attempt's uploads and put the outcome into status.json. Before a requeue the
    wait ends ahead of SLURM's end time, or the job would be killed before it is requeued; what is left is
    uploaded by the next attempt."""
    budget = plan.storage.wait_at_exit_s if plan.storage else 0.0
    end_time = _end_time(where) if decision.action is decide.Action.REQUEUE else None
    if end_time is not None:
        budget = min(budget, end_time - time.time() - KILL_MARGIN_S)
    sync.drain(budget)
    records.update_status(run_dir, storage=sync.state())


def _log_to_stdout() -> None:
    """swiftslurm's own log lines (uploads, restores) go to the node's stdout: SLURM's and submitit's log."""
    logger = logging.getLogger("swiftslurm")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _saved_since(plan: JobPlan, since: float) -> bool:
    """Whether a checkpoint was committed after ``since`` (the save the stop signal asked for)."""
    newest, _ = newest_committed(plan.output_dir)
    manifest = read_manifest(newest) if newest else None
    return bool(manifest and manifest.get("committed_at", 0) >= since)


def _hung(watch: ProgressWatch, plan: JobPlan, now: float) -> bool:
    limit = plan.resilience.hang_timeout_s if watch.first_step_at else plan.resilience.startup_timeout_s
    return watch.stalled_for(now) > limit


def _signal_reason(observed: Observed, where: SlurmEnv, plan: JobPlan) -> decide.Reason | None:
    """USR2: preempted or timed out, by how close the time limit was. A TERM without USR2 is a cancel,
    unless it came at the time limit itself (SLURM's warning was missed): that is a time-out too."""
    if not observed.signals:
        return None
    end_time = _end_time(where)
    usr2 = next((t for s, t in observed.signals if s == SAVE_SIGNAL), None)
    if usr2 is not None:
        return decide.classify_signal(usr2, end_time, plan.resilience.signal_lead_s)
    first = observed.signals[0][1]
    if end_time is not None and decide.classify_signal(first, end_time, 0) is decide.Reason.TIMED_OUT:
        return decide.Reason.TIMED_OUT
    return None


def _end_time(where: SlurmEnv) -> float | None:
    if not where.in_slurm or where.job_id is None:
        return None
    try:
        return slurm_cli.job_end_time(where.job_id)
    except SwiftSlurmError:
        return None


def _conclude(
    plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt: str, resume: ResumePoint, observed: Observed
) -> decide.Decision:
    """Leader: classify the attempt, fold it into the run's history, decide, and write it all down."""
    signal_reason = _signal_reason(observed, where, plan)
    # scancel / Ctrl-C, or `swiftslurm cancel` (its mark also covers a stop that looked like a preemption)
    cancelled = (bool(observed.signals) and signal_reason is None) or is_cancelled(run_dir)
    hosts = where.hosts or (socket.gethostname(),)
    failed = _failed_host(attempt_dir(run_dir, attempt), hosts, observed)
    facts = decide.AttemptFacts(
        exit_code=observed.exit_code,
        signal_reason=signal_reason,
        steps_done=max(0, (observed.watch.step or 0) - resume.step),
        reached_last_step=_reached_last_step(plan),
        hung=observed.hung,
        log_tail=tail(_log(run_dir, attempt, where)),
        elapsed_s=time.time() - observed.started,
        failed_host=failed,
    )
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


def _close_lost_attempt(run_dir: Path, plan: JobPlan, where: SlurmEnv) -> NodeResult | None:
    """Record an attempt that ended without a record (its node died, or SLURM killed everything), and
    stop here if the budget says so. Marks this attempt as open."""
    attempt = attempt_id(where)
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
    return NodeResult(0, socket.gethostname(), 1, "", None, decision.action.value, decision.why)


def _preflight(run_dir: Path, where: SlurmEnv, attempt: str) -> str | None:
    """Run the checks on every node; node 0 gets the first failure of the whole allocation (None: passed)."""
    result = preflight.run(preflight.context(run_dir, where, attempt, None, None))
    print(preflight.show(result), flush=True)
    return result.first_failure() if isinstance(result, preflight_checks.Report) else None


def _stop_after_preflight(run_dir: Path, where: SlurmEnv, attempt: str, failure: str) -> NodeResult:
    """Record the failed preflight as this attempt (no training ran, no requeue) and tell the other nodes."""
    why = f"preflight failed: {failure} (report: {preflight_report(run_dir, attempt)})"
    reason = decide.Reason.INFRA.value
    now = round(time.time(), 3)
    hosts = list(where.hosts) or [socket.gethostname()]
    record: dict[str, object] = {"attempt": attempt, "job_id": where.job_id, "hosts": hosts}
    record |= {"start": now, "end": now, "preflight": "failed", "progressed": False, "reason": reason}
    records.append_attempt(run_dir, {**record, "decision": decide.Action.STOP.value, "why": why})
    records.write_status(run_dir, "failed", reason=reason, why=why, job_id=where.job_id, attempt=attempt)
    chosen = resume_file(run_dir, attempt)
    chosen.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(chosen, {"checkpoint": None, "step": 0, "error": why})  # the others stop waiting
    print(f"[swiftslurm] attempt {attempt}: {why}", flush=True)
    return NodeResult(0, socket.gethostname(), 1, "", None, decide.Action.STOP.value, why)


def _requeue(where: SlurmEnv, plan: JobPlan, decision: decide.Decision) -> NoReturn:
    """Requeue this job (same id); exclusions and back-off are set on it once it is pending again."""
    # `scontrol requeue` TERMs this very step; the update that follows must still get through.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    job = str(where.job_id)
    try:
        slurm_cli.run(["scontrol", "requeue", job])
    except SwiftSlurmError as err:
        if "pending" not in str(err).lower():  # SLURM requeued it already (node failure): carry on
            raise
    updates = []
    if decision.exclude_hosts:
        # ExcNodeList replaces the job's list: keep the hosts the cluster config excluded too.
        configured = expand_hostlist(plan.slurm.exclude) if plan.slurm and plan.slurm.exclude else []
        updates.append(f"ExcNodeList={','.join(sorted({*configured, *decision.exclude_hosts}))}")
    if decision.delay_s > 0:
        updates.append(f"StartTime=now+{int(decision.delay_s)}")
    if updates:
        slurm_cli.run(["scontrol", "update", f"JobId={job}", *updates])
    # Wait here for SLURM to end this attempt (TERM is ignored, KILL follows after KillWait): returning
    # would let submitit record a result, and its waiter would take the requeued job for finished.
    while True:
        time.sleep(60)


def submitit_entry(run_dir: str) -> NodeResult:
    """What submitit pickles and runs on every node: like run_node, but a stopped run raises."""
    result = run_node(run_dir)
    if result.decision == decide.Action.STOP.value:
        raise TrainingFailed(f"run stopped: {result.why}")
    return result


def exit_code(result: NodeResult) -> int:
    """Process exit status for `python -m swiftslurm.node`: non-zero only when the run stopped."""
    return 1 if result.decision == decide.Action.STOP.value else 0
