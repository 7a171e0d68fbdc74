"""`python -m swiftslurm [overrides]`: compose the config, plan, write the run dir, dry-run or submit.

Examples:
    python -m swiftslurm                                   # the embedded default: tiny Qwen3, CPU, here
    python -m swiftslurm +cluster=a100x16 model=qwen3-8b strategy=zero3 dry_run=true
    python -m swiftslurm +cluster=local-slurm wait=true    # a real 2-node SLURM job
    python -m swiftslurm -m +cluster=local-slurm swift.learning_rate=1e-4,2e-4 strategy=ddp,zero2  # a sweep

Operating runs: `python -m swiftslurm status|logs|cancel|resume|preflight ...` (see `... status -h`).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from swiftslurm import rundir
from swiftslurm.config import Config, open_dict_overrides, register_configs
from swiftslurm.errors import ConfigError, SwiftSlurmError
from swiftslurm.plan import JobPlan, PlanContext, make_plan, save_budget_warning
from swiftslurm.report import dry_run_report, result_summary
from swiftslurm.sweep import discard_unplanned_sweeps

if TYPE_CHECKING:
    import submitit

POLL_S = 2.0


def to_config(cfg: DictConfig) -> Config:
    from swiftslurm import cli_errors

    cli_errors.check_known_keys(cfg)
    try:
        config = OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        raise ConfigError(f"{err.full_key} has no value. HINT: set {err.full_key}=VALUE.") from err
    except InterpolationResolutionError as err:
        raise ConfigError(cli_errors.interpolation_message(err)) from err
    assert isinstance(config, Config)  # the root schema guarantees it
    return config


_LOSS = re.compile(r"\{'loss': '([^']+)'.*?'global_step/max_steps': '([^']+)'")


def follow(job: submitit.Job[Any], plan: JobPlan) -> None:
    """Print training progress (the loss lines of node 0's log) until the job ends."""
    seen: dict[Path, int] = {}
    while not job.done():
        time.sleep(POLL_S)
        for log in sorted(rundir.leader_logs(plan.run_dir)):
            text = log.read_text(errors="replace")
            for match in _LOSS.finditer(text, seen.get(log, 0)):
                print(f"  step {match.group(2)}  loss {match.group(1)}", flush=True)
                seen[log] = match.end()  # a line still being written is matched next time


def wait_for(job: submitit.Job[Any], plan: JobPlan) -> int:
    """Wait for the job; print the result. Exit status 0 only if every node finished cleanly."""
    import submitit

    follow(job, plan)
    try:
        job.results()
    except (submitit.core.utils.FailedJobError, submitit.core.utils.UncompletedJobError) as err:
        print(f"swiftslurm: job {job.job_id} failed: {str(err).strip()[-2000:]}", file=sys.stderr)
        print(result_summary(plan), file=sys.stderr)
        return 1
    print(f"job {job.job_id} finished.\n{result_summary(plan)}")
    return 0


def sweep_point() -> str | None:
    """In a Hydra multirun, this point's overrides as a path-safe name (`lr=1e-4,strategy=zero2`)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        return None
    point = hydra_cfg.job.override_dirname.replace("swift.", "").replace("+", "")
    name = re.sub(r"[^A-Za-z0-9._=,-]+", "_", point)
    return name or str(hydra_cfg.job.num)


def sweep_dir() -> Path | None:
    """In a Hydra multirun, the sweep's directory (hydra.sweep.dir); None for a single run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    return Path(hydra_cfg.sweep.dir).resolve() if hydra_cfg.mode == RunMode.MULTIRUN else None


def already_submitted(run_dir: Path) -> str | None:
    """Why this run is not submitted again (finished, or its job still queued or running); None to submit.
    Makes re-running a command (or a sweep) resume what stopped and leave alone what did not."""
    from swiftslurm.ops import ACTIVE_STATES, facts_of

    if not (run_dir / rundir.JOB).is_file():
        return None
    facts = facts_of(run_dir)
    if facts.state == "finished":
        return f"already finished (job {facts.job_id}); not submitted again. HINT: a new run_name trains anew."
    if facts.state in ACTIVE_STATES:
        return f"already {facts.state} as job {facts.job_id}; not submitted again."
    return None


def run(cfg: DictConfig) -> int:
    from swiftslurm import submit, tiny
    from swiftslurm.runs import record_submission

    sweep = sweep_dir()
    config = to_config(cfg)
    plan = make_plan(config, PlanContext(cwd=Path.cwd(), sweep_point=sweep_point()))
    run_dir = submit.prepare_run_dir(plan, OmegaConf.to_yaml(cfg))
    if (warning := save_budget_warning(config, plan)) is not None:
        print(f"swiftslurm: {warning}", file=sys.stderr, flush=True)
    if cfg.dry_run:
        print(dry_run_report(plan))
        how = f"sbatch {run_dir / rundir.SBATCH}" if plan.slurm else "python -m swiftslurm.node RUN_DIR"
        print(f"\nNothing submitted (dry_run=true). Run directory written: {run_dir}\nSubmit by hand: {how}")
        return 0
    if (skip := already_submitted(run_dir)) is not None:
        print(f"{plan.run_name}: {skip}", flush=True)
        _record_point(sweep, plan, skip)
        return 0
    if plan.tiny_cache:
        tiny.build_tiny_assets(Path(plan.tiny_cache))
    (run_dir / rundir.CANCELLED).unlink(missing_ok=True)  # submitting again is resuming
    if sweep is not None and cfg.array_parallelism and plan.scheduler == "slurm":
        _record_point(sweep, plan, "planned")  # the end of the sweep submits the array (sweep.SweepCallback)
        return 0
    job = submit.submit(plan)
    record_submission(run_dir, str(job.job_id), plan.scheduler)
    _record_point(sweep, plan, "submitted", str(job.job_id))
    print(f"submitted job {job.job_id} ({plan.scheduler}); run dir {run_dir}", flush=True)
    if plan.scheduler == "local" or (cfg.wait and sweep is None):
        return wait_for(job, plan)
    if sweep is None:
        print("Not waiting (wait=false): `python -m swiftslurm status RUN_DIR`, `... logs -f RUN_DIR`.")
    return 0


def _record_point(sweep: Path | None, plan: JobPlan, action: str, job_id: str | None = None) -> None:
    if sweep is None:
        return
    from hydra.core.hydra_config import HydraConfig

    from swiftslurm.sweep import record_point

    job = HydraConfig.get().job
    point = {"num": job.num, "overrides": list(HydraConfig.get().overrides.task), "run_name": plan.run_name}
    record_point(sweep, {**point, "run_dir": plan.run_dir, "job_id": job_id, "action": action})


@hydra.main(version_base=None, config_path=str(Path(__file__).resolve().parent.parent / "conf"), config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    try:
        code = run(cfg)
    except SwiftSlurmError as err:
        code = refuse(str(err))
    if code:
        sys.exit(code)


OPERATIONS = {
    "status": "swiftslurm.status",
    "logs": "swiftslurm.ops",
    "cancel": "swiftslurm.ops",
    "resume": "swiftslurm.ops",
    "preflight": "swiftslurm.preflight",
}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in OPERATIONS:  # `swiftslurm status DIR`: not a Hydra override
        import importlib

        module = importlib.import_module(OPERATIONS[sys.argv[1]])
        args = sys.argv[2:] if module.__name__ != "swiftslurm.ops" else sys.argv[1:]
        sys.exit(module.main(args))
    sys.exit(compose_and_run(sys.argv[1:]))


def compose_and_run(args: list[str]) -> int:
    """Hydra composes the config and calls `run`; its errors about the command line become one line, exit 2.
    HYDRA_FULL_ERROR makes Hydra raise them instead of printing its own report and exiting 1; a user who set it
    gets Hydra's full traceback, as Hydra documents."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from swiftslurm import cli_errors

    flag = next((a for a in args if a.startswith("-") and not cli_errors.HYDRA_FLAGS.match(a)), None)
    if flag is not None:
        return refuse(cli_errors.flag_message(flag))
    register_configs()
    sys.argv[1:] = open_dict_overrides(args)
    user_asked_for_traceback = "HYDRA_FULL_ERROR" in os.environ
    os.environ["HYDRA_FULL_ERROR"] = "1"
    code: int | str | None = 0
    try:
        hydra_main()
    except SystemExit as stop:
        code = stop.code
    except (HydraException, OmegaConfBaseException) as err:
        if user_asked_for_traceback:
            raise
        code = refuse(cli_errors.hydra_error_message(err, args))
    finally:
        if not user_asked_for_traceback:
            del os.environ["HYDRA_FULL_ERROR"]
    if code == 2:
        discard_unplanned_sweeps()  # a refused `-m` leaves no trace, like a refused run
    return code if isinstance(code, int) else 1


def refuse(message: str) -> int:
    print(f"swiftslurm: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    main()
