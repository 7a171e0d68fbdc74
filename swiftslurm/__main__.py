"""`python -m swiftslurm [overrides]`: compose the config, plan, write the run dir, dry-run or submit.

Examples:
    python -m swiftslurm                                   # the embedded default: tiny Qwen3, CPU, here
    python -m swiftslurm +cluster=a100x16 model=qwen3-8b strategy=zero3 dry_run=true
    python -m swiftslurm +cluster=local-slurm wait=true    # a real 2-node SLURM job
    python -m swiftslurm -m +cluster=local-slurm swift.learning_rate=1e-4,2e-4 strategy=ddp,zero2  # a sweep

Operating runs: `python -m swiftslurm status|logs|cancel|resume|preflight ...` (see `... status -h`).
`python -m swiftslurm --help` lists them all (swiftslurm/cli/help.py); Hydra's own help is `--hydra-help`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from swiftslurm.cli.mistakes import to_config
from swiftslurm.engines.forward_clock import planned_coverage
from swiftslurm.errors import SwiftSlurmError, report
from swiftslurm.launch import (
    already_submitted,
    check_run_dir,
    dry_run_resume_note,
    dry_run_text,
    ready_to_submit,
    resume_note,
    write_run_dir,
)
from swiftslurm.planning import memory_plan
from swiftslurm.planning.config import open_dict_overrides, register_configs
from swiftslurm.planning.make import PlanContext, make_plan, plan_warnings
from swiftslurm.sweep.callback import discard_unplanned_sweeps, raise_unfinished_sweep

__all__ = ["main", "to_config"]
CHECKOUT = Path(__file__).resolve().parent.parent  # holds conf/ and hydra_plugins/


def run(cfg: DictConfig) -> int:
    """One run (a `-m` sweep goes through hydra_plugins/swiftslurm_sweeper and swiftslurm/sweep/sweeper.py instead)."""
    from swiftslurm.rundir.records import record_submission
    from swiftslurm.submit import jobs as submit

    config = to_config(cfg)
    plan = make_plan(config, PlanContext(cwd=Path.cwd()))
    checked = check_run_dir(plan)
    run_dir = Path(plan.run_dir)
    skip = already_submitted(run_dir, run_dir_given=config.run_dir is not None)
    remote_step, resume_line = None, None
    if skip is None and not cfg.dry_run:
        remote_step = submit.check_submission(plan)  # a run SLURM or the store would refuse leaves nothing behind
    elif skip is None:
        resume_line = dry_run_resume_note(plan)  # another plan's checkpoints under the prefix: refused unwritten
    if skip is None:  # a run that is not submitted again keeps its run dir as it is
        write_run_dir(plan, OmegaConf.to_yaml(cfg), checked)
    for note in [*plan_warnings(config, plan), *filter(None, [checked.note(run_dir)])]:
        print(f"swiftslurm: {note}", file=sys.stderr, flush=True)
    if cfg.dry_run:
        strategy = config.strategy
        coverage = planned_coverage(strategy.engine, strategy.deepspeed, strategy.fsdp)
        notes = (memory_plan.memory_line(config), memory_plan.shrink_line(config, plan), coverage, resume_line)
        print(dry_run_text(plan, run_dir, skip, tuple(n for n in notes if n)))  # shrink: only a run that may
        return 0
    if skip is not None:
        print(f"{plan.run_name}: {skip}", flush=True)
        return 0
    ready_to_submit([plan])
    job = submit.submit(plan, checked=True)  # check_submission ran above, before the run dir was written
    record_submission(run_dir, str(job.job_id), plan.scheduler)
    print(f"submitted job {job.job_id} ({plan.scheduler}); run dir {run_dir}", flush=True)
    if (resumes := resume_note(plan, remote_step)) is not None:
        print(resumes, flush=True)
    if plan.scheduler == "local" or cfg.wait:
        from swiftslurm.ops.waiting import wait_for

        return wait_for(job, plan)
    print("Not waiting (wait=false): `python -m swiftslurm status RUN_DIR`, `... logs -f RUN_DIR`.")
    return 0


@hydra.main(version_base=None, config_path=str(CHECKOUT / "conf"), config_name="config")
def hydra_main(cfg: DictConfig) -> None:
    try:
        code = run(cfg)
    except SwiftSlurmError as err:
        code = report(err)
    if code:
        sys.exit(code)


def main() -> None:
    from swiftslurm.cli import mistakes as cli_errors
    from swiftslurm.cli.help import COMMANDS, HELP_FLAGS, render

    first = sys.argv[1] if len(sys.argv) > 1 else ""
    if first in COMMANDS:  # `swiftslurm status DIR`: not a Hydra override
        import importlib

        module = importlib.import_module(COMMANDS[first][0])
        args = sys.argv[2:] if module.__name__ != "swiftslurm.ops.control" else sys.argv[1:]
        from swiftslurm.cli.pipes import quiet_on_closed_pipe

        sys.exit(quiet_on_closed_pipe(module.main, args))
    if any(arg in HELP_FLAGS for arg in sys.argv[1:]):  # ours, not Hydra's (that is --hydra-help)
        print(render(), end="")
        sys.exit(0)
    if cli_errors.is_bare_word(first):  # no `=`, no flag: a command, mistyped; Hydra would say "missing EQUAL"
        sys.exit(report(cli_errors.unknown_command_message(first, list(COMMANDS))))
    sys.exit(compose_and_run(sys.argv[1:]))


def compose_and_run(args: list[str]) -> int:
    """Hydra composes the config and calls `run`; its errors about the command line become one line, exit 2.
    HYDRA_FULL_ERROR makes Hydra raise them instead of printing its own report and exiting 1; a user who set it
    gets Hydra's full traceback, as Hydra documents."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from swiftslurm.cli import mistakes as cli_errors

    flag = next((a for a in args if a.startswith("-") and not cli_errors.HYDRA_FLAGS.match(a)), None)
    if flag is not None:
        return report(cli_errors.flag_message(flag))
    register_configs()
    if str(CHECKOUT) not in sys.path:  # Hydra finds plugins only in the `hydra_plugins` namespace package; our
        sys.path.append(str(CHECKOUT))  # sweeper's lives beside conf/ in the checkout, whatever the install
    sys.argv[1:] = open_dict_overrides(args)
    user_asked_for_traceback = "HYDRA_FULL_ERROR" in os.environ
    os.environ["HYDRA_FULL_ERROR"] = "1"
    code: int | str | None = 0
    try:
        hydra_main()
        raise_unfinished_sweep()
    except SystemExit as stop:
        code = stop.code
    except (HydraException, OmegaConfBaseException, OverflowError) as err:
        if user_asked_for_traceback or (message := cli_errors.command_line_refusal(err, args)) is None:
            raise
        code = report(message)
    except SwiftSlurmError as err:  # from a sweep (swiftslurm/sweep/): a point refused, not submitted, or failed
        code = report(err)
    finally:
        if not user_asked_for_traceback:
            del os.environ["HYDRA_FULL_ERROR"]
    if code == 2:
        discard_unplanned_sweeps()  # a refused `-m` leaves no trace, like a refused run
    return code if isinstance(code, int) else 1


if __name__ == "__main__":
    main()
