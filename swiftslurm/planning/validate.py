"""Checks run by make_plan before anything is written or submitted.

Each check raises ConfigError with one message that names the value, the conflict and the fix.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swiftslurm import secrets
from swiftslurm.engines.registry import STRATEGY_ENGINES, engine_for_strategy
from swiftslurm.errors import ConfigError, did_you_mean, one_of
from swiftslurm.plan import BACKGROUND_PRIORITIES, STRAGGLER_ACTIONS, STRAGGLER_SWAP
from swiftslurm.planning import hardware, memory_plan, swift_rules
from swiftslurm.slurm import parse_time
from swiftslurm.slurm_env import HOSTLIST_FORM, hostlist_problem, repaired_hostlist
from swiftslurm.storage import naming
from swiftslurm.tiny import DATASETS as TINY_DATASETS

if TYPE_CHECKING:
    from swiftslurm.plan import BatchPlan, Parallelism, Topology
    from swiftslurm.planning.config import ClusterConfig, Config, StrategyConfig

SCHEDULERS = ("local", "slurm")
VLLM_MODES = ("colocate", "server")
MAX_PORT = 65535
S3_MIN_PART_MB = 5  # S3's smallest multipart part (every part but the last)


def _choice(field: str, value: Any, valid: Iterable[str]) -> None:
    valid = tuple(valid)
    if value not in valid:
        raise ConfigError(f"{field}={value!r} is not known.{did_you_mean(str(value), valid)} {one_of(valid)}")


# `not low <= value < inf` refuses nan too (nan compares false with everything): the node side sleeps, counts and
# compares with these numbers, and int(nan) or time.sleep(inf) raises there.
def check_positive(field: str, value: float) -> None:
    if not 1 <= value < math.inf:
        raise ConfigError(f"{field}={value} must be at least 1 (and finite). HINT: set {field}=1 or more.")


def check_not_negative(field: str, value: float) -> None:
    if not 0 <= value < math.inf:
        raise ConfigError(f"{field}={value} is negative or not finite. HINT: set {field}=0 or more.")


MAX_NODES = 100_000  # python-hostlist's limit: the node side could not read a longer SLURM_JOB_NODELIST


def check_counts(cfg: Config) -> None:
    """Counts, sizes and durations a typo can make negative or zero, where SLURM, ms-swift or the node side
    would take the value as given (a negative GPU count, a zero time-out)."""
    cluster, res = cfg.cluster, cfg.resilience
    check_not_negative("cluster.gpus_per_node", cluster.gpus_per_node)
    check_not_negative("model.params_b", cfg.model.params_b)
    if cluster.gpu_memory_gib is not None and not 0 < cluster.gpu_memory_gib < math.inf:
        raise ConfigError(
            f"cluster.gpu_memory_gib={cluster.gpu_memory_gib} is not a GPU's memory. HINT: set it in GiB as "
            "nvidia-smi reports it (A100 80GB: cluster.gpu_memory_gib=80), or null to check nothing."
        )
    if cluster.nodes > MAX_NODES:
        raise ConfigError(
            f"cluster.nodes={cluster.nodes} is more than {MAX_NODES}. HINT: set cluster.nodes to what the job needs."
        )
    for name, optional in (("cluster.cpus_per_task", cluster.cpus_per_task), ("cluster.mem_gb", cluster.mem_gb)):
        if optional is not None:
            check_positive(name, optional)
    if cfg.global_batch_size is not None and cfg.global_batch_size < 1:  # 1 itself fits a data-parallel size of 1 only
        raise ConfigError(
            f"global_batch_size={cfg.global_batch_size} must be at least 1. HINT: set global_batch_size=null "
            "(micro_batch_size × data-parallel size), or a multiple of that."
        )
    check_not_negative("keep_checkpoints", cfg.keep_checkpoints)
    check_positive("cluster.nccl.timeout_s", cluster.nccl.timeout_s)
    check_positive("resilience.max_attempts", res.max_attempts)
    for name in (
        "max_timeouts",
        "max_unknown_stops",
        "max_consecutive_failures",
        "max_stops_without_progress",
        "backoff_base_s",
        "backoff_max_s",
        "exclude_host_s",
        "max_restarts",
        "user_error_window_s",
    ):
        check_not_negative(f"resilience.{name}", getattr(res, name))
    for name in ("startup_timeout_s", "hang_timeout_s", "pause_timeout_s", "hang_window_factor", "hang_window_floor_s"):
        if not 0 < getattr(res, name) < math.inf:
            raise ConfigError(f"resilience.{name}={getattr(res, name)} must be positive. HINT: keep the default.")
    if res.hang_window_floor_s > res.hang_timeout_s:
        raise ConfigError(
            f"resilience.hang_window_floor_s={res.hang_window_floor_s} is above resilience.hang_timeout_s="
            f"{res.hang_timeout_s}, the window's ceiling. HINT: lower the floor or raise hang_timeout_s."
        )
    check_stragglers(cfg)
    check_port("task.vllm_server_port", cfg.task.vllm_server_port)


def check_stragglers(cfg: Config) -> None:
    """`resilience.straggler_*`: a ratio above 1 (a node as fast as the others is no straggler), a window, and one
    of the actions node/stragglers.py knows; `swap` only with a spare to swap in, and where stragglers are timed."""
    res = cfg.resilience
    if not 1 < res.straggler_ratio < math.inf:
        raise ConfigError(
            f"resilience.straggler_ratio={res.straggler_ratio} must be above 1 (1.2: 20 % slower than the other "
            "nodes). HINT: keep the default, 1.2."
        )
    check_not_negative("resilience.straggler_s", res.straggler_s)
    if res.straggler_action not in STRAGGLER_ACTIONS:
        raise ConfigError(
            f"resilience.straggler_action={res.straggler_action!r} is not one of {', '.join(STRAGGLER_ACTIONS)}. HINT: "
            "`report` names the slow node; `exclude` also leaves its host out of the next requeue; `swap` replaces "
            "it with a spare (resilience.spare_nodes)."
        )
    if res.straggler_action == STRAGGLER_SWAP:
        check_swap(cfg)


def check_swap(cfg: Config) -> None:
    """`straggler_action=swap` needs a spare to swap in, and a run whose forwards time each node's own pace
    (the engine adapter says where they do not: Engine.straggler_gap): else it could never act."""
    if cfg.resilience.spare_nodes < 1:
        raise ConfigError(
            "resilience.straggler_action=swap has no spare to swap a straggler for (resilience.spare_nodes=0). "
            "HINT: add resilience.spare_nodes=1, or use straggler_action=exclude (left out of the next requeue)."
        )
    strategy = cfg.strategy
    if why := engine_for_strategy(strategy.engine).straggler_gap(strategy.engine, strategy.deepspeed, strategy.fsdp):
        raise ConfigError(
            f"resilience.straggler_action=swap: stragglers are not detected in this run ({why}), so none would "
            "ever be swapped. HINT: use a strategy without that gap (DDP, ZeRO-1/2), or straggler_action=report."
        )


def check_port(field: str, port: int) -> None:
    if not 1 <= port <= MAX_PORT:
        raise ConfigError(f"{field}={port} is not a TCP port. HINT: choose one between 1024 and {MAX_PORT}.")


def check_master_port(base: int, span: int) -> None:
    """Each job listens on base + job id mod span: every port of that range must exist and be unprivileged."""
    highest = MAX_PORT - span + 1
    if not 1024 <= base <= highest:
        raise ConfigError(
            f"cluster.master_port_base={base}: jobs use ports {base} to {base + span - 1} (base + job id mod "
            f"{span}), which must lie in 1024..{MAX_PORT}. HINT: set cluster.master_port_base between 1024 and "
            f"{highest}."
        )


def check_preflight(timeout_s: float, min_free_gb: float | None) -> None:
    if timeout_s <= 0:
        raise ConfigError(f"preflight_timeout_s={timeout_s} must be positive. HINT: set preflight_timeout_s=60.")
    if min_free_gb is not None and min_free_gb < 0:
        raise ConfigError(
            f"preflight_min_free_gb={min_free_gb} is negative. HINT: set it to 0 or more, or null for the estimate."
        )


# #SBATCH options swiftslurm writes itself (render.sbatch_directives), long and short spellings, with the
# setting that owns each; a second copy from cluster.sbatch would contradict the first.
MANAGED_SBATCH = {
    "nodes": "cluster.nodes",
    "N": "cluster.nodes",
    "ntasks-per-node": None,
    "ntasks": None,
    "n": None,  # one wrapper per node starts the node's ranks
    "cpus-per-task": "cluster.cpus_per_task",
    "c": "cluster.cpus_per_task",
    "gpus-per-node": "cluster.gpus_per_node",
    "gpus": "cluster.gpus_per_node",
    "G": "cluster.gpus_per_node",
    "mem": "cluster.mem_gb",
    "partition": "cluster.partition",
    "p": "cluster.partition",
    "account": "cluster.account",
    "A": "cluster.account",
    "qos": "cluster.qos",
    "q": "cluster.qos",
    "constraint": "cluster.constraint",
    "C": "cluster.constraint",
    "exclude": "cluster.exclude",
    "x": "cluster.exclude",
    "time": "cluster.time",
    "t": "cluster.time",
    "signal": "cluster.signal_lead_s",
    "job-name": "run_name",
    "J": "run_name",
    "chdir": "run_dir",
    "D": "run_dir",
    "output": None,
    "o": None,
    "error": None,
    "e": None,
    "open-mode": None,  # logs/ in the run dir
    "requeue": None,
    "no-requeue": None,  # the node side decides requeues
    "array": "array_parallelism",
    "a": "array_parallelism",
}
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# sbatch's one-letter options that swiftslurm does not write, by their long names: cluster.sbatch becomes
# `#SBATCH --KEY=VALUE` lines (and submitit's --KEY=VALUE), which only long names can be.
SBATCH_LONG_NAMES = {
    "w": "nodelist",
    "d": "dependency",
    "b": "begin",
    "k": "no-kill",
    "m": "distribution",
    "s": "oversubscribe",
    "B": "extra-node-info",
    "F": "nodefile",
    "H": "hold",
    "L": "licenses",
    "M": "clusters",
    "O": "overcommit",
    "S": "core-spec",
    "W": "wait",
}


def sbatch_option(key: Any) -> str:
    """The sbatch option a cluster.sbatch key stands for: `--mail_type` -> `mail-type`, `w` -> `w`."""
    option = str(key).lstrip("-")
    return option if len(option) == 1 else option.replace("_", "-")


def check_sbatch_extra(sbatch: Mapping[str, Any]) -> None:
    for key in sbatch:
        option = sbatch_option(key)
        if option not in MANAGED_SBATCH:
            check_long_name(key, option, sbatch[key])
            continue
        home = MANAGED_SBATCH[option]
        fix = f"set {home} instead" if home else "remove it; logs go to the run dir and requeues are swiftslurm's"
        if home == "array_parallelism":
            fix = "sweep with -m and set array_parallelism=N instead"
        raise ConfigError(
            f"cluster.sbatch.{key} duplicates #SBATCH --{option}, which swiftslurm writes itself"
            f"{f' from {home}' if home else ''}. HINT: {fix}."
        )


def check_long_name(key: Any, option: str, value: Any) -> None:
    """A one-letter key would be written `--w=...`, which sbatch refuses: name its long option instead."""
    if len(option) != 1:
        return
    long_name = SBATCH_LONG_NAMES.get(option)
    fix = f"cluster.sbatch.{long_name}={value}" if long_name else "the option's long name (`man sbatch`)"
    raise ConfigError(
        f"cluster.sbatch.{key} is sbatch's one-letter -{option}, which would be written as `#SBATCH --{option}=...`"
        f" and refused by sbatch. HINT: write {fix}."
    )


def check_env_names(env: Mapping[str, Any]) -> None:
    for name in env:
        if not _ENV_NAME.match(str(name)):
            raise ConfigError(
                f"cluster.env.{name} is not an environment variable name. HINT: use letters, digits and _, "
                "not starting with a digit."
            )


def _check_strings(field: str, items: Iterable[Any], what: str, example: str) -> None:
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"{field} holds {item!r}, not {what}. HINT: give each as a string: {example}.")


def check_choices(cfg: Config) -> None:
    """Enumerated fields, and combinations of group choices that cannot work."""
    engine = engine_for_strategy(cfg.strategy.engine)  # refuses an unknown one
    _choice("cluster.scheduler", cfg.cluster.scheduler, SCHEDULERS)
    _choice("task.command", cfg.task.command, engine.commands)
    check_positive("cluster.nodes", cfg.cluster.nodes)
    check_positive("cluster.cpu_procs_per_node", cfg.cluster.cpu_procs_per_node)
    if cfg.task.vllm_mode is not None:
        _choice("task.vllm_mode", cfg.task.vllm_mode, VLLM_MODES)
    _check_task_fits_engine(cfg)
    _check_one_sharding(cfg.strategy)
    _check_storage(cfg)
    _check_no_secrets(cfg)
    if cfg.array_parallelism < 0:
        raise ConfigError(
            f"array_parallelism={cfg.array_parallelism} is negative. HINT: 0 submits a job per sweep point; N submits "
            "one job array with at most N points running at once."
        )
    check_counts(cfg)
    check_sbatch_extra(cfg.cluster.sbatch)
    check_env_names(cfg.cluster.env)
    # list[str] in the schema, but OmegaConf lets a nested list through
    _check_strings("cluster.setup", cfg.cluster.setup, "a shell line", "cluster.setup=['module load cuda']")
    _check_strings("dataset", cfg.dataset or [], "a dataset", f"dataset=[{EXAMPLE_DATASET}]")
    if cfg.dataset == []:
        raise ConfigError("dataset=[] names no data. HINT: dataset=[tiny], a hub id or dataset=[/abs/train.jsonl].")
    _check_needs_gpus(cfg)
    _check_vllm(cfg)
    if cfg.cluster.scheduler == "local" and cfg.cluster.nodes != 1:
        raise ConfigError(
            f"cluster.nodes={cfg.cluster.nodes} with cluster.scheduler=local: the local executor runs on this "
            "machine only. HINT: use a SLURM cluster (+cluster=local-slurm) or set cluster.nodes=1."
        )


def _check_task_fits_engine(cfg: Config) -> None:
    """A task written for one engine (task.needs_engine) runs only with a strategy of that engine."""
    needs = cfg.task.needs_engine
    if needs is None or needs == cfg.strategy.engine:
        return
    _choice("task.needs_engine", needs, STRATEGY_ENGINES)
    raise ConfigError(
        f"task={cfg.task.name} runs `{engine_for_strategy(needs).launcher} {cfg.task.command}`, which needs "
        f"strategy={needs} (got strategy={cfg.strategy.name}, engine {cfg.strategy.engine}). HINT: add "
        f"strategy={needs}, or use task={cfg.task.command}."
    )


def _check_one_sharding(strategy: StrategyConfig) -> None:
    if strategy.deepspeed and strategy.fsdp:
        raise ConfigError(
            f"strategy sets both deepspeed={strategy.deepspeed} and fsdp={strategy.fsdp}; "
            "they cannot be combined. HINT: set strategy.fsdp=null or strategy.deepspeed=null."
        )


def _check_storage(cfg: Config) -> None:
    storage = cfg.storage
    _choice("storage.kind", storage.kind, ("none", "s3"))
    _choice("storage.addressing_style", storage.addressing_style, ("auto", "path", "virtual"))
    _choice("storage.background_priority", storage.background_priority, BACKGROUND_PRIORITIES)
    if storage.kind == "s3" and not storage.bucket:
        raise ConfigError(
            "storage=s3 needs a bucket. HINT: add storage.bucket=NAME (and storage.endpoint_url=URL for "
            "MinIO, Ceph, SeaweedFS or OSS); credentials come from the usual AWS variables or profile."
        )
    if storage.part_size_mb < S3_MIN_PART_MB:
        raise ConfigError(
            f"storage.part_size_mb={storage.part_size_mb}: S3 multipart parts are at least {S3_MIN_PART_MB} MiB. "
            "HINT: set storage.part_size_mb=16 (8-16 survive flaky links)."
        )
    check_not_negative("storage.wait_at_exit_s", storage.wait_at_exit_s)
    why = (
        (storage.bucket and naming.bucket_refusal(storage.bucket))
        or (storage.endpoint_url and naming.endpoint_refusal(storage.endpoint_url))
        or (storage.prefix and naming.prefix_refusal(storage.prefix))
    )
    if why:
        raise ConfigError(why)
    check_positive("storage.max_attempts", storage.max_attempts)
    check_positive("storage.max_concurrency", storage.max_concurrency)
    if storage.keep < 0:
        raise ConfigError(
            f"storage.keep={storage.keep} is negative. HINT: keep the newest K remote checkpoints, 0 all."
        )


def _check_no_secrets(cfg: Config) -> None:
    """Every field of the composed config (cluster.env, swift.*, storage.endpoint_url, cluster.setup, ...) is
    written to plan.json, config.yaml or job.sbatch: none may hold a credential."""
    from dataclasses import asdict

    if (why := secrets.find_secret(asdict(cfg))) is not None:
        raise ConfigError(why)


def _check_needs_gpus(cfg: Config) -> None:
    if cfg.cluster.gpus_per_node > 0:
        return
    needs = []
    if cfg.strategy.quant_bits:
        needs.append(f"QLoRA (strategy.quant_bits={cfg.strategy.quant_bits}, bitsandbytes)")
    if (engine := engine_for_strategy(cfg.strategy.engine)).needs_gpus:
        needs.append(engine.title)
    if cfg.task.vllm_mode:
        needs.append("vLLM rollouts")
    if needs:
        raise ConfigError(
            f"{' and '.join(needs)} need GPUs, but cluster {cfg.cluster.name} has gpus_per_node=0. "
            "HINT: pick a GPU cluster (+cluster=a100x8, ...) or a CPU strategy (strategy=ddp or zero2)."
        )


def _check_vllm(cfg: Config) -> None:
    if cfg.task.vllm_mode == "server" and not cfg.task.vllm_server_host:
        raise ConfigError(
            "task.vllm_mode=server needs the rollout server's address. HINT: start `swift rollout` on a "
            "node and set task.vllm_server_host=HOST (task.vllm_server_port=PORT), or use vllm_mode=colocate."
        )
    if cfg.task.vllm_mode and cfg.task.rlhf_type != "grpo":
        raise ConfigError(
            f"task.vllm_mode is for GRPO rollouts, but task.rlhf_type={cfg.task.rlhf_type}. "
            "HINT: use task=grpo, or set task.vllm_mode=null."
        )


def check_parallelism(cfg: Config, world_size: int, par: Parallelism) -> None:
    """Megatron degrees must tile the world: tp·pp·cp | world and tp·ep | world / pp."""
    model_parallel = engine_for_strategy(cfg.strategy.engine).has_model_parallelism
    for name, degree in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        check_positive(f"strategy.{name}", degree)
        if degree > 1 and not model_parallel:
            raise ConfigError(
                f"strategy.{name}={degree} needs Megatron, but strategy={cfg.strategy.name} is "
                f"{cfg.strategy.engine}. HINT: use strategy=megatron task=megatron_{cfg.task.command}, "
                f"or set strategy.{name}=1."
            )
    gpus = f"{cfg.cluster.nodes} node(s) × {world_size // cfg.cluster.nodes} = {world_size}"
    if world_size % par.model_parallel:
        raise ConfigError(
            f"tp × pp × cp = {par.tp} × {par.pp} × {par.cp} = {par.model_parallel} does not divide the world "
            f"size ({gpus} GPUs). HINT: choose degrees whose product divides {world_size}, or change the cluster."
        )
    if (world_size // par.pp) % (par.tp * par.ep):
        raise ConfigError(
            f"Expert parallelism ep={par.ep} with tp={par.tp} needs tp × ep = {par.tp * par.ep} to divide "
            f"world size / pp = {world_size // par.pp}. HINT: lower strategy.ep or strategy.tp."
        )
    if par.ep > 1 and not cfg.model.moe:
        raise ConfigError(
            f"strategy.ep={par.ep} but model={cfg.model.name} is not a mixture-of-experts model. "
            "HINT: set strategy.ep=1, or pick a MoE model (model=qwen3-30b-a3b)."
        )
    if par.sequence_parallel and par.tp == 1:
        raise ConfigError(
            "strategy.sequence_parallel=true shards activations over the tensor-parallel group, but tp=1. "
            "HINT: set strategy.tp=2 or more, or strategy.sequence_parallel=false."
        )


def check_run_name(name: str) -> None:
    if not name or "/" in name or name in (".", ".."):
        raise ConfigError(f"run_name={name!r} must be a single path component. HINT: use letters, digits, -_.")


def _is_hub_id(value: str) -> bool:
    """'Qwen/Qwen3-8B' or 'AI-ModelScope/alpaca#500' (org/name), as opposed to a path on disk."""
    if value.startswith((".", "~")) or value.count("/") != 1:
        return False
    return not value.split("#")[0].endswith((".json", ".jsonl", ".csv", ".txt", ".parquet"))


# What the refusal of a real model without data suggests: a hub dataset id, as the recipes name them (conf/recipe/).
EXAMPLE_DATASET = "AI-ModelScope/alpaca-gpt4-data-en"


def datasets_of(cfg: Config) -> list[str]:
    """The data the run trains on. The built-in tiny data is the default of the tiny model alone: a real model
    left on it would train on a toy file in the login node's home directory without a word."""
    if cfg.dataset is not None:
        return list(cfg.dataset)
    if cfg.model.id == "tiny":
        return ["tiny"]
    raise ConfigError(
        f"model={cfg.model.name} has no data: dataset= is not set (the built-in `tiny` data is only the tiny "
        f"model's default). HINT: name it, e.g. dataset=[{EXAMPLE_DATASET}] (a hub id, `id#N` quoted: "
        "'dataset=[\"id#1000\"]') or dataset=[/abs/path/train.jsonl]."
    )


def check_paths(cfg: Config, topology: Topology, cwd: Path) -> None:
    """Local paths must be absolute: ms-swift starts in the run directory, and other nodes in theirs. An absolute
    path on a filesystem the login node sees (its top directory exists here) must exist; one on a filesystem
    only the nodes mount is left to preflight."""
    candidates = [("model.id", cfg.model.id)] + [("dataset", d) for d in cfg.dataset or ()]
    if cfg.cluster.python:
        candidates.append(("cluster.python", cfg.cluster.python))
    for field, value in candidates:
        if value == "tiny" or (field == "dataset" and value in TINY_DATASETS):
            continue
        path = value.split("#")[0] if field == "dataset" else value
        if path.startswith("/"):
            _check_exists(field, value, Path(path))
            if field == "model.id":
                _check_model_dir(value, Path(path))
        elif field == "cluster.python" and "/" not in path:
            continue  # a command found on the nodes' PATH
        elif not _is_hub_id(value) or os.path.exists(cwd / path):
            raise ConfigError(_relative_path_message(field, value, path, topology.nodes, cwd))


# Paths are probed with os.path's predicates, not Path's: they answer False for a path the system cannot look
# up (a name over 255 bytes, a NUL byte), where Path.exists raises.
def _check_exists(field: str, value: str, path: Path) -> None:
    top = Path(*path.parts[:2])
    if top != path and os.path.exists(top) and not os.path.exists(path):
        raise ConfigError(
            f"{field}={value!r} does not exist ({top} is visible here, so the nodes would not find it either). "
            f"HINT: fix the path, or create {path.name} first."
        )


def _check_model_dir(value: str, path: Path) -> None:
    """A local model is a folder with config.json (what transformers and Megatron load); seen from here only
    when its filesystem is mounted here."""
    if os.path.isfile(path) or (os.path.isdir(path) and not os.path.isfile(path / "config.json")):
        what = "is a file" if os.path.isfile(path) else "has no config.json"
        raise ConfigError(
            f"model.id={value!r} {what}: a local model is a Hugging Face model folder (config.json, weights, "
            "tokenizer). HINT: point model.id at that folder, e.g. the one `swift export` or a download wrote."
        )


def _relative_path_message(field: str, value: str, path: str, nodes: int, cwd: Path) -> str:
    where = "ms-swift runs in the run directory" if nodes == 1 else "nodes may not share this working directory"
    absolute = os.path.normpath(cwd / path)
    example = absolute if os.path.exists(absolute) else "/shared/path/to/it"
    shown = f"[{example}]" if field == "dataset" else example
    return (
        f"{field}={value!r} is a relative path on a {nodes}-node run; {where}, not {cwd}. "
        f"HINT: give an absolute path: {field}={shown}."
    )


def check_not_managed(user_args: Mapping[str, Any], managed: Iterable[str]) -> None:
    for name in managed:
        if name in user_args:
            raise ConfigError(
                f"swift.{name} is managed by swiftslurm (the run directory and resume depend on it). "
                "HINT: set run_dir=PATH instead; a re-run with the same run_dir resumes automatically."
            )


def check_not_planned(swift: Mapping[str, Any]) -> None:
    """Batch sizes, parallel degrees and the like are planned once; a `swift.*` copy would contradict them."""
    for name, home in swift_rules.PLANNED_SWIFT_ARGS.items():
        if name in swift:
            raise ConfigError(
                f"swift.{name} is planned by swiftslurm from `{home}` (so batch arithmetic and parallel degrees "
                f"are checked once, in one place). HINT: set {home}=... instead."
            )


def check_swift_args(cfg: Config, args: Mapping[str, Any]) -> None:
    """Every argument must exist in the installed ms-swift, and every value the configuration gives must be one
    ms-swift's parser reads (its type and choices): a typo must not cost a queue wait."""
    from swiftslurm.planning import swift_args

    command = f"{engine_for_strategy(cfg.strategy.engine).launcher} {cfg.task.command}"
    valid = swift_args.valid_args(command)
    for name in args:
        if name not in valid:
            hint = swift_args.suggest(name, command)
            target = swift_rules.PLANNED_SWIFT_ARGS.get(hint or "", f"swift.{hint}")
            fix = f" Did you mean `{target}`?" if hint else f" HINT: see `{command} --help`."
            raise ConfigError(f"swift.{name} is not an argument of `{command}` in the installed ms-swift.{fix}")
    given = {
        k
        for extra in (cfg.strategy.swift, cfg.task.swift, cfg.model.swift, cfg.cluster.swift, cfg.swift)
        for k in extra
    }
    # What the configuration gives, and what swiftslurm's own fields put there (strategy.tuner_type, ...).
    for name in sorted((given | set(swift_rules.PLANNED_SWIFT_ARGS)) & set(args)):
        if (why := swift_args.value_error(name, args[name], command)) is not None:
            raise ConfigError(why.replace(f"swift.{name}=", f"{swift_rules.setting_of(name)}="))
    spec = swift_args.arg_specs(command).get("tuner_type")
    tuners = swift_rules.tuner_choices(spec and (spec.choices or swift_args.literal_choices(spec.type)))
    if (why := swift_rules.refusal(args, command, tuners) or hardware.refusal(args, cfg.cluster.gpu_type)) is not None:
        raise ConfigError(why)


NO_TIME_LIMIT = 0  # parse_slurm_time of UNLIMITED or INFINITE, SLURM's spellings of "no limit"


def parse_slurm_time(text: str) -> int:
    """cluster.time (SLURM's grammar: slurm.parse_time) -> whole minutes, rounded up; UNLIMITED or INFINITE
    (any case) -> NO_TIME_LIMIT."""
    try:
        seconds = parse_time(str(text))
    except ValueError as err:
        raise ConfigError(
            f"cluster.time={text!r} is not a SLURM time limit. HINT: use MM, HH:MM:SS, D-HH:MM:SS or UNLIMITED, "
            "e.g. cluster.time=4:00:00 or cluster.time=1-12:00:00."
        ) from err
    if seconds is None:
        return NO_TIME_LIMIT
    if seconds <= 0:
        raise ConfigError(f"cluster.time={text!r} is zero. HINT: give a positive limit, e.g. 4:00:00.")
    return -(-seconds // 60)


def check_signal_lead(lead_s: int, time_min: int) -> None:
    if lead_s < 1 or (time_min != NO_TIME_LIMIT and lead_s >= time_min * 60):
        fits = 120 if time_min == NO_TIME_LIMIT else max(1, min(120, time_min * 60 // 2))
        raise ConfigError(
            f"cluster.signal_lead_s={lead_s} must be between 1 and the time limit ({time_min * 60} s). "
            f"HINT: set cluster.signal_lead_s={fits} (the default 120 leaves room to save), or a longer cluster.time."
        )


def check_slurm_required(cfg: Config) -> None:
    if not cfg.cluster.partition:
        raise ConfigError(
            f"cluster {cfg.cluster.name} has no partition. HINT: set cluster.partition=NAME (`sinfo -s` lists them)."
        )


# cluster.sbatch's spelling of --nodelist (cluster.exclude owns --exclude; a one-letter -w is refused)
NODELIST = ("nodelist",)


def check_host_lists(cluster: ClusterConfig) -> None:
    """cluster.exclude and cluster.sbatch.nodelist reach `#SBATCH` as written, and the node expands the exclusions
    itself: each must be a host list SLURM takes (slurm_env.hostlist_problem, no SLURM needed)."""
    lists = {"cluster.exclude": cluster.exclude}
    lists |= {f"cluster.sbatch.{key}": value for key, value in cluster.sbatch.items() if sbatch_option(key) in NODELIST}
    for field, value in lists.items():
        if value is None or (problem := hostlist_problem(str(value))) is None:
            continue
        fix = repaired_hostlist(str(value))
        example = f"'{field}=\"{fix or 'node[01-04,7]'}\"'"
        hint = example if fix else f"write {HOSTLIST_FORM}, e.g. {example}, or leave {field} out"
        raise ConfigError(f"{field}={str(value)!r} is not a SLURM host list: {problem}. HINT: {hint}.")


# A SLURM name (partition, account, QOS, GPU type): what slurm.conf and sacctmgr accept without quoting.
_SLURM_NAME = re.compile(r"^[\w.+-]+$", re.ASCII)
_FEATURE_OPERATORS = re.compile(r"[&|,]")


def check_slurm_strings(cfg: Config, run_name: str) -> None:
    """Strings bound for `#SBATCH` lines, checked in SLURM's grammar and named by the setting behind them:
    a partition list (comma-separated), one account, one QOS, a constraint expression, a GPU type."""
    cluster = cfg.cluster
    bound = [
        ("run_name", run_name),
        *((f"cluster.{name}", getattr(cluster, name)) for name in ("partition", "account", "qos", "constraint")),
        *((f"cluster.sbatch.{key}", value) for key, value in cluster.sbatch.items()),
    ]
    for field, value in bound:
        if value is not None and any(c in str(value) for c in '"\n\r'):
            raise ConfigError(
                f"{field}={str(value)!r} contains a double quote or newline, which an #SBATCH line cannot carry. "
                "HINT: choose a value without them."
            )
    if cluster.partition:
        _check_partitions(cluster.partition)
    for name in ("account", "qos"):
        _check_one_name(f"cluster.{name}", getattr(cluster, name))
    _check_one_name("cluster.gpu_type", cluster.gpu_type)
    if cluster.constraint is not None:
        _check_constraint(cluster.constraint)


def quoted_override(field: str, value: str) -> str:
    """How to type ``field=value`` in a shell so that Hydra reads one string (commas, brackets, `&`)."""
    return f"'{field}=\"{value}\"'" if re.search(r"[^\w./:@+-]", value) else f"{field}={value}"


def _check_partitions(partition: str) -> None:
    """`--partition` takes one name or a comma-separated list of names (the job runs in the first that can)."""
    names = [p for p in re.split(r"[\s,]+", partition) if p]
    fix = quoted_override("cluster.partition", ",".join(names))
    if not names:
        raise ConfigError(
            f"cluster.partition={partition!r} names no partition. HINT: set cluster.partition=NAME (`sinfo -s`)."
        )
    if any(c.isspace() for c in partition):
        raise ConfigError(
            f"cluster.partition={partition!r} contains a space: SLURM separates partitions by commas. HINT: {fix}."
        )
    if names != partition.split(","):
        raise ConfigError(f"cluster.partition={partition!r} has an empty name in its list. HINT: {fix}.")
    for name in names:
        if not _SLURM_NAME.match(name):
            raise ConfigError(
                f"cluster.partition={partition!r}: {name!r} is not a partition name (letters, digits, `._+-`). "
                "HINT: set cluster.partition to a name `sinfo -s` lists, e.g. cluster.partition=gpu."
            )


def _check_one_name(field: str, value: str | None) -> None:
    """An account, a QOS, a GPU type: one name each (sbatch takes no list there)."""
    if value is None or _SLURM_NAME.match(value):
        return
    several = len([w for w in re.split(r"[\s,;:]+", value) if w]) > 1
    what = "several names" if several else "characters a SLURM name has not"
    names = [w for w in re.split(r"[^\w.+-]+", value, flags=re.ASCII) if re.search(r"[A-Za-z0-9]", w)]
    fix = f"{field}={names[0]}" if names else f"{field}=NAME"
    listing = {
        "cluster.account": " (`sacctmgr show assoc user=$USER` lists yours)",
        "cluster.qos": " (`sacctmgr show qos`)",
    }
    raise ConfigError(
        f"{field}={value!r} holds {what}: sbatch takes one (letters, digits, `._+-`). "
        f"HINT: {fix}{listing.get(field, '')}."
    )


def _check_constraint(constraint: str) -> None:
    """SLURM's feature expression: names joined by `&` (and), `|` (or), grouped by () or [] (matching or),
    each name with an optional `*count`; no spaces, no empty operand, brackets closed."""
    if (problem := _constraint_problem(constraint)) is None:
        return
    fixed = re.sub(r"([&|,])[&|,]+", r"\1", re.sub(r"\s+", "&", constraint.strip())).strip("&|,")
    fixed += "]" * (fixed.count("[") - fixed.count("]")) + ")" * (fixed.count("(") - fixed.count(")"))
    fix = quoted_override("cluster.constraint", fixed) if _constraint_problem(fixed) is None else None
    raise ConfigError(
        f"cluster.constraint={constraint!r} {problem}: SLURM joins features with & (and) or | (or). "
        f"HINT: {fix or 'leave cluster.constraint out, or write it as `sinfo -o %f` lists the features'}."
    )


def _constraint_problem(constraint: str) -> str | None:
    if not constraint.strip():
        return "is empty"
    if any(c.isspace() for c in constraint):
        return "contains a space"
    if constraint.count("(") != constraint.count(")") or constraint.count("[") != constraint.count("]"):
        return "has an unclosed bracket"
    if any(not part for part in _FEATURE_OPERATORS.split(re.sub(r"[()\[\]]", "", constraint))):
        return "has an operator without a feature on one side"
    return None


def check_shrink(cfg: Config, topology: Topology, par: Parallelism, batch: BatchPlan, args: Mapping[str, Any]) -> None:
    """`resilience.min_nodes` (opt-in resume on fewer nodes): a count between 1 and `cluster.nodes`, a global
    batch every allowed node count divides into whole gradient-accumulation steps, a strategy whose
    checkpoints load at a smaller world size (the engine adapter says), and a shape that fits memory."""
    least = cfg.resilience.min_nodes
    if least is None or least == topology.nodes:
        return
    check_positive("resilience.min_nodes", least)
    if least > topology.nodes:
        raise ConfigError(
            f"resilience.min_nodes={least} is above cluster.nodes={topology.nodes}: a run never grows past the "
            f"planned nodes. HINT: set resilience.min_nodes to at most {topology.nodes}, or leave it out."
        )
    if (why := engine_for_strategy(cfg.strategy.engine).reshard_refusal(args)) is not None:
        raise ConfigError(why)
    data_parallel = {n: n * topology.procs_per_node // par.model_parallel for n in range(least, topology.nodes + 1)}
    _check_batch_divides(least, batch, data_parallel)
    if (why := shrunk_shape_refusal(cfg, least)) is not None:  # the fewest nodes hold the most per GPU
        raise ConfigError(why)


def check_spares(cfg: Config, topology: Topology) -> None:
    """`resilience.spare_nodes` (opt-in hot spares): only where a spare can ever take a lost node's place."""
    spares = cfg.resilience.spare_nodes
    check_not_negative("resilience.spare_nodes", spares)
    if spares == 0:
        return
    if (why := spares_refusal(cfg, topology)) is not None:
        raise ConfigError(f"resilience.spare_nodes={spares} {why}")


def spares_refusal(cfg: Config, topology: Topology) -> str | None:
    """Why spares cannot work with this plan (the rest of a one-line error after `resilience.spare_nodes=K`)."""
    if cfg.cluster.scheduler != "slurm":
        return "needs SLURM: a local run has no nodes to stand by. HINT: leave resilience.spare_nodes out."
    if topology.nodes < 2:
        return (
            "on a 1-node plan: its one training node is node 0, whose loss ends the job whatever stands by. "
            "HINT: leave resilience.spare_nodes out, or plan cluster.nodes=2 or more."
        )
    if cfg.resilience.min_nodes is not None and cfg.resilience.min_nodes < topology.nodes:
        return (
            "with resilience.min_nodes: a run that may shrink cannot yet keep spares (its requeue asks for the "
            "training nodes alone). HINT: choose one: leave resilience.min_nodes or resilience.spare_nodes out."
        )
    if cfg.resilience.max_restarts < 1:
        return (
            "with resilience.max_restarts=0: a spare takes over through a restart in place, which that forbids. "
            "HINT: set resilience.max_restarts=1 or more, or leave resilience.spare_nodes out."
        )
    return None


def _check_batch_divides(least: int, batch: BatchPlan, data_parallel: Mapping[int, int]) -> None:
    """Every allowed node count (-> its data-parallel size) keeps the global batch with whole accumulation."""
    for nodes, size in data_parallel.items():
        if batch.global_ % (batch.micro * size) == 0:
            continue
        dividing = math.lcm(*(batch.micro * d for d in data_parallel.values()))
        raise ConfigError(
            f"resilience.min_nodes={least}: on {nodes} node(s) the global batch of {batch.global_} is not a "
            f"multiple of micro_batch_size × data-parallel size = {batch.micro} × {size}, so the run could not "
            f"keep its global batch there. HINT: set global_batch_size to a multiple of {dividing}, or raise "
            "resilience.min_nodes."
        )


def shrunk_shape_refusal(cfg: Config, nodes: int) -> str | None:
    """Why the plan would not fit in GPU memory on ``nodes`` nodes (fewer than planned: ZeRO and FSDP shard
    over fewer ranks, so each holds more; the micro batch stays), or None; the memory planner's estimate.
    CPU clusters and models without a known shape are not checked."""
    return memory_plan.shrunk_refusal(cfg, nodes)
