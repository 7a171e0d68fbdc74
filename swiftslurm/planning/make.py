"""make_plan: the composed configuration -> JobPlan, the only place where the configuration is interpreted.

Nothing here imports Hydra, torch or ms-swift: planning must stay fast.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import swiftslurm
from swiftslurm import tiny
from swiftslurm.engines.base import ENGINES_DIR, argv_value, argv_values, as_list
from swiftslurm.engines.registry import engine_for, engine_for_strategy
from swiftslurm.errors import ConfigError
from swiftslurm.plan import (
    PORT_SPAN,
    BatchPlan,
    JobPlan,
    Parallelism,
    PreflightSpec,
    Resilience,
    SlurmSpec,
    StorageSpec,
    Topology,
    installed_versions,
)
from swiftslurm.planning import hardware, hub_ids, memory_plan, node_env, validate
from swiftslurm.planning.config import Config
from swiftslurm.planning.container import RunPaths, container_spec
from swiftslurm.rundir import layout as rundir


@dataclass(frozen=True)
class PlanContext:
    """What planning needs from the outside world, passed in so make_plan stays pure."""

    cwd: Path
    python: str = field(default_factory=lambda: sys.executable)
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    sweep_point: str | None = None  # in a Hydra sweep (-m): this point's overrides, to name its run
    versions: dict[str, str] | None = None  # swiftslurm's and ms-swift's; None: as installed for this Python


def make_plan(cfg: Config, ctx: PlanContext | None = None) -> JobPlan:
    """Resolve and validate ``cfg``; raise ConfigError naming the fix on the first problem found."""
    ctx = ctx or PlanContext(cwd=Path.cwd())
    validate.check_choices(cfg)
    topology = _topology(cfg)
    parallel = Parallelism(
        cfg.strategy.tp, cfg.strategy.pp, cfg.strategy.cp, cfg.strategy.ep, cfg.strategy.sequence_parallel
    )
    validate.check_parallelism(cfg, topology.world_size, parallel)
    batch = _batch(cfg, topology.world_size // parallel.model_parallel)
    run_name = cfg.run_name or f"{cfg.model.name}-{cfg.task.name}-{cfg.strategy.name}-{cfg.cluster.name}"
    if ctx.sweep_point:  # each sweep point is its own run, with its own run dir; run_name= names the sweep
        run_name += f"-{ctx.sweep_point}"
    validate.check_run_name(run_name)
    run_dir = _run_dir(cfg, run_name, ctx)
    python = cfg.cluster.python or ctx.python
    validate.check_paths(cfg, topology, ctx.cwd)
    datasets = validate.datasets_of(cfg)  # after check_paths: a mistyped model path is the first thing to fix
    validate.check_master_port(cfg.cluster.master_port_base, PORT_SPAN)
    swift_args = _swift_args(cfg, datasets, topology, parallel, batch, run_dir, ctx)
    validate.check_swift_args(cfg, swift_args)
    engine = engine_for_strategy(cfg.strategy.engine)
    if (why := engine.layout_refusal(swift_args, topology, memory_plan.shape_of(cfg))) is not None:
        raise ConfigError(why)
    memory_plan.check_fits(cfg)  # a plan that cannot fit its GPUs is refused before anything is written
    validate.check_shrink(cfg, topology, parallel, batch, swift_args)
    validate.check_spares(cfg, topology)
    launcher = engine.launcher
    container = container_spec(
        cfg.container,
        RunPaths(
            run_dir=str(run_dir),
            python=python,
            data=_paths_given(swift_args, skip=ENGINES_DIR.parent.parent),
            tiny_cache=str(tiny.asset_paths(ctx.env).model_dir.parent) if _uses_tiny(cfg, datasets) else None,
            uses_storage=cfg.storage.kind != "none",
            gpus=topology.gpus_per_node > 0,
            package_dir=str(Path(swiftslurm.__file__).resolve().parent.parent),
        ),
        ctx.env,
        cfg.cluster.scheduler,
    )
    if container is not None and container.python_from == "image":
        python = cfg.container.python  # the wrapper and ms-swift's entry points are the image's
    return JobPlan(
        run_name=run_name,
        run_dir=str(run_dir),
        scheduler=cfg.cluster.scheduler,
        topology=topology,
        parallel=parallel,
        batch=batch,
        launcher=launcher,
        command=cfg.task.command,
        executable=str(Path(python).parent / launcher),
        python=python,
        swift_argv=tuple(_to_argv(swift_args)),
        env=tuple(sorted(node_env.node_env(cfg).items())),
        setup=tuple(cfg.cluster.setup),
        master_port_base=cfg.cluster.master_port_base,
        slurm=_slurm_spec(cfg, run_name, topology) if cfg.cluster.scheduler == "slurm" else None,
        model_id=cfg.model.id,
        tiny_cache=str(tiny.asset_paths(ctx.env).model_dir.parent) if _uses_tiny(cfg, datasets) else None,
        keep_checkpoints=cfg.keep_checkpoints,
        resilience=Resilience(**vars(cfg.resilience), signal_lead_s=cfg.cluster.signal_lead_s),
        storage=_storage(cfg, run_name),
        preflight=_preflight(cfg, swift_args),
        container=container,
        versions=_planned_versions(ctx) if container is not None else (),
    )


def _planned_versions(ctx: PlanContext) -> tuple[tuple[str, str], ...]:
    """What the run is planned with, for preflight to find in the container (plan.PLANNED_WITH)."""
    found = ctx.versions if ctx.versions is not None else installed_versions()
    return tuple(sorted(found.items()))


# Bytes per parameter a checkpoint takes: full fine-tuning saves bf16 weights (2) and fp32 Adam state with
# master weights (12); LoRA saves the adapter and its optimizer state, well under 1 % of the model's size.
CHECKPOINT_GB_PER_B_PARAMS = {"full": 14.0, "lora": 0.2}


def min_free_gb(params_b: float, tuner_type: str) -> float:
    """Free disk the next checkpoint needs, in GB: an estimate from the model size, at least 1 GB."""
    per_b = CHECKPOINT_GB_PER_B_PARAMS["full" if tuner_type == "full" else "lora"]
    return round(max(1.0, params_b * per_b), 1)


# What one node writes and commits per second, in GB (10^9 bytes), measured by bench/save_budget.py on
# 2026-12-01 (bench/results/save-budget-2026-12-01*.json; docs/resilience.md "Save budget"): 4 ranks on a
# 2-core VM with one virtual disk, shared with other work. Write: the median of the five rows' writes
# (0.33, 0.12, 0.73, 0.37, 0.24 GB/s). Commit: the 50 GB checkpoint's shared commit, median of 3 (larger than the
# page cache, like a full fine-tune's: bound by the disk's read rate). A GPU node has more cores and faster
# disks, so these err on the side of warning.
SAVE_WRITE_GBPS_PER_NODE = 0.33
COMMIT_GBPS_PER_NODE = 0.58


def save_seconds(params_b: float, tuner_type: str, nodes: int, rank_zero_share: float) -> float:
    """Estimated seconds from the save's start to the manifest, on node 0 (the slowest): it writes its share of
    what every rank writes plus all of what global rank 0 writes alone (``rank_zero_share`` of the checkpoint:
    the engine adapter's), and every node hashes its share of the whole (shared_commit.py splits all files)."""
    total_gb = min_free_gb(params_b, tuner_type)
    rank_zero_gb = total_gb * rank_zero_share
    node_zero_gb = (total_gb - rank_zero_gb) / nodes + rank_zero_gb
    return node_zero_gb / SAVE_WRITE_GBPS_PER_NODE + total_gb / nodes / COMMIT_GBPS_PER_NODE


def save_budget_warning(cfg: Config, plan: JobPlan) -> str | None:
    """One line when SLURM's stop signal comes too late for this model's checkpoint to be saved and committed
    before the time limit; None when it has time (or no signal comes: local runs)."""
    if plan.slurm is None or not cfg.model.params_b:
        return None
    lead, tuner = plan.resilience.signal_lead_s, cfg.strategy.tuner_type
    rank_zero = engine_for_strategy(cfg.strategy.engine).rank_zero_share(plan.swift_argv)
    need = save_seconds(cfg.model.params_b, tuner, plan.topology.nodes, rank_zero)
    if need <= lead:
        return None
    enough = int(-(-need * 1.5 // 60) * 60)  # the estimate plus half for the step in progress, whole minutes
    fix = (
        f"set cluster.signal_lead_s={enough} (each attempt stops training that much earlier)"
        if enough < plan.slurm.time_min * 60
        else f"spread the run over more nodes or train LoRA: cluster.time={plan.slurm.time} is too short to save it"
    )
    size_gb = min_free_gb(cfg.model.params_b, tuner)
    alone = f", ~{size_gb * rank_zero:.0f} GB of it by rank 0 alone" if rank_zero and plan.topology.nodes > 1 else ""
    return (
        f"warning: a {tuner} checkpoint of {cfg.model.name} ({cfg.model.params_b:g}B parameters, "
        f"~{size_gb:.0f} GB over {plan.topology.nodes} node(s){alone}) takes ~{need:.0f} s "
        f"to save and commit, more than cluster.signal_lead_s={lead}: the job may end before it is committed. "
        f"HINT: {fix}."
    )


def plan_warnings(cfg: Config, plan: JobPlan) -> list[str]:
    """What the user should know about a plan that is not refused, one line each (`warning: ... HINT: ...`):
    the save budget, a narrow memory fit, and what the engine's resume does with these arguments."""
    warnings = [save_budget_warning(cfg, plan), memory_plan.narrow_fit_warning(cfg), loopback_store_warning(plan)]
    warnings += node_env.env_warnings(cfg.cluster.env)
    argv = plan.swift_argv
    precision = {name: argv_value(argv, name) for name in ("fp16", "torch_dtype")}
    warnings.append(hardware.warning(precision, cfg.cluster.gpu_type))
    models = [("model.id", cfg.model.id)] + [("swift.reward_model", m) for m in argv_values(argv, "reward_model")]
    warnings += [hub_ids.unreleased_warning(field, model) for field, model in models]
    return [w for w in warnings if w is not None] + engine_for(plan.launcher).resume_warnings(plan.swift_argv)


def loopback_store_warning(plan: JobPlan) -> str | None:
    """A SLURM run whose object store is on a loopback address: this machine reaches it, the nodes reach their
    own loopback (node 0 checks at the first attempt and stops the run if it cannot reach the store)."""
    endpoint = plan.storage.endpoint_url if plan.storage else None
    host = urlsplit(endpoint or "").hostname
    if plan.slurm is None or host is None or not (host == "localhost" or host.startswith("127.") or host == "::1"):
        return None
    return (
        f"warning: storage.endpoint_url {endpoint} is on {host}: 127.0.0.1 is each node's own "
        "loopback, so the nodes reach it only if a store runs on every node. HINT: use an address the nodes "
        "reach (docs/storage.md shows a local server they can)."
    )


def _preflight(cfg: Config, swift_args: dict[str, Any]) -> PreflightSpec:
    validate.check_preflight(cfg.preflight_timeout_s, cfg.preflight_min_free_gb)
    need = cfg.preflight_min_free_gb
    if need is None:
        need = min_free_gb(cfg.model.params_b, cfg.strategy.tuner_type)
    return PreflightSpec(cfg.preflight, float(cfg.preflight_timeout_s), float(need), _local_paths(swift_args))


def _paths_given(swift_args: dict[str, Any], skip: Path) -> tuple[tuple[str, str], ...]:
    """(path, why) for every absolute path ms-swift is given that exists here (the model, the data, a plugin, a
    DeepSpeed config): a container must see each. Paths not there yet are the run's outputs, in the run dir;
    swiftslurm's own files (its plugins, under ``skip``) come with its code."""
    given: dict[str, str] = {}
    for name, value in swift_args.items():
        for item in as_list(value):
            path = str(item).split("#")[0]
            if path.startswith("/") and Path(path).exists() and not Path(path).is_relative_to(skip):
                given.setdefault(path, f"ms-swift's --{name}")
    return tuple(given.items())


def _local_paths(swift_args: dict[str, Any]) -> tuple[str, ...]:
    """The model and dataset paths the nodes read (absolute only: hub ids are downloaded; `#N` picks a subset)."""
    paths = [str(swift_args["model"]), *(str(d).split("#")[0] for d in as_list(swift_args.get("dataset")))]
    return tuple(dict.fromkeys(p for p in paths if p.startswith("/")))


def _storage(cfg: Config, run_name: str) -> StorageSpec | None:
    """The object store of this run; its prefix follows the run name, not the run dir, so a resubmission
    of the same run on another cluster (another run dir) finds its checkpoints."""
    s = cfg.storage
    if s.kind == "none":
        return None
    assert s.bucket is not None  # validate._check_storage
    return StorageSpec(
        bucket=s.bucket,
        prefix=s.prefix if s.prefix is not None else f"swiftslurm/{run_name}",
        endpoint_url=s.endpoint_url,
        region=s.region,
        addressing_style=s.addressing_style,
        keep=s.keep,
        part_size_mb=s.part_size_mb,
        max_attempts=s.max_attempts,
        max_concurrency=s.max_concurrency,
        wait_at_exit_s=s.wait_at_exit_s,
        background_priority=s.background_priority,
    )


def _uses_tiny(cfg: Config, datasets: list[str]) -> bool:
    return cfg.model.id == "tiny" or any(d in tiny.DATASETS for d in datasets)


def _topology(cfg: Config) -> Topology:
    cluster = cfg.cluster
    procs = cluster.gpus_per_node if cluster.gpus_per_node > 0 else cluster.cpu_procs_per_node
    return Topology(nodes=cluster.nodes, procs_per_node=procs, gpus_per_node=cluster.gpus_per_node)


def _batch(cfg: Config, data_parallel: int) -> BatchPlan:
    micro = cfg.micro_batch_size
    validate.check_positive("micro_batch_size", micro)
    if cfg.global_batch_size is None:
        return BatchPlan(micro=micro, grad_accum=1, data_parallel=data_parallel)
    per_step = micro * data_parallel
    if cfg.global_batch_size % per_step != 0:
        lower = max(per_step, cfg.global_batch_size // per_step * per_step)
        raise ConfigError(
            f"global_batch_size={cfg.global_batch_size} is not a multiple of micro_batch_size × "
            f"data-parallel size = {micro} × {data_parallel} = {per_step}, so gradient accumulation "
            f"would not be a whole number. HINT: set global_batch_size={lower} or "
            f"{lower + per_step}, or change micro_batch_size."
        )
    return BatchPlan(micro=micro, grad_accum=cfg.global_batch_size // per_step, data_parallel=data_parallel)


def _run_dir(cfg: Config, run_name: str, ctx: PlanContext) -> Path:
    if cfg.run_dir:
        path = Path(os.path.expanduser(cfg.run_dir))
    else:
        path = Path(ctx.env.get("SWIFTSLURM_RUNS", "runs")) / run_name
    return path if path.is_absolute() else ctx.cwd / path


def _swift_args(
    cfg: Config,
    datasets: list[str],
    topo: Topology,
    par: Parallelism,
    batch: BatchPlan,
    run_dir: Path,
    ctx: PlanContext,
) -> dict[str, Any]:
    """Merge ms-swift arguments: derived < strategy < task < model < cluster < the user's `swift.*`."""
    engine = engine_for_strategy(cfg.strategy.engine)
    validate.check_not_managed(cfg.swift, engine.managed_args)
    for extra in (cfg.strategy.swift, cfg.task.swift, cfg.model.swift, cfg.cluster.swift, cfg.swift):
        validate.check_not_planned(extra)
    assets = tiny.asset_paths(ctx.env)
    model = str(assets.model_dir) if cfg.model.id == "tiny" else cfg.model.id
    data = [str(assets.dataset(d)) if d in tiny.DATASETS else d for d in datasets]
    args: dict[str, Any] = {"model": model, "dataset": data, "tuner_type": cfg.strategy.tuner_type}
    args |= _engine_args(cfg, par)
    args |= engine.batch_args(batch)
    args |= _task_args(cfg)
    args |= {
        "seed": cfg.seed,
        "ddp_timeout": cfg.cluster.nccl.timeout_s,
    }
    args |= engine.default_args(cfg.seed)
    if topo.gpus_per_node == 0:
        args |= engine.cpu_args(cfg.strategy.engine)
    for extra in (cfg.strategy.swift, cfg.task.swift, cfg.model.swift, cfg.cluster.swift, cfg.swift):
        args |= dict(extra)
    # What the engine needs to save on SLURM's signal and commit every checkpoint (swiftslurm's plugin),
    # keeping whatever callbacks and plugins the configuration asked for.
    args |= engine.forced_args(args, rundir.output_dir(run_dir))
    if (why := engine.refusal(args)) is not None:
        raise ConfigError(why)
    return {k: v for k, v in args.items() if v is not None}


def _engine_args(cfg: Config, par: Parallelism) -> dict[str, Any]:
    strategy = cfg.strategy
    args: dict[str, Any] = {
        "deepspeed": strategy.deepspeed,
        "fsdp": strategy.fsdp,
        "quant_bits": strategy.quant_bits,
    }
    return args | engine_for_strategy(cfg.strategy.engine).parallel_args(par)


def _task_args(cfg: Config) -> dict[str, Any]:
    task = cfg.task
    args: dict[str, Any] = {"rlhf_type": task.rlhf_type}
    if task.vllm_mode:
        args |= {"use_vllm": True, "vllm_mode": task.vllm_mode}
    if task.vllm_mode == "server":
        args |= {"vllm_server_host": [task.vllm_server_host], "vllm_server_port": [task.vllm_server_port]}
    return args


def _to_argv(args: dict[str, Any]) -> list[str]:
    """ms-swift's CLI spelling: booleans as true/false, lists as several values, dicts as JSON."""
    argv = []
    for key, value in args.items():
        argv.append(f"--{key}")
        if isinstance(value, bool):
            argv.append("true" if value else "false")
        elif isinstance(value, (list, tuple)):
            argv.extend(str(v) for v in value)
        elif isinstance(value, dict):
            argv.append(json.dumps(value, sort_keys=True))
        else:
            argv.append(str(value))
    return argv


def _slurm_spec(cfg: Config, run_name: str, topo: Topology) -> SlurmSpec:
    cluster = cfg.cluster
    time_min = validate.parse_slurm_time(cluster.time)
    validate.check_signal_lead(cluster.signal_lead_s, time_min)
    validate.check_slurm_required(cfg)
    validate.check_host_lists(cluster)
    validate.check_slurm_strings(cfg, run_name)
    gpus = None
    if topo.gpus_per_node:
        gpus = f"{cluster.gpu_type}:{topo.gpus_per_node}" if cluster.gpu_type else str(topo.gpus_per_node)
    return SlurmSpec(
        job_name=run_name,
        time_min=time_min,
        time=cluster.time,
        signal=f"USR2@{cluster.signal_lead_s}",
        partition=cluster.partition,
        account=cluster.account,
        qos=cluster.qos,
        constraint=cluster.constraint,
        exclude=cluster.exclude,
        cpus_per_task=cluster.cpus_per_task,
        mem_gb=cluster.mem_gb,
        gpus=gpus,
        extra=tuple((str(k), str(v)) for k, v in cluster.sbatch.items()),
    )
