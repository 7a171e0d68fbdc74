"""The on-node wrapper: plan.json + SLURM environment -> ms-swift on this node -> what happens next.

Every node: pick the newest committed checkpoint, start ms-swift with USR2 ignored by `swift`/torchrun,
record stop signals and forward USR2 to the training workers (they save at the current step and exit),
and write this node's result. Node 0 (the leader) also watches progress (a hung run is killed), then
classifies how the attempt ended, decides (decide.py, pure) and acts: done, stop, or requeue the same
SLURM job (excluding failed hosts, after a back-off). Other nodes always exit 0: with
`srun --kill-on-bad-exit` a failing follower would kill the leader before it has decided.

The entry points live here; the attempt itself, phase by phase, is attempt.py: resume.py (agree on the
resume point), watch.py (run and watch the trainer), conclude.py (classify, decide, record), requeue.py.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from swiftslurm.errors import NodeError
from swiftslurm.node import attempt, decide
from swiftslurm.node.attempt import NodeResult, attempt_id
from swiftslurm.node.conclude import record_refusal
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.layout import plan_file
from swiftslurm.signals import SignalLog, ignore_from_now_on
from swiftslurm.slurm_env import SlurmEnv, slurm_hostnames

__all__ = ["NodeResult", "TrainingFailed", "attempt_id", "exit_code", "load_plan", "run_node", "submitit_entry"]


class TrainingFailed(RuntimeError):
    """The run stopped for good (raised for submitit, which then marks the job failed)."""


def load_plan(run_dir: Path) -> JobPlan:
    """The plan this run dir was prepared with, checked against its recorded digest before anything runs."""
    path = plan_file(run_dir)
    if not path.is_file():
        raise NodeError(
            f"{path} does not exist. HINT: prepare the run directory with `python -m swiftslurm ... "
            "dry_run=true run_dir=DIR` (it writes plan.json and job.sbatch), then submit that directory."
        )
    return JobPlan.load_checked(run_dir)


def run_node(run_dir_arg: str, signals: SignalLog | None = None) -> NodeResult:
    """Run this node's share of the run until the run is done, stopped, or requeued.

    The wrapper owns the stop signals from here on (``signals``, installed already, or installed here until
    it returns): one that comes before training ends the attempt as signalled, during training it makes the
    trainer save, during the upload drain it shortens the drain; the leader alone decides about a requeue."""
    if signals is None:
        with SignalLog().installed() as installed:
            return run_node(run_dir_arg, installed)
    run_dir = Path(run_dir_arg).resolve()
    _log_to_stdout()
    where = SlurmEnv.from_environ(os.environ, slurm_hostnames)  # SLURM's own node order: node i is hosts[i]
    try:
        plan = load_plan(run_dir)
    except NodeError as err:  # a changed plan.json: the run dir says why, not only the job's log
        record_refusal(run_dir, where, attempt_id(where), str(err))
        raise
    return attempt.run(run_dir, plan, where, signals)


def submitit_entry(run_dir: str) -> NodeResult:
    """What submitit pickles and runs on every node: like run_node, but a stopped run raises.

    submitit installed its own handlers before calling this: on USR2 it would `scontrol requeue` the job
    itself and exit, whatever this attempt is doing. The wrapper's replace them, and once this returns the stop
    signals are ignored (submitit then only writes the result), so submitit never requeues by itself and a late
    signal cannot kill the finished process (signals.ignore_from_now_on)."""
    signals = SignalLog()
    signals.install()
    try:
        result = run_node(run_dir, signals)
    finally:
        ignore_from_now_on()  # submitit only writes the result from here, then the interpreter shuts down
    if result.decision == decide.Action.STOP.value:
        raise TrainingFailed(f"run stopped: {result.why}")
    return result


def exit_code(result: NodeResult) -> int:
    """Process exit status for `python -m swiftslurm.node`: non-zero only when the run stopped."""
    return 1 if result.decision == decide.Action.STOP.value else 0


def _log_to_stdout() -> None:
    """swiftslurm's own log lines (uploads, restores) go to the node's stdout: submitit's <job>_<node>_log.out, or
    SLURM's logs/slurm-<job>.out for a job submitted by hand (rundir/layout.py); `swiftslurm logs` shows them."""
    logger = logging.getLogger("swiftslurm")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
