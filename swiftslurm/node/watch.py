"""Run the trainer once and watch it: forward stop signals to its workers, kill it when it hangs or outlives
its save, and hand each newly committed checkpoint to the background uploader (leader)."""

from __future__ import annotations

import os
import re
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swiftslurm.node.ckpt.checkpoint import ResumePoint, newest_committed, read_manifest
from swiftslurm.node.engines.registry import engine_for
from swiftslurm.node.launch import Trainer
from swiftslurm.node.lease import TOKEN_ENV
from swiftslurm.node.progress import ProgressWatch
from swiftslurm.node.signals import SAVE_SIGNAL, SignalLog
from swiftslurm.node.slurm_env import SlurmEnv, rank_env
from swiftslurm.node.storage.sync import NodeSync
from swiftslurm.node.timeline import TIMELINE_ENV
from swiftslurm.plan import JobPlan
from swiftslurm.render import swift_command
from swiftslurm.rundir import attempt_dir, node_log, trainer_timeline

POLL_S = 0.5
REFORWARD_S = 5.0  # a worker that had not installed its handler yet gets the signal again


@dataclass
class Observed:
    """How one trainer run went, as seen from its node."""

    exit_code: int
    signals: list[tuple[int, float]]
    hung: bool
    watch: ProgressWatch
    started: float


def node_log_path(run_dir: Path, attempt: str, where: SlurmEnv) -> Path:
    return node_log(attempt_dir(run_dir, attempt), where.node_id)


def trainer_env(plan: JobPlan, where: SlurmEnv, run_dir: Path, lease_token: int | None = None) -> dict[str, str]:
    return {
        **os.environ,
        **dict(plan.env),
        **rank_env(where, plan),
        "SWIFTSLURM_RUN_DIR": str(run_dir),
        "SWIFTSLURM_KEEP_CHECKPOINTS": str(trainer_keep(plan)),
        "SWIFTSLURM_PLAN_IDENTITY": plan.identity(),
        **({TOKEN_ENV: str(lease_token)} if lease_token is not None else {}),
    }


def trainer_keep(plan: JobPlan) -> int:
    """`keep_checkpoints` as the trainer's commit hook applies it. With object storage the leader's NodeSync
    owns local retention, since only it knows what is uploaded: the trainer then prunes nothing."""
    return 0 if plan.storage is not None else plan.keep_checkpoints


def train(
    plan: JobPlan,
    where: SlurmEnv,
    run_dir: Path,
    attempt: str,
    resume: ResumePoint,
    sync: NodeSync | None,
    signals: SignalLog,
    lease_token: int | None = None,
) -> Observed:
    """Run ms-swift once; forward stop signals (recorded in ``signals``, the wrapper's) to its workers; the
    leader kills it if it hangs and hands each newly committed checkpoint to the background uploader."""
    engine = engine_for(plan.launcher)
    extra = engine.resume_args(resume.checkpoint, plan.swift_argv) if resume.checkpoint else ()
    log_path = node_log_path(run_dir, attempt, where)
    started = time.time()
    cpu_before = _own_cpu_s()
    watch = ProgressWatch(engine.progress.path(plan.output_dir, log_path), started, engine.progress.pattern)
    env = trainer_env(plan, where, run_dir, lease_token) | {TIMELINE_ENV: str(trainer_timeline(log_path.parent))}
    trainer = Trainer(swift_command(plan, extra), env, log_path, cwd=run_dir)
    watcher = _Watcher(plan, where, trainer, engine.stop_recipients, signals, watch, sync)
    code = watcher.until_exit()
    # What watching costs: the trainer's cores are not this process's, but say it (bench/gpu_overhead.py).
    print(wrapper_cost_line(_own_cpu_s() - cpu_before, time.time() - started), flush=True)
    return Observed(code, list(signals.received), watcher.hung, watch, started)


@dataclass
class _Watcher:
    """The main loop's state while the trainer runs; the signal handler only records, this does the work."""

    plan: JobPlan
    where: SlurmEnv
    trainer: Trainer
    stop_recipients: Callable[[int], list[int]]  # the engine's: who may get the stop signal
    signals: SignalLog
    watch: ProgressWatch
    sync: NodeSync | None
    hung: bool = False
    forwarded_at: float = 0.0

    def until_exit(self) -> int:
        while (code := self.trainer.poll()) is None:
            time.sleep(POLL_S)
            self.tick(time.time())
        return code

    def tick(self, now: float) -> None:
        self.forward_stop(now)
        self.watch.poll(now)
        if self.sync is not None:
            self.sync.poll(now)
        self.kill_if_hung(now)
        self.kill_if_save_overdue(now)

    def forward_stop(self, now: float) -> None:
        received = self.signals.received
        if received and now - self.forwarded_at >= REFORWARD_S and not _saved_since(self.plan, received[0][1]):
            # Whatever stop signal came (USR2 from SLURM, TERM from scancel), the workers get USR2: it
            # makes them save and exit, and torchrun ignores it (TERM would make it SIGKILL them 30 s on).
            # Re-sent until a checkpoint is committed, but only to processes that handle it and have not
            # had it yet (a worker still loading); a second one would kill a rank that saved and is exiting.
            self.trainer.forward(SAVE_SIGNAL, self.stop_recipients)
            self.forwarded_at = now

    def kill_if_hung(self, now: float) -> None:
        if self.where.node_id == 0 and not self.signals.received and _hung(self.watch, self.plan, now):
            self.hung = True
            self.trainer.kill()

    def kill_if_save_overdue(self, now: float) -> None:
        received = self.signals.received
        if received and now - received[0][1] > self.plan.resilience.signal_lead_s:
            # The save had its whole lead time; something (e.g. torchrun's exit barrier waiting for a
            # peer that is gone) keeps the trainer alive: end it rather than hold the allocation.
            self.trainer.kill()


def nothing_to_train(signals: list[tuple[int, float]] | None = None, started: float | None = None) -> Observed:
    """An attempt that started no trainer: its run was complete, or a stop signal (``signals``) came first."""
    now = time.time() if started is None else started
    return Observed(0, list(signals or []), False, ProgressWatch(Path(os.devnull), now, re.compile("(?!)")), now)


def wrapper_cost_line(cpu_s: float, wall_s: float) -> str:
    """The log line that says what watching the trainer cost (bench/gpu_overhead.py reads it)."""
    return f"[swiftslurm] wrapper: {cpu_s:.2f} CPU-s while training ran {wall_s:.0f} s"


def _own_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # this process only, not the trainer (a child)
    return usage.ru_utime + usage.ru_stime


def _saved_since(plan: JobPlan, since: float) -> bool:
    """Whether a checkpoint was committed after ``since`` (the save the stop signal asked for)."""
    newest, _ = newest_committed(plan.output_dir)
    manifest = read_manifest(newest) if newest else None
    return bool(manifest and manifest.get("committed_at", 0) >= since)


def _hung(watch: ProgressWatch, plan: JobPlan, now: float) -> bool:
    limit = plan.resilience.hang_timeout_s if watch.first_step_at else plan.resilience.startup_timeout_s
    return watch.stalled_for(now) > limit
