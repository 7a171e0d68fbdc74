"""The on-node wrapper: plan.json + SLURM environment -> ms-swift on this node -> an attempt record."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

from swiftslurm.errors import NodeError
from swiftslurm.node.checkpoint import newest_checkpoint
from swiftslurm.node.launch import Trainer
from swiftslurm.node.slurm_env import SlurmEnv, check_allocation, rank_env
from swiftslurm.plan import JobPlan
from swiftslurm.render import swift_command
from swiftslurm.tiny import build_tiny_assets

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class NodeResult:
    node_rank: int
    hostname: str
    exit_code: int
    log_path: str
    resumed_from: str | None


class TrainingFailed(RuntimeError):
    """ms-swift exited non-zero on this node (raised for submitit, which then marks the job failed)."""


def load_plan(run_dir: Path) -> JobPlan:
    path = run_dir / "plan.json"
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
    """Run this node's share of the training and return how it ended."""
    run_dir = Path(run_dir_arg).resolve()
    plan = load_plan(run_dir)
    where = SlurmEnv.from_environ(os.environ)
    check_allocation(where, plan)
    if plan.tiny_cache:  # built on the login side already; this only checks (or builds if submitted by hand)
        build_tiny_assets(Path(plan.tiny_cache))
    resume = newest_checkpoint(plan.output_dir)
    extra = ("--resume_from_checkpoint", str(resume)) if resume else ()
    env = {**os.environ, **dict(plan.env), **rank_env(where, plan)}
    log_path = run_dir / "logs" / attempt_id(where) / f"node{where.node_id}.log"
    started = time.time()
    trainer = Trainer(swift_command(plan, extra), env, log_path, cwd=run_dir)
    code = _wait_forwarding_signals(trainer)
    result = NodeResult(where.node_id, socket.gethostname(), code, str(log_path), str(resume) if resume else None)
    if where.node_id == 0:
        _record_attempt(run_dir, where, result, started)
    return result


def _wait_forwarding_signals(trainer: Trainer) -> int:
    """Wait for the trainer; a TERM/INT sent to this wrapper (scancel, Ctrl-C) is passed to its group."""

    def forward(signum: int, _frame: FrameType | None) -> None:
        trainer.signal_group(signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED_SIGNALS}
    try:
        return trainer.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _record_attempt(run_dir: Path, where: SlurmEnv, result: NodeResult, started: float) -> None:
    """Append one line per attempt to attempts.jsonl (a single small write: appends do not interleave)."""
    line = {
        "attempt": attempt_id(where),
        "job_id": where.job_id,
        "restart_count": where.restart_count,
        "hosts": list(where.hosts) or [result.hostname],
        "start": round(started, 3),
        "end": round(time.time(), 3),
        **{k: v for k, v in asdict(result).items() if k in ("exit_code", "resumed_from")},
    }
    with open(run_dir / "attempts.jsonl", "a") as out:
        out.write(json.dumps(line) + "\n")


def submitit_entry(run_dir: str) -> NodeResult:
    """What submitit pickles and runs on every node: like run_node, but a failure raises."""
    result = run_node(run_dir)
    if result.exit_code != 0:
        raise TrainingFailed(
            f"ms-swift exited with code {result.exit_code} on node {result.node_rank} ({result.hostname}); "
            f"see {result.log_path}"
        )
    return result
