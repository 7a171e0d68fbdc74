"""Pure renderings of a plan: the ms-swift command line and the sbatch script.

Every value that reaches a shell is quoted with shlex.quote; #SBATCH values are checked, because sbatch
reads those lines itself and a newline or double quote there cannot be escaped.
"""

from __future__ import annotations

import shlex

from swiftslurm import container
from swiftslurm.errors import ConfigError
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.layout import LOGS, SLURM_LOG
from swiftslurm.slurm_env import JOB_RUN_ENV, may_shrink

NODE_ENTRY = ("-m", "swiftslurm.node")  # what srun runs on every node: python -m swiftslurm.node RUN_DIR


def swift_command(plan: JobPlan, extra: tuple[str, ...] = ()) -> list[str]:
    """argv of the training command, e.g. [.../swift, sft, --model, ..., *extra]."""
    return [plan.executable, plan.command, *plan.swift_argv, *extra]


def display_command(argv: list[str]) -> str:
    """A copy-pasteable shell line, one argument pair per line for readability."""
    head, args = argv[:2], argv[2:]
    lines = [shlex.join(head)]
    for token in args:
        if token.startswith("--"):
            lines.append(shlex.quote(token))
        else:
            lines[-1] += " " + shlex.quote(token)
    return " \\\n    ".join(lines)


def sbatch_value(name: str, value: object) -> str:
    """One #SBATCH value; sbatch honours double quotes there but has no escape for them."""
    text = str(value)
    if any(c in text for c in '"\n\r'):
        raise ConfigError(
            f"{name}={text!r} contains a double quote or newline, which an #SBATCH line cannot carry. "
            "HINT: choose a value without them."
        )
    return f'"{text}"' if any(c.isspace() or c in "'\\$`#;&|" for c in text) else text


def sbatch_directives(plan: JobPlan) -> list[tuple[str, str]]:
    """(option, value) pairs; the same facts become submitit parameters in submit.py."""
    spec = plan.slurm
    if spec is None:
        raise ConfigError("This run uses the local scheduler; there is no sbatch script. HINT: add +cluster=NAME.")
    pairs: list[tuple[str, object | None]] = [
        ("job-name", spec.job_name),
        ("nodes", plan.allocation_nodes),
        ("ntasks-per-node", 1),  # one wrapper per node; it starts the node's ranks
        ("cpus-per-task", spec.cpus_per_task),
        ("gpus-per-node", spec.gpus),
        ("mem", f"{spec.mem_gb}G" if spec.mem_gb else None),
        ("partition", spec.partition),
        ("account", spec.account),
        ("qos", spec.qos),
        ("constraint", spec.constraint),
        ("exclude", spec.exclude),
        ("time", spec.time),
        ("signal", spec.signal),
        ("chdir", plan.run_dir),
        # Relative to --chdir: a '%' in the run dir would otherwise be read as a filename pattern.
        ("output", f"{LOGS}/{SLURM_LOG}"),
        ("open-mode", "append"),  # a requeued job keeps its earlier output
        ("requeue", None),
        *((("no-kill", None),) if keeps_nodes_after_a_loss(plan) else ()),
        *spec.extra,
    ]
    flags = ("requeue", "no-kill")
    return [(k, "" if v is None else str(v)) for k, v in pairs if v is not None or k in flags]


def keeps_nodes_after_a_loss(plan: JobPlan) -> bool:
    """Whether the job and its step survive the loss of a node (`--no-kill`): only with spares to take its place
    (`resilience.spare_nodes`). Under `--no-kill` srun ignores `--kill-on-bad-exit`: the wrappers end the step
    themselves (every follower exits 0; node 0 publishes its word, or its batch script ends the job)."""
    return plan.resilience.spare_nodes > 0


def srun_flags(plan: JobPlan) -> list[str]:
    """The flags of the step every node's wrapper runs in (job.sbatch and submitit alike)."""
    return ["--kill-on-bad-exit=1", *(["--no-kill"] if keeps_nodes_after_a_loss(plan) else [])]


def render_sbatch(plan: JobPlan) -> str:
    """job.sbatch: submit by hand with `sbatch RUN_DIR/job.sbatch` (same behaviour as swiftslurm's submit)."""
    lines = [
        "#!/bin/bash",
        "# shellcheck disable=SC1090,SC1091  # cluster.setup may source site files shellcheck cannot see",
        f"# swiftslurm run {plan.run_name}: generated from plan.json in this directory.",
    ]
    for option, value in sbatch_directives(plan):
        lines.append(f"#SBATCH --{option}={sbatch_value(option, value)}" if value else f"#SBATCH --{option}")
    # -u only after cluster.setup: module and venv/conda activation scripts read unset variables.
    lines += ["", "set -eo pipefail", *plan.setup, "set -u", *job_run_lines(), *task_count_lines(plan), ""]
    node = [*container.python_argv(plan), *NODE_ENTRY, plan.run_dir]
    srun = ["srun", "--ntasks-per-node=1", *srun_flags(plan), "--unbuffered", *container.srun_args(plan), *node]
    lines.append(shlex.join(srun))
    return "\n".join(lines) + "\n"


def job_run_lines() -> list[str]:
    """Batch-script lines that name this run of the job once, for every node: `<job id>@<batch start>`
    (slurm_env.JOB_RUN_ENV, the nonce of rundir/lease.py). The batch script runs once per run of the job, a
    requeue runs it again, so the name changes with each; without it every node's wrapper asked `scontrol
    show job` for the start time, one controller call per node per attempt. Assigned, then exported: `export
    X="$(...)"` would hide a failing command's status (shellcheck SC2155)."""
    return [
        "# This run of the job, the same on every node (the resume point's nonce; no scontrol call per node).",
        f'{JOB_RUN_ENV}="${{SLURM_JOB_ID:-}}@$(date +%s.%N)"',
        f"export {JOB_RUN_ENV}",
    ]


def task_count_lines(plan: JobPlan) -> list[str]:
    """Batch-script lines that make srun start one task per node of *this* allocation, for a run that may
    resume on fewer nodes (`resilience.min_nodes`). sbatch stores SLURM_NTASKS / SLURM_NPROCS in the job's
    environment at submission, and a requeued job keeps them after `scontrol update NumNodes NumTasks`: srun
    then asks for 3 tasks on 2 nodes ("More processors requested than permitted", or 2 tasks on one node).
    Nothing for other runs: their allocation is the submitted one."""
    if not may_shrink(plan):
        return []
    return [
        "# A requeue may have shrunk the job (resilience.min_nodes): one task per node of this allocation.",
        'export SLURM_NTASKS="$SLURM_JOB_NUM_NODES" SLURM_NPROCS="$SLURM_JOB_NUM_NODES"',
    ]
