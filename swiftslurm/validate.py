"""Checks run by make_plan before anything is written or submitted.

Each check raises ConfigError with one message that names the value, the conflict and the fix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from swiftslurm import secrets
from swiftslurm.errors import ConfigError, did_you_mean, one_of
from swiftslurm.storage_spec import BACKGROUND_PRIORITIES
from swiftslurm.tiny import DATASETS as TINY_DATASETS

if TYPE_CHECKING:
    from swiftslurm.config import Config
    from swiftslurm.plan import Parallelism, Topology

ENGINES = ("ddp", "deepspeed", "fsdp", "megatron")
SCHEDULERS = ("local", "slurm")
LAUNCHERS = ("swift", "megatron")
COMMANDS = {"swift": ("sft", "pt", "rlhf"), "megatron": ("sft", "pt", "rlhf")}
VLLM_MODES = ("colocate", "server")
_SLURM_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def _choice(field: str, value: Any, valid: Iterable[str]) -> None:
    valid = tuple(valid)
    if value not in valid:
        raise ConfigError(f"{field}={value!r} is not known.{did_you_mean(str(value), valid)} {one_of(valid)}")


def check_positive(field: str, value: int) -> None:
    if value < 1:
        raise ConfigError(f"{field}={value} must be at least 1. HINT: set {field}=1 or more.")


def check_preflight(timeout_s: float, min_free_gb: float | None) -> None:
    if timeout_s <= 0:
        raise ConfigError(f"preflight_timeout_s={timeout_s} must be positive. HINT: set preflight_timeout_s=60.")
    if min_free_gb is not None and min_free_gb < 0:
        raise ConfigError(
            f"preflight_min_free_gb={min_free_gb} is negative. HINT: set it to 0 or more, or null for the estimate."
        )


def check_choices(cfg: Config) -> None:
    """Enumerated fields, and combinations of group choices that cannot work."""
    _choice("strategy.engine", cfg.strategy.engine, ENGINES)
    _choice("cluster.scheduler", cfg.cluster.scheduler, SCHEDULERS)
    _choice("task.launcher", cfg.task.launcher, LAUNCHERS)
    _choice("task.command", cfg.task.command, COMMANDS[cfg.task.launcher])
    check_positive("cluster.nodes", cfg.cluster.nodes)
    check_positive("cluster.cpu_procs_per_node", cfg.cluster.cpu_procs_per_node)
    if cfg.task.vllm_mode is not None:
        _choice("task.vllm_mode", cfg.task.vllm_mode, VLLM_MODES)
    _check_launcher_matches_engine(cfg)
    _check_storage(cfg)
    _check_no_secrets(cfg)
    if cfg.array_parallelism < 0:
        raise ConfigError(f"array_parallelism={cfg.array_parallelism}: 0 (a job per point) or the most points at once.")
    _check_needs_gpus(cfg)
    _check_vllm(cfg)
    if cfg.cluster.scheduler == "local" and cfg.cluster.nodes != 1:
        raise ConfigError(
            f"cluster.nodes={cfg.cluster.nodes} with cluster.scheduler=local: the local executor runs on this "
            "machine only. HINT: use a SLURM cluster (+cluster=local-slurm) or set cluster.nodes=1."
        )


def _check_launcher_matches_engine(cfg: Config) -> None:
    megatron_task = cfg.task.launcher == "megatron"
    megatron_strategy = cfg.strategy.engine == "megatron"
    if megatron_task and not megatron_strategy:
        raise ConfigError(
            f"task={cfg.task.name} runs `megatron {cfg.task.command}`, which needs strategy=megatron "
            f"(got strategy={cfg.strategy.name}). HINT: add strategy=megatron, or use task={cfg.task.command}."
        )
    if megatron_strategy and not megatron_task:
        raise ConfigError(
            f"strategy=megatron needs a Megatron task (got task={cfg.task.name}, which runs `swift`). "
            f"HINT: use task=megatron_{cfg.task.command} or another strategy (zero3, fsdp2, ...)."
        )
    if cfg.strategy.deepspeed and cfg.strategy.fsdp:
        raise ConfigError(
            f"strategy sets both deepspeed={cfg.strategy.deepspeed} and fsdp={cfg.strategy.fsdp}; "
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
    check_positive("storage.part_size_mb", storage.part_size_mb)
    check_positive("storage.max_attempts", storage.max_attempts)
    check_positive("storage.max_concurrency", storage.max_concurrency)
    if storage.keep < 0:
        raise ConfigError(f"storage.keep={storage.keep}: keep the newest K remote checkpoints (0 keeps all).")


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
    if cfg.strategy.engine == "megatron":
        needs.append("Megatron")
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
    for name, degree in (("tp", par.tp), ("pp", par.pp), ("cp", par.cp), ("ep", par.ep)):
        check_positive(f"strategy.{name}", degree)
        if degree > 1 and cfg.strategy.engine != "megatron":
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


def check_paths(cfg: Config, topology: Topology) -> None:
    """Relative local paths break on multi-node runs: other nodes start in other directories."""
    if topology.nodes == 1:
        return
    candidates = [("model.id", cfg.model.id)] + [("dataset", d) for d in cfg.dataset]
    for field, value in candidates:
        if (
            value == "tiny"
            or (field == "dataset" and value in TINY_DATASETS)
            or value.startswith("/")
            or _is_hub_id(value)
        ):
            continue
        raise ConfigError(
            f"{field}={value!r} is a relative path on a {topology.nodes}-node run; nodes may not share the "
            f"login node's working directory. HINT: give an absolute path on a shared filesystem."
        )


def check_not_managed(user_args: Mapping[str, Any], managed: Iterable[str]) -> None:
    for name in managed:
        if name in user_args:
            raise ConfigError(
                f"swift.{name} is managed by swiftslurm (the run directory and resume depend on it). "
                "HINT: set run_dir=PATH instead; a re-run with the same run_dir resumes automatically."
            )


# ms-swift arguments that restate planned facts; each has one home in the config.
PLANNED_SWIFT_ARGS = {
    "per_device_train_batch_size": "micro_batch_size",
    "micro_batch_size": "micro_batch_size",
    "gradient_accumulation_steps": "global_batch_size",
    "global_batch_size": "global_batch_size",
    "tensor_model_parallel_size": "strategy.tp",
    "pipeline_model_parallel_size": "strategy.pp",
    "context_parallel_size": "strategy.cp",
    "expert_model_parallel_size": "strategy.ep",
    "sequence_parallel": "strategy.sequence_parallel",
    "deepspeed": "strategy.deepspeed",
    "fsdp": "strategy.fsdp",
    "tuner_type": "strategy.tuner_type",
    "quant_bits": "strategy.quant_bits",
    "rlhf_type": "task.rlhf_type",
    "vllm_mode": "task.vllm_mode",
    "seed": "seed",
    "dataset": "dataset",
    "model": "model.id",
    "ddp_timeout": "cluster.nccl.timeout_s",
    # Transformers deletes old checkpoints before the new one is committed; swiftslurm prunes after.
    "save_total_limit": "keep_checkpoints",
}


def check_not_planned(swift: Mapping[str, Any]) -> None:
    """Batch sizes, parallel degrees and the like are planned once; a `swift.*` copy would contradict them."""
    for name, home in PLANNED_SWIFT_ARGS.items():
        if name in swift:
            raise ConfigError(
                f"swift.{name} is planned by swiftslurm from `{home}` (so batch arithmetic and parallel degrees "
                f"are checked once, in one place). HINT: set {home}=... instead."
            )


def check_swift_args(cfg: Config, args: Mapping[str, Any]) -> None:
    """Every argument must exist in the installed ms-swift: a typo must not cost a queue wait."""
    from swiftslurm import swift_args

    command = f"{cfg.task.launcher} {cfg.task.command}"
    valid = swift_args.valid_args(command)
    for name in args:
        if name not in valid:
            hint = swift_args.suggest(name, command)
            fix = f" Did you mean `swift.{hint}`?" if hint else f" HINT: see `{command} --help`."
            raise ConfigError(f"swift.{name} is not an argument of `{command}` in the installed ms-swift.{fix}")


def parse_slurm_time(text: str) -> int:
    """SLURM time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) -> whole minutes, rounded up."""
    match = _SLURM_TIME.match(str(text).strip())
    if not match:
        raise ConfigError(
            f"cluster.time={text!r} is not a SLURM time limit. HINT: use MM, HH:MM:SS or D-HH:MM:SS, "
            "e.g. cluster.time=4:00:00 or cluster.time=1-12:00:00."
        )
    days, a, b, c = match.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # HH:MM:SS
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    else:  # MM[:SS]
        seconds = int(a) * 60 + int(b or 0)
    if seconds <= 0:
        raise ConfigError(f"cluster.time={text!r} is zero. HINT: give a positive limit, e.g. 4:00:00.")
    return -(-seconds // 60)


def check_signal_lead(lead_s: int, time_min: int) -> None:
    if not 0 < lead_s < time_min * 60:
        raise ConfigError(
            f"cluster.signal_lead_s={lead_s} must be between 1 and the time limit ({time_min * 60} s). "
            "HINT: the default 120 leaves room to save; lower it for very short test limits."
        )


def check_slurm_required(cfg: Config) -> None:
    if not cfg.cluster.partition:
        raise ConfigError(
            f"cluster {cfg.cluster.name} has no partition. HINT: set cluster.partition=NAME (`sinfo -s` lists them)."
        )
