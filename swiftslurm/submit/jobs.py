"""Writing the run directory, and submitting it through submitit (SLURM, or this machine).

Submissions go through submitit; every other SLURM command goes through ``swiftslurm.slurm``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from swiftslurm import container
from swiftslurm import slurm as slurm_cli
from swiftslurm.errors import ConfigError, SubmitError, SwiftSlurmError
from swiftslurm.plan import JobPlan, plan_digest
from swiftslurm.planning.validate import NO_TIME_LIMIT
from swiftslurm.render import job_run_lines, keeps_nodes_after_a_loss, srun_flags, task_count_lines
from swiftslurm.rundir import layout as rundir
from swiftslurm.rundir import records
from swiftslurm.rundir.jsonio import write_text_atomic

if TYPE_CHECKING:
    import submitit

T = TypeVar("T")


def write_atomic(path: Path, text: str, durable: bool = True) -> None:
    """Write via a temp file in the same directory and rename: readers see the old or the new file. Not
    ``durable``: no fsync; the caller syncs once for many files (a sweep's run dirs) before submitting."""
    write_text_atomic(path, text, durable)


def set_aside(run_dir: Path) -> Path:
    """Move everything of the run dir's earlier run into replaced/<UTC time>/ (renames: nothing is copied)."""
    kept = run_dir / rundir.REPLACED / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept.mkdir(parents=True, exist_ok=True)
    for entry in run_dir.iterdir():
        if entry.name != rundir.REPLACED:
            entry.rename(kept / entry.name)
    return kept


def write_run_dir(
    plan: JobPlan, config_yaml: str, sbatch: str | None, replaces_earlier: bool = False, durable: bool = True
) -> Path:
    """Write a checked run dir (launch.check_run_dir: ``sbatch`` is job.sbatch's text; ``replaces_earlier``:
    the earlier run it holds is set aside first). It is RUN_DIR_MODE whatever the umask (the plan refused
    every secret, but logs and checkpoints are the user's own); plan.sha256 lets the nodes check that they
    run this plan."""
    run_dir = Path(plan.run_dir)
    if replaces_earlier:
        set_aside(run_dir)
    make_run_dir(run_dir)
    write_atomic(run_dir / rundir.CONFIG, config_yaml, durable)
    plan_text = plan.to_json()
    write_atomic(rundir.plan_file(run_dir), plan_text, durable)
    write_atomic(rundir.plan_digest_file(run_dir), plan_digest(plan_text) + "\n", durable)
    if sbatch is not None:
        write_atomic(run_dir / rundir.SBATCH, sbatch, durable)
    if plan.container is not None and plan.container.runtime == "oci":
        container.write_oci_bundle(plan)
    return run_dir


def make_run_dir(run_dir: Path) -> None:
    """The run dir and logs/, RUN_DIR_MODE whatever the umask; a path that cannot be one is refused, not a traceback
    (nothing was written: the first write is this mkdir)."""
    try:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # never wider than the owner's, even for a moment
        os.chmod(run_dir, rundir.RUN_DIR_MODE)
        rundir.logs_dir(run_dir).mkdir(exist_ok=True)
    except FileExistsError as err:
        raise ConfigError(
            f"run_dir {run_dir} is a file, not a directory. HINT: pass another run_dir=PATH, or move the file away."
        ) from err
    except NotADirectoryError as err:
        file = next((p for p in run_dir.parents if p.is_file()), run_dir.parent)
        raise ConfigError(
            f"run_dir {run_dir} lies under {file}, which is a file. HINT: pass a run_dir=PATH under a directory."
        ) from err
    except OSError as err:
        raise ConfigError(
            f"run_dir {run_dir} cannot be created here ({err.strerror}): it must be on a writable filesystem "
            "the nodes share. HINT: pass run_dir=PATH on one (e.g. under $HOME or your scratch space)."
        ) from err


def executor_parameters(plan: JobPlan) -> dict[str, Any]:
    """submitit parameters for the same allocation job.sbatch asks for (see render.sbatch_directives)."""
    if plan.slurm is None:
        return {"timeout_min": 24 * 60, "tasks_per_node": 1, "nodes": 1, "name": plan.run_name}
    spec = plan.slurm
    extra: dict[str, Any] = {"requeue": True, "open-mode": "append", **dict(spec.extra)}
    if keeps_nodes_after_a_loss(plan):
        extra["no-kill"] = True
    if spec.gpus:
        extra["gpus-per-node"] = spec.gpus
    if spec.time_min == NO_TIME_LIMIT:
        extra["time"] = spec.time  # submitit writes --time from timeout_min; its extras win
    params: dict[str, Any] = {
        "name": spec.job_name,
        "nodes": plan.allocation_nodes,
        "tasks_per_node": 1,
        "timeout_min": spec.time_min,
        "slurm_partition": spec.partition,
        "slurm_signal_delay_s": int(spec.signal.split("@")[1]),
        "slurm_setup": [*plan.setup, *job_run_lines(), *task_count_lines(plan)],
        "slurm_additional_parameters": extra,
        "slurm_srun_args": [*srun_flags(plan), *container.srun_args(plan)],
    }
    optional = {
        "cpus_per_task": spec.cpus_per_task,
        "mem_gb": spec.mem_gb,
        "slurm_account": spec.account,
        "slurm_qos": spec.qos,
        "slurm_constraint": spec.constraint,
        "slurm_exclude": spec.exclude,
    }
    return params | {k: v for k, v in optional.items() if v is not None}


def make_executor(plan: JobPlan, folder: Path | None = None) -> submitit.AutoExecutor:
    import submitit

    folder = folder or rundir.submitit_dir(Path(plan.run_dir))
    if plan.scheduler == "local":
        executor = submitit.AutoExecutor(folder=folder, cluster="local")
    else:
        # submitit runs `<slurm_python> -u -m submitit.core._submit FOLDER`: the container's command goes in front
        python = shlex.join(container.python_argv(plan))
        executor = submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_python=python)
    executor.update_parameters(**executor_parameters(plan))
    return executor


def check_cluster(plan: JobPlan) -> None:
    """Checks that need the live cluster: SLURM is reachable and the partition exists."""
    if plan.slurm is None:
        return
    partitions = slurm_cli.partitions()
    # A comma-separated list is legitimate (the job starts in the first that can run it): each must exist.
    missing = [p for p in (plan.slurm.partition or "").split(",") if p not in partitions]
    if missing:
        raise SubmitError(
            f"Partition {missing[0]!r} does not exist on this cluster. "
            f"HINT: set cluster.partition to one of: {', '.join(sorted(partitions)) or '(none found)'}."
        )


def check_storage(plan: JobPlan) -> int | None:
    """The bucket exists and this shell's credentials reach it (the nodes get the same environment), and the
    prefix holds no other run's checkpoints: the nodes would refuse to resume them, and remote retention
    would count (and delete) them as this run's. The newest remote manifest speaks for the prefix. Asked
    within CheckpointStore.quick's bound, said (on stderr) before it starts: a store that is down refuses the
    submission in seconds, not after the run's own retry budget. Returns the newest remote step (None: no
    remote checkpoint, or no storage): the run resumes from it when it is newer than the run dir's."""
    if plan.storage is None:
        return None
    from swiftslurm.ckpt.checkpoint import check_identity
    from swiftslurm.storage.store import CheckpointStore, checking, newest_remote_step

    store = CheckpointStore.quick(plan.storage)
    print(f"swiftslurm: {plan.run_name}: {checking(store.spec)}", file=sys.stderr, flush=True)
    store.check_access()
    if (step := newest_remote_step(store)) is not None:
        check_identity(store.manifest(step), plan.identity(), store.key(step), error=ConfigError)
    return step


def check_submission(plan: JobPlan) -> int | None:
    """What SLURM and the object store would refuse, asked before the run dir is written: a refused run then
    leaves nothing behind. Returns the newest remote checkpoint's step (check_storage)."""
    check_cluster(plan)
    return check_storage(plan)


def submit(plan: JobPlan, checked: bool = False) -> submitit.Job[Any]:
    """Submit the prepared run directory; the job runs swiftslurm.node on every node. A refusal is recorded in
    the run dir (status says so) and raised. ``checked``: the caller ran check_submission for this plan just
    before (before it wrote the run dir), so SLURM and the store are not asked twice."""
    from swiftslurm.node.supervise import submitit_entry

    with refusals_recorded([plan]):
        if not checked:
            check_submission(plan)
        executor = make_executor(plan)
        try:
            return executor.submit(submitit_entry, plan.run_dir)
        except Exception as err:  # submitit raises plain exceptions carrying sbatch's stderr
            raise SubmitError(f"Submission failed: {err}".strip()) from err


@contextlib.contextmanager
def refusals_recorded(plans: list[JobPlan]) -> Iterator[None]:
    """A submission refused (SLURM, the partition, the object store): each run dir says so, then it is raised."""
    try:
        yield
    except SwiftSlurmError as err:
        for plan in plans:
            records.record_refused_submission(Path(plan.run_dir), " ".join(str(err).split())[:500])
        raise


def allocation_key(plan: JobPlan) -> str:
    """What SLURM is asked for, without the job name: runs with equal keys can share one job array."""
    return json.dumps(executor_parameters(plan) | {"name": ""}, sort_keys=True, default=str)


def array_groups(points: Iterable[tuple[T, JobPlan, int]]) -> tuple[list[tuple[int, list[T]]], list[T]]:
    """How a sweep's points are submitted, the first time and by `resume SWEEP_DIR`: SLURM points with an
    array_parallelism go as one job array per distinct allocation and array_parallelism, in the order first seen;
    every other point as its own job. Each point is (what the caller submits, its plan, its array_parallelism);
    returns the arrays as (array_parallelism, members) and the single points."""
    arrays: dict[tuple[str, int], list[T]] = {}
    singles: list[T] = []
    for point, plan, parallelism in points:
        if parallelism and plan.scheduler == "slurm":
            arrays.setdefault((allocation_key(plan), parallelism), []).append(point)
        else:
            singles.append(point)
    return [(parallelism, members) for (_, parallelism), members in arrays.items()], singles


def submit_array(plans: list[JobPlan], folder: Path, parallelism: int) -> list[submitit.Job[Any]]:
    """Submit runs that ask for the same allocation as one SLURM job array (one sbatch), at most
    ``parallelism`` of them running at once (`--array=0-N%parallelism`). Each task is an ordinary run:
    its own run dir, its own job id (`<array>_<i>`), requeued and resumed on its own."""
    from swiftslurm.node.supervise import submitit_entry

    first = plans[0]
    if len({allocation_key(p) for p in plans}) > 1:
        raise SubmitError("an array's runs must ask for the same allocation; submit them as separate jobs.")
    with refusals_recorded(plans):
        check_cluster(first)
        for plan in plans:
            check_storage(plan)
        executor = make_executor(first, folder)
        executor.update_parameters(slurm_array_parallelism=parallelism)
        try:
            return list(executor.map_array(submitit_entry, [p.run_dir for p in plans]))
        except Exception as err:  # submitit raises plain exceptions carrying sbatch's stderr
            raise SubmitError(f"Submission failed: {err}".strip()) from err
