"""`python -m swiftslurm -m ...`: every point of a sweep composed once, planned before anything is written,
written with one sync, recorded append-only, and submitted as one job array (array_parallelism=N) or one job
per point. Called by the sweeper plugin (hydra_plugins/swiftslurm_sweeper), which parses the sweep.

Hydra's own multirun composed every point twice (its BasicSweeper composes each point of a batch to validate
it, then its BasicLauncher composes each again to run it), and the task function rewrote sweep.json per point:
554 s for 1000 points. Here:
- compose: points that choose the same config groups (model=, strategy=, +cluster=...) share one composition;
  each point's other overrides are applied to its own copy by Hydra's own code, exactly what Hydra does after
  composing the defaults (ConfigLoaderImpl._load_configuration_impl), so each point's config is the same.
- plan: every point is planned and its run dir checked first; one refused point refuses the whole sweep, with
  nothing written.
- write: run dirs without an fsync per file, then one sync before anything is recorded or submitted.
- record and submit: sweep.jsonl gets a line per point per step (planned, submitted), one fsync per batch; a
  failed submission exits 2 naming the points not submitted.
Hydra's private ConfigLoaderImpl and Overrides are used on purpose (hydra-core is pinned <1.4): they are what
makes a point's composition here the same as Hydra's.
"""

from __future__ import annotations

import dataclasses
import itertools
import pickle
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from swiftslurm.cli.mistakes import to_config
from swiftslurm.errors import ConfigError, RunFailed, SubmitError, SwiftSlurmError
from swiftslurm.launch import (
    RunDirCheck,
    already_submitted,
    check_run_dir,
    dry_run_text,
    ready_to_submit,
    write_run_dir,
)
from swiftslurm.plan import JobPlan
from swiftslurm.planning.make import PlanContext, make_plan, plan_warnings
from swiftslurm.rundir.jsonio import sync_filesystems
from swiftslurm.rundir.layout import submitit_dir
from swiftslurm.rundir.records import read_refused_submission, record_refused_submission
from swiftslurm.rundir.sweepdir import record_points
from swiftslurm.submit import jobs as submit
from swiftslurm.sweep.callback import HYDRA_RECORD, not_submitted
from swiftslurm.sweep.point_yaml import point_yaml
from swiftslurm.sweep.workers import Workers, inherited

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override
    from hydra.types import HydraContext


@dataclass(frozen=True)
class Point:
    num: int  # Hydra's job number (hydra.job.num)
    overrides: list[str]  # the point's task overrides, as Hydra records them (hydra.overrides.task)
    varies: list[str]  # those that differ between the sweep's points: name the point in messages
    name: str  # what varies, path-safe, unique in the sweep: names the point's run (point_names)
    base: tuple[str, ...]  # its choice of config groups: which composition it starts from
    values: list[Override]  # its other overrides, applied to a copy of that composition


@dataclass(frozen=True)
class Sweep:
    """What every point is planned from (inherited by the worker processes)."""

    bases: dict[tuple[str, ...], bytes]  # each choice of config groups' composition, pickled
    points: list[Point]
    cwd: Path


@dataclass(frozen=True)
class Planned:
    point: Point
    plan: JobPlan
    config_yaml: str
    checked: RunDirCheck  # job.sbatch's text; an earlier run of the dir this point replaces
    dry_run: bool
    array_parallelism: int
    warnings: tuple[str, ...]  # the plan's warnings (make.plan_warnings), printed by the sweep's own process
    run_dir_given: bool  # the user chose the run dir (run_dir=): only another run_dir makes a new run

    def record(self, action: str, job_id: str | None = None) -> dict[str, Any]:
        """The point's line in sweep.jsonl: what it is, where its run dir is, what was done, and its
        array_parallelism (what `resume SWEEP_DIR` submits it again with)."""
        point, plan = self.point, self.plan
        where = {"num": point.num, "overrides": point.overrides, "run_name": plan.run_name, "run_dir": plan.run_dir}
        return where | {"array_parallelism": self.array_parallelism, "job_id": job_id, "action": action}


# ------------------------------------------------------------------------------ compose


def expand(overrides: list[Override]) -> list[list[Override]]:
    """The sweep's points, as Hydra's BasicSweeper.split_arguments makes them (the cartesian product, in its
    order; a key given twice keeps the last value), but as parsed overrides: each swept value becomes an element
    override directly, where BasicSweeper prints it and the launcher parses it again (~2 ms a point)."""
    from hydra.errors import HydraException

    choices: dict[str, list[Override]] = {}
    for override in overrides:
        if override.is_sweep_override() and not override.is_discrete_sweep():
            raise HydraException(f"swiftslurm's sweeper does not support sweep type: {override.value_type}")
        key = override.get_key_element()
        if override.is_sweep_override():
            choices[key] = swept(override)
        else:  # written as BasicSweeper writes it (`lr=3e-4` -> `lr=0.0003`): it names the point's run
            choices[key] = [dataclasses.replace(override, input_line=f"{key}={override.get_value_element_as_str()}")]
    return [list(point) for point in itertools.product(*choices.values())]


def swept(override: Override) -> list[Override]:
    """One element override per value of a discrete sweep, with the input line BasicSweeper would write."""
    from hydra.core.override_parser.types import ValueType

    key, as_text = override.get_key_element(), type(override)._get_value_element_as_str
    return [
        dataclasses.replace(override, value_type=ValueType.ELEMENT, _value=value, input_line=f"{key}={as_text(value)}")
        for value in override.sweep_iterator()
    ]


def compose_points(context: HydraContext, master: DictConfig, points: list[list[Override]]) -> Sweep:
    """Compose once per distinct choice of config groups; each point is that composition plus its values."""
    loader = context.config_loader
    assert isinstance(loader, ConfigLoaderImpl)  # the only loader Hydra has
    is_value = value_override_test(loader, master)
    sweep = Sweep(bases={}, points=[], cwd=Path.cwd())
    everywhere = set.intersection(*({str(o.input_line) for o in point} for point in points)) if points else set()
    varying = [[o for o in point if str(o.input_line) not in everywhere] or point for point in points]
    names = point_names(master, varying)
    for num, overrides in enumerate(points):
        values = [o for o in overrides if is_value(o)]  # what Hydra applies after composing the defaults
        base = tuple(str(o.input_line) for o in overrides if not is_value(o))
        if base not in sweep.bases:
            sweep.bases[base] = pickle.dumps(task_config(loader.load_sweep_config(master, list(base))))
        lines = [str(o.input_line) for o in overrides]
        varies = [str(o.input_line) for o in varying[num]]
        sweep.points.append(Point(num, lines, varies, names[num], base, values))
    return sweep


def point_config(sweep: Sweep, point: Point) -> DictConfig:
    """The point's config, as Hydra's launcher would have composed it."""
    cfg = pickle.loads(sweep.bases[point.base])  # a deep copy, 5x faster than copy.deepcopy of a DictConfig
    ConfigLoaderImpl._apply_overrides_to_config(point.values, cfg)
    assert isinstance(cfg, DictConfig)
    return cfg


def value_override_test(loader: ConfigLoaderImpl, master: DictConfig) -> Callable[[Override], bool]:
    """Whether an override sets a value (vs choosing a config group), decided by Hydra's own Overrides against
    the config repository the sweep composes from; once per distinct override."""
    from hydra._internal.defaults_list import Overrides

    hydra_overrides = list(master.hydra.overrides.hydra)
    _, repo = loader._parse_overrides_and_create_caching_repo(master.hydra.job.config_name, hydra_overrides)

    known: dict[str | None, bool] = {}

    def is_value(override: Override) -> bool:
        if override.input_line not in known:
            known[override.input_line] = bool(Overrides(repo, [override]).config_overrides)
        return known[override.input_line]

    return is_value


def task_config(composed: DictConfig) -> DictConfig:
    """The config without its hydra node, as Hydra hands it to a task function (hydra.core.utils.run_job)."""
    with read_write(composed), open_dict(composed):
        del composed["hydra"]
    return composed


def point_names(master: DictConfig, varying: list[list[Override]]) -> list[str]:
    """Each point's run-name suffix, from what varies: Hydra's override_dirname of those overrides
    (`learning_rate=1e-4,strategy=zero2`), floats in their short form (short_float). No two points may share one
    (they would share a run dir): where the short forms do not tell points apart, Hydra's own do; where only keys
    that override_dirname excludes tell points apart (`+recipe=a,b`), those keys name them too; where even that is
    not enough (a value swept twice, `seed=1,1`), the job number is added."""
    conf = master.hydra.job.config.override_dirname
    short = [[short_floats(o) for o in overrides] for overrides in varying]
    for exclude in (list(conf.exclude_keys), []):
        for overrides in (short, varying):
            names = [point_name(o, exclude, conf) for o in overrides]
            if len(set(names)) == len(names):
                return [name or str(num) for num, name in enumerate(names)]
    names = [point_name(o, list(conf.exclude_keys), conf) for o in short]
    return [f"{name},{num}" if name else str(num) for num, name in enumerate(names)]


def short_floats(override: Override) -> Override:
    """A float value written as its 12 significant digits in Python's shortest form: range(5e-5,1e-4,1e-5)'s
    third value is 7.000000000000001e-05, named 7e-05. A float that has no more digits keeps the text Hydra gives
    it (the name of a run already made, whose run dir and storage prefix follow its name)."""
    from hydra.core.override_parser.types import ValueType

    value = override.value() if override.value_type == ValueType.ELEMENT else None
    if not isinstance(value, float):
        return override
    return dataclasses.replace(override, input_line=f"{override.get_key_element()}={float(f'{value:.12g}')!r}")


def point_name(overrides: list[Override], exclude_keys: list[str], conf: DictConfig) -> str:
    """The overrides as a path-safe name: Hydra's override_dirname without the `swift.` and `+` prefixes."""
    from hydra._internal.config_loader_impl import get_overrides_dirname

    dirname = get_overrides_dirname(overrides, exclude_keys, conf.item_sep, conf.kv_sep)
    return re.sub(r"[^A-Za-z0-9._=,-]+", "_", dirname.replace("swift.", "").replace("+", ""))


# ------------------------------------------------------------------------------ plan


def plan_point(sweep: Sweep, point: Point) -> Planned:
    """Compose, plan and check one point's run dir, writing nothing; a refusal names the point."""
    cfg = point_config(sweep, point)
    try:
        config = to_config(cfg)
        plan = make_plan(config, PlanContext(cwd=sweep.cwd, sweep_point=point.name))
        checked = check_run_dir(plan)
    except SwiftSlurmError as err:
        raise type(err)(f"sweep point #{point.num} ({' '.join(point.varies)}): {err}") from err
    warnings = tuple(plan_warnings(config, plan))
    touched = {str(o.key_or_group).split(".")[0] for o in point.values}
    config_yaml = point_yaml(cfg, point.base, touched)
    given = config.run_dir is not None
    return Planned(point, plan, config_yaml, checked, config.dry_run, config.array_parallelism, warnings, given)


def plan_points(points: list[Point]) -> list[Planned]:
    sweep = inherited()
    return [plan_point(sweep, point) for point in points]


def check_distinct_run_dirs(planned: list[Planned]) -> None:
    """Two points in one run dir would resume each other's checkpoints: refuse before anything is written."""
    first: dict[str, Planned] = {}
    for item in planned:
        other = first.setdefault(item.plan.run_dir, item)
        if other is not item:
            raise ConfigError(
                f"sweep points #{other.point.num} ({' '.join(other.point.varies)}) and #{item.point.num} "
                f"({' '.join(item.point.varies)}) would share the run dir {item.plan.run_dir}. HINT: leave "
                "run_dir unset in a sweep (each point's is named after what varies; run_name=NAME prefixes the names)."
            )


def write_run_dirs(items: list[Planned]) -> list[None]:
    """Write the points' run dirs without an fsync per file (the sweep syncs once, before submitting)."""
    for item in items:
        write_run_dir(item.plan, item.config_yaml, item.checked, durable=False)
    return []


# ------------------------------------------------------------------------------ write, record, submit


def run_sweep(context: HydraContext, master: DictConfig, overrides: list[Override]) -> None:
    """Compose and plan every point of the sweep, then write, record and submit them. Raises SubmitError naming
    the points not submitted when a submission fails, RunFailed when a local point failed."""
    sweep = compose_points(context, master, expand(overrides))
    with Workers(sweep, len(sweep.points)) as workers:
        planned = workers.map(plan_points, sweep.points)
        check_distinct_run_dirs(planned)
        for item in planned:
            notes = [*item.warnings, *filter(None, [item.checked.note(Path(item.plan.run_dir))])]
            for note in notes:
                print(f"swiftslurm: {item.plan.run_name}: {note}", file=sys.stderr, flush=True)
        sweep_dir = Path(master.hydra.sweep.dir).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(master, sweep_dir / HYDRA_RECORD)  # as Hydra's BasicSweeper does, once all are planned
        skips = {item.plan.run_dir: already_submitted(Path(item.plan.run_dir), item.run_dir_given) for item in planned}
        to_write = [item for item in planned if skips[item.plan.run_dir] is None]  # the others keep their run dir
        workers.map(write_run_dirs, to_write)
    sync_filesystems([Path(item.plan.run_dir) for item in to_write])  # each file whole (temp + rename), on disk
    to_submit = [item for item in planned if not item.dry_run and not skipped(item, skips, sweep_dir)]
    for item in planned:
        if item.dry_run:
            print(dry_run_text(item.plan, Path(item.plan.run_dir), skips[item.plan.run_dir]))
    if not to_submit:
        return
    record_points(sweep_dir, [item.record("planned") for item in to_submit])
    ready_to_submit([item.plan for item in to_submit])
    failed = submit_points(sweep_dir, to_submit)
    if failed:
        raise RunFailed(f"{failed} of {len(to_submit)} local sweep points failed.")


def skipped(item: Planned, skips: dict[str, str | None], sweep_dir: Path) -> bool:
    """A point whose run finished or is still queued: recorded and said, not submitted again."""
    if (why := skips[item.plan.run_dir]) is None:
        return False
    print(f"{item.plan.run_name}: {why}", flush=True)
    record_points(sweep_dir, [item.record(why)])
    return True


def submit_points(sweep_dir: Path, items: list[Planned]) -> int:
    """Arrays first (one sbatch per distinct allocation and array_parallelism), then one job per other point.
    Returns how many local runs failed (those are waited for)."""
    arrays, singles = submit.array_groups((item, item.plan, item.array_parallelism) for item in items)
    done: set[str] = set()  # run dirs submitted
    started = time.time()
    try:
        for parallelism, members in arrays:
            submit_array(sweep_dir, members, parallelism)
            done.update(item.plan.run_dir for item in members)
        return sum(submit_single(sweep_dir, item, done) for item in singles)
    except SubmitError as err:
        left = [item for item in items if item.plan.run_dir not in done]
        for item in left:  # the refused point's run dir says so already; the ones never tried say why
            if float((read_refused_submission(Path(item.plan.run_dir)) or {"at": 0})["at"]) < started:
                record_refused_submission(Path(item.plan.run_dir), f"not tried: an earlier point's was refused ({err})")
        raise not_submitted(err, [item.plan.run_name for item in left], sweep_dir) from err


def submit_array(sweep_dir: Path, members: list[Planned], parallelism: int) -> None:
    from swiftslurm.rundir.records import record_submissions

    plans = [item.plan for item in members]
    folder = submitit_dir(sweep_dir)
    jobs = [str(job.job_id) for job in submit.submit_array(plans, folder, parallelism)]
    record_submissions([(Path(plan.run_dir), job) for plan, job in zip(plans, jobs, strict=True)], "slurm", folder)
    record_points(sweep_dir, [item.record("submitted", job) for item, job in zip(members, jobs, strict=True)])
    print(f"submitted {len(jobs)} point(s) as job array(s) {sorted({j.split('_')[0] for j in jobs})}", flush=True)


def submit_single(sweep_dir: Path, item: Planned, done: set[str]) -> int:
    """Submit one point as its own job (a local one is run and waited for); 1 if a local run failed."""
    from swiftslurm.rundir.records import record_submission

    plan = item.plan
    job = submit.submit(plan)
    done.add(plan.run_dir)
    record_submission(Path(plan.run_dir), str(job.job_id), plan.scheduler)
    record_points(sweep_dir, [item.record("submitted", str(job.job_id))])
    print(f"submitted job {job.job_id} ({plan.scheduler}); run dir {plan.run_dir}", flush=True)
    if plan.scheduler != "local":
        return 0
    from swiftslurm.ops.waiting import wait_for

    return wait_for(job, plan)
