"""`python -m swiftslurm.submit.preflight RUN_DIR [--timeout S]`: the pre-launch checklist on the run's allocation.

RUN_DIR is a prepared run directory (`python -m swiftslurm ... dry_run=true run_dir=RUN_DIR`). On SLURM this
writes RUN_DIR/preflight/job.sbatch, which asks for the training job's allocation (nodes, partition, GPUs,
account, ...) with a short time limit and runs only `python -m swiftslurm.preflight.gather` on every node (in
the run's container, if it has one), submits it, waits for it and prints node 0's report. With the local
scheduler the checks run here. Exit status: 0 all passed, 1 a check failed, 2 the checks could not run. What is
checked: docs/operations.md#preflight.
"""

from __future__ import annotations

import argparse
import math
import os
import shlex
import sys
import time
from pathlib import Path

from swiftslurm import container, errors
from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import NodeError, SubmitError, SwiftSlurmError
from swiftslurm.plan import JobPlan
from swiftslurm.preflight import checks as pc
from swiftslurm.preflight import gather as node_preflight
from swiftslurm.render import sbatch_directives, sbatch_value
from swiftslurm.rundir.jsonio import peek_json
from swiftslurm.rundir.layout import PREFLIGHT, SBATCH, SLURM_LOG, plan_file, preflight_dir, preflight_report, slurm_log
from swiftslurm.slurm_env import SlurmEnv

POLL_S = 2.0
# Directives of the training job that a checks-only job must not copy: its own name, time, log and no requeue.
NOT_COPIED = {"job-name", "time", "signal", "output", "open-mode", "requeue"}


def time_limit_min(timeout_s: float) -> int:
    """Room for the check-in, the all-reduce (one timeout each) and the start of Python on every node."""
    return max(3, math.ceil((2 * timeout_s + 120) / 60))


def render_preflight_sbatch(plan: JobPlan, timeout_s: float) -> str:
    """RUN_DIR/preflight/job.sbatch: the plan's allocation, running only the checks (pure; values quoted)."""
    if plan.slurm is None:
        raise SubmitError("This run uses the local scheduler: preflight runs here, without sbatch.")
    pairs = [(k, v) for k, v in sbatch_directives(plan) if k not in NOT_COPIED]
    pairs = [
        ("job-name", f"preflight-{plan.slurm.job_name}"),
        *pairs,
        ("time", str(time_limit_min(timeout_s))),
        ("output", f"{PREFLIGHT}/{SLURM_LOG}"),  # relative to --chdir, the run dir
    ]
    lines = ["#!/bin/bash", f"# swiftslurm preflight of run {plan.run_name}: generated from plan.json."]
    lines += [f"#SBATCH --{k}={sbatch_value(k, v)}" if v else f"#SBATCH --{k}" for k, v in pairs]
    lines += ["", "set -eo pipefail", *plan.setup, "set -u", ""]
    # In the run's container, as the wrapper would be: what is checked is where training runs.
    node = [*container.python_argv(plan), "-m", "swiftslurm.preflight.gather", plan.run_dir]
    node += ["--port-base", str(plan.master_port_base), "--timeout", str(timeout_s)]
    # Every node must finish its checks: --kill-on-bad-exit=0 so node 0's failure does not end the others.
    srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--unbuffered", *container.srun_args(plan), *node]
    return "\n".join([*lines, shlex.join(srun)]) + "\n"


def submit_and_wait(plan: JobPlan, timeout_s: float) -> tuple[str, pc.Report | None]:
    """Submit the checks-only job; return its id and node 0's report (None if node 0 wrote none)."""
    folder = preflight_dir(plan.run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / SBATCH
    script.write_text(render_preflight_sbatch(plan, timeout_s))
    job_id = slurm_cli.submit_batch(script)
    print(f"submitted preflight job {job_id} ({plan.topology.nodes} node(s)); waiting for it", flush=True)
    _wait_for(job_id)
    return job_id, read_report(preflight_report(plan.run_dir, job_id))


def _wait_for(job_id: str) -> None:
    """Until the job has left the queue (pending time included: the allocation may be busy)."""
    while slurm_cli.job_alive(job_id):
        time.sleep(POLL_S)


def read_report(path: Path) -> pc.Report | None:
    """Node 0's report.json; None while there is none (or it cannot be read)."""
    data = peek_json(path)
    try:
        return pc.Report.from_dict(data) if data is not None else None
    except ValueError:
        return None


def run_here(plan: JobPlan, run_dir: Path, timeout_s: float) -> pc.Report:
    """The local scheduler: one node, this machine."""
    where = SlurmEnv.local(os.environ)
    ctx = node_preflight.context(run_dir, where, f"local-{os.getpid()}", None, timeout_s)
    result = node_preflight.run(ctx)
    assert isinstance(result, pc.Report)  # node 0 of one node
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m swiftslurm.submit.preflight", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a prepared run directory (python -m swiftslurm ... dry_run=true)")
    parser.add_argument("--timeout", type=float, help="seconds for the rendezvous and the all-reduce (default: plan)")
    args = parser.parse_args(argv)
    run_dir = Path(args.run_dir).resolve()
    try:
        plan = _load(run_dir)
        timeout_s = args.timeout or plan.preflight.timeout_s
        if plan.slurm is None:
            report = run_here(plan, run_dir, timeout_s)
        else:
            job_id, found = submit_and_wait(plan, timeout_s)
            if found is None:
                log = slurm_log(preflight_dir(run_dir), job_id)
                code = errors.report(f"preflight job {job_id} left no report. Its output ({log}):")
                print(_tail(log), file=sys.stderr)
                return code
            report = found
    except SwiftSlurmError as err:
        return errors.report(err)
    print(pc.render_table(report))
    print(f"report: {preflight_report(run_dir, report.attempt)}")
    return 0 if report.ok else 1


def _load(run_dir: Path) -> JobPlan:
    path = plan_file(run_dir)
    if not path.is_file():
        raise NodeError(
            f"{path} does not exist. HINT: prepare the run directory first: "
            f"`python -m swiftslurm ... dry_run=true run_dir={run_dir}`."
        )
    return JobPlan.load(path)


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as err:
        return f"({err})"


if __name__ == "__main__":
    sys.exit(main())
