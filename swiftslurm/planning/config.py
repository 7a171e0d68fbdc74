"""Schemas for the ``conf/`` groups: dataclasses registered with Hydra's ConfigStore.

Values live in YAML under ``conf/``; the types, defaults and the meaning (with units) of every field live
here, next to each other. ``docs/configuration.md`` is generated from these ``doc`` strings
(``python -m swiftslurm.cli.docgen``). The composed config is turned into a frozen ``JobPlan`` by
``swiftslurm.planning.make.make_plan``; nothing downstream reads the config itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


def doc(default: Any, text: str) -> Any:
    """A dataclass field with a default and its documentation (shown in docs/configuration.md)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


@dataclass
class ModelConfig:
    """What to fine-tune (group ``model/``)."""

    name: str = doc(MISSING, "Short name used in run names, e.g. `qwen3-8b`.")
    id: str = doc(
        MISSING,
        "Model id on the hub (e.g. `Qwen/Qwen3-8B`), an absolute local path, or `tiny` for the "
        "locally built random-initialised Qwen3 (built once into the cache, no network).",
    )
    params_b: float = doc(0.0, "Parameter count, in billions (informational: printed in the plan).")
    moe: bool = doc(False, "Mixture-of-experts model (expert parallelism applies).")
    multimodal: bool = doc(False, "Vision-language model.")
    swift: dict[str, Any] = doc({}, "ms-swift arguments this model needs (e.g. `model_type`, `template`).")


@dataclass
class StrategyConfig:
    """How the model is spread over GPUs (group ``strategy/``)."""

    name: str = doc(MISSING, "Short name used in run names, e.g. `zero3`.")
    engine: str = doc(
        "ddp",
        "Parallel engine: `ddp`, `deepspeed`, `fsdp` (PyTorch FSDP2) or `megatron` (Megatron-SWIFT). The program "
        "follows from it: `megatron` runs `megatron <command>`, the others `swift <command>`.",
    )
    deepspeed: str | None = doc(None, "ms-swift `--deepspeed` preset: zero0..zero3, zero2_offload, zero3_offload.")
    fsdp: str | None = doc(None, "ms-swift `--fsdp` preset (e.g. `fsdp2`).")
    tuner_type: str = doc("lora", "ms-swift `--tuner_type`: lora, full, ... (qlora = lora + `quant_bits`).")
    quant_bits: int | None = doc(None, "Weight quantisation for QLoRA, in bits (4 or 8); needs GPUs.")
    tp: int = doc(1, "Tensor-parallel degree (Megatron), in GPUs.")
    pp: int = doc(1, "Pipeline-parallel degree (Megatron), in stages.")
    cp: int = doc(1, "Context-parallel degree (Megatron), in GPUs.")
    ep: int = doc(1, "Expert-parallel degree (Megatron, MoE models), in GPUs.")
    sequence_parallel: bool = doc(False, "Megatron sequence parallelism (shards activations over the TP group).")
    swift: dict[str, Any] = doc({}, "Extra ms-swift arguments this strategy needs.")


@dataclass
class NcclConfig:
    """Network settings every node exports before ms-swift starts."""

    ib: bool = doc(True, "Use InfiniBand/RoCE (`NCCL_IB_DISABLE=0`); false on Ethernet-only clusters.")
    socket_ifname: str | None = doc(
        None, "Interface for NCCL and Gloo sockets (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`), e.g. `eth0`."
    )
    timeout_s: int = doc(
        1800,
        "Collective timeout, in seconds (ms-swift `--ddp_timeout`; its default is ~208 days, so a hung "
        "rank would hold the allocation for ever).",
    )
    async_error_handling: bool = doc(
        True, "Abort the process on a NCCL error or timeout (`TORCH_NCCL_ASYNC_ERROR_HANDLING=1`)."
    )
    debug: str = doc("WARN", "`NCCL_DEBUG` level: VERSION, WARN, INFO, ABORT or TRACE (NCCL reads any case).")


@dataclass
class ClusterConfig:
    """Where the job runs (group ``cluster/``, added with ``+cluster=NAME``; default: this machine)."""

    name: str = doc("local", "Short name used in messages.")
    scheduler: str = doc("local", "`local` (no SLURM: runs here through submitit's local executor) or `slurm`.")
    nodes: int = doc(1, "Nodes to allocate.")
    gpus_per_node: int = doc(0, "GPUs per node; 0 trains on the CPU.")
    cpu_procs_per_node: int = doc(1, "Training processes per node when `gpus_per_node` is 0.")
    gpu_type: str | None = doc(None, "GPU model for `--gpus-per-node=TYPE:N` (e.g. `a100`); null = any.")
    gpu_memory_gib: float | None = doc(
        None,
        "Memory of one GPU, in GiB as nvidia-smi reports it (A100 80GB: 80); the plan's estimate must fit it "
        "(docs/memory.md); null = not checked.",
    )
    cpus_per_task: int | None = doc(None, "CPU cores per node for the job (`--cpus-per-task`); null = SLURM default.")
    mem_gb: int | None = doc(None, "Memory per node, in GiB (`--mem`); null = SLURM default.")
    partition: str | None = doc(
        None, "SLURM partition (`--partition`), or several separated by commas. Required on SLURM clusters."
    )
    account: str | None = doc(None, "SLURM account (`--account`): one name.")
    qos: str | None = doc(None, "SLURM QOS (`--qos`): one name.")
    constraint: str | None = doc(None, "SLURM node features (`--constraint`), e.g. `a100&ib`, `[rack1|rack2]`.")
    exclude: str | None = doc(
        None, "Nodes never to use (`--exclude`): a SLURM host list such as `node[01-04,7]`, checked before submission."
    )
    time: str = doc("4:00:00", "Time limit per attempt, in SLURM format: MM, HH:MM:SS, D-HH:MM:SS.")
    signal_lead_s: int = doc(
        120,
        "Seconds before the time limit at which SLURM signals the job (`--signal=USR2@N`) so it can save.",
    )
    master_port_base: int = doc(
        10000, "Lowest rendezvous port; each job uses base + job id mod 20000 so jobs sharing a node differ."
    )
    python: str | None = doc(
        None, "Python on the nodes that has swiftslurm and ms-swift; null = the Python running swiftslurm."
    )
    setup: list[str] = doc([], "Shell lines run on each node before training (`module load`, `source venv`).")
    sbatch: dict[str, Any] = doc({}, "More `#SBATCH` options, e.g. `{reservation: x, mail-type: END}`.")
    nccl: NcclConfig = field(default_factory=NcclConfig)
    env: dict[str, str] = doc(
        {}, "More environment variables for every node (e.g. `NCCL_P2P_DISABLE: '1'`, `OMP_NUM_THREADS`)."
    )
    swift: dict[str, Any] = doc({}, "Extra ms-swift arguments this cluster needs.")


@dataclass
class TaskConfig:
    """What kind of training (group ``task/``)."""

    name: str = doc(MISSING, "Short name used in run names, e.g. `sft`.")
    command: str = doc(
        "sft", "Subcommand: `sft`, `pt` or `rlhf` (of `swift`, or of `megatron` with strategy=megatron)."
    )
    needs_engine: str | None = doc(
        None,
        "The `strategy.engine` this task is written for (the Megatron tasks: `megatron`), so another strategy is "
        "refused; null = any. Which program runs follows `strategy.engine` alone.",
    )
    rlhf_type: str | None = doc(None, "For `rlhf`: dpo, grpo, kto, ... (ms-swift `--rlhf_type`).")
    vllm_mode: str | None = doc(None, "GRPO rollouts with vLLM: `colocate` (on the training GPUs) or `server`.")
    vllm_server_host: str | None = doc(None, "For `vllm_mode=server`: host running `swift rollout`.")
    vllm_server_port: int = doc(8000, "For `vllm_mode=server`: its port.")
    swift: dict[str, Any] = doc({}, "Extra ms-swift arguments this task needs.")


@dataclass
class StorageConfig:
    """Object storage for checkpoints (group ``storage/``: none, s3): node 0 uploads every committed checkpoint in
    the background and restores the newest remote one when the run dir has none or an older one (docs/storage.md).
    Credentials come from boto3's chain (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, instance role)."""

    kind: str = doc("none", "`none` or `s3`.")
    bucket: str | None = doc(None, "Bucket name (must exist; S3's rules: 3-63 lowercase letters, digits, `.`, `-`).")
    prefix: str | None = doc(
        None,
        "Key prefix of this run's checkpoints, e.g. `team/runs` (no leading `/`, `//` or `..`); "
        "null = `swiftslurm/{run_name}`.",
    )
    endpoint_url: str | None = doc(
        None, "S3 endpoint for non-AWS stores (MinIO, Ceph RGW, OSS), e.g. `http://s3:8333`."
    )
    region: str | None = doc(None, "Region (`AWS_DEFAULT_REGION` otherwise).")
    addressing_style: str = doc("auto", "`auto`, `path` (MinIO, Ceph, SeaweedFS) or `virtual` (OSS).")
    keep: int = doc(0, "Committed checkpoints kept remotely (never the newest); 0 keeps all.")
    part_size_mb: int = doc(16, "Multipart part size, in MiB (8-16 MiB parts survive flaky links; 64 MiB do not).")
    max_concurrency: int = doc(8, "Parallel parts and files per upload or download.")
    max_attempts: int = doc(10, "Attempts per S3 request (boto3 retries, exponential back-off).")
    wait_at_exit_s: float = doc(300.0, "At the end of an attempt, wait at most this long for pending uploads, in s.")
    background_priority: str = doc(
        "idle", "`idle`: uploads get only CPU and disk time training leaves idle (Linux); `normal`: share it equally."
    )


@dataclass
class ContainerConfig:
    """The image each node's wrapper and ranks run in (group ``container/``: none, pyxis, apptainer, oci; see
    docs/containers.md). The run dir, the model and data paths, the Python (``python: host``), the caches and the
    storage and SLURM files the run needs are mounted at the same paths inside as outside."""

    runtime: str = doc(
        "none", "`none`, `pyxis` (enroot), `apptainer` (or Singularity) or `oci` (SLURM's `--container`)."
    )
    image: str | None = doc(
        None,
        "pyxis: an image reference (`nvcr.io#nvidia/pytorch:24.10-py3`) or a `.sqsh` file; apptainer: a `.sif` file "
        "or sandbox directory; oci: an OCI bundle directory (`config.json` + `rootfs/`) or a root filesystem "
        "directory.",
    )
    python: str = doc(
        "host",
        "The wrapper's Python: `host` = the Python planning the run (`cluster.python`), mounted with its "
        "environment; or the interpreter's path inside the image, which must have swiftslurm and ms-swift.",
    )
    mounts: list[str] = doc(
        [],
        "More mounts, each `SRC:DST` or `SRC:DST:ro` (absolute paths). The paths the run needs are added by "
        "themselves unless `derive_mounts` is false.",
    )
    derive_mounts: bool = doc(
        True,
        "Mount every path the plan needs at the same path inside. false: only `mounts`, and a needed path they "
        "do not cover is refused with the mount to add.",
    )
    env: list[str] = doc([], "More variable names passed into the container (the run's own are passed already).")
    name: str | None = doc(
        None, "pyxis: `--container-name`, reused by the job's steps and its requeues; null = the run name."
    )
    writable: bool = doc(False, "pyxis: `--container-writable` (the image's root filesystem may be written).")


@dataclass
class ResilienceConfig:
    """What happens after an attempt ends (preemption, time limit, failure): see docs/resilience.md."""

    max_attempts: int = doc(50, "Ceiling on attempts for the whole run, preemptions not counted.")
    max_timeouts: int = doc(20, "Attempts that may end at the time limit before the run stops.")
    max_unknown_stops: int = doc(
        5, "Stop signals of unknown cause (SLURM could not say the time limit) that are requeued before the run stops."
    )
    max_consecutive_failures: int = doc(
        3, "Infrastructure failures in a row without a new committed checkpoint before the run stops."
    )
    max_stops_without_progress: int = doc(
        10,
        "Stop signals (preemptions, time-outs) in a row that end attempts without a new committed checkpoint "
        "and are requeued; one more stops the run (the save after the signal does not fit: see "
        "`cluster.signal_lead_s`).",
    )
    backoff_base_s: float = doc(30.0, "Delay before the first retry after a failure, in seconds; doubles each time.")
    backoff_max_s: float = doc(600.0, "Longest retry delay, in seconds.")
    exclude_host_s: float = doc(
        21600.0, "Seconds a host that failed an attempt stays excluded (never more hosts than the partition spares)."
    )
    max_restarts: int = doc(
        5,
        "Restarts in place per allocation: after an `infra` failure with every node alive, the trainer starts "
        "again on the same nodes, in the same job (no requeue); once these are spent the next failure requeues.",
    )
    startup_timeout_s: float = doc(3600.0, "No first training step within this many seconds = hung (killed, retried).")
    hang_timeout_s: float = doc(
        1800.0,
        "No new training step for this many seconds = hung, always: the ceiling of the learned window, and the "
        "window until it is learned (first 3 steps of an attempt).",
    )
    pause_timeout_s: float = doc(
        7200.0,
        "A save, an evaluation or an epoch boundary not over after this many seconds = hung, always; the window "
        "of the first of its kind in an attempt. Later ones get hang_window_factor times the longest of their "
        "kind, never less than hang_timeout_s.",
    )
    hang_window_factor: float = doc(
        5.0,
        "Learned hang window: this many times the 95th percentile of the last 50 step times (saves and "
        "evaluations: the longest of their kind seen, times this).",
    )
    hang_window_floor_s: float = doc(300.0, "The learned hang window is never shorter than this, in seconds.")
    user_error_window_s: float = doc(
        300.0,
        "A Python error before any step within this many seconds of the start is a user error (no retry), on a "
        "run that never trained (no committed checkpoint, no step logged by an earlier attempt).",
    )
    min_nodes: int | None = doc(
        None,
        "Opt-in: after a node is lost and the partition has no healthy node to replace it, requeue on fewer "
        "nodes, never below this many (the global batch stays: gradient accumulation grows); the next requeue "
        "asks for `cluster.nodes` again when they are there. null = `cluster.nodes`: never shrink. See "
        "docs/resilience.md, 'Resume on fewer nodes'.",
    )
    spare_nodes: int = doc(
        0,
        "Opt-in hot spares: the job asks SLURM for `cluster.nodes` + this many nodes; the spares run the wrapper "
        "idle (no trainer, no GPU memory) and, when a training node is lost, the attempt restarts in place on the "
        "survivors plus a spare, from the newest commit, at the same world size (no requeue). Allocated while "
        "idle: the plan shows their cost. See docs/resilience.md, 'Hot spares'.",
    )
    straggler_ratio: float = doc(
        1.2,
        "A node whose training forwards take at least this many times the other nodes' median (each node timed on "
        "its own clock) is slow; see docs/resilience.md, 'Stragglers'.",
    )
    straggler_s: float = doc(
        300.0,
        "A node slow for this many seconds (saves and evaluations do not count) is named a straggler: in "
        "`status` and node 0's log.",
    )
    straggler_action: str = doc(
        "report",
        "`report`: name the straggler, nothing more. `exclude`: also leave its host out of the next requeue, as a "
        "failed host (`exclude_host_s`; never more hosts than the partition spares). `swap` (needs "
        "`spare_nodes`>=1): every node stops at a checkpoint and the attempt restarts in place, a spare at the "
        "straggler's node rank, at the same world size (a restart: `max_restarts`); with no spare left it is "
        "reported only. See docs/resilience.md, 'Stragglers'.",
    )


@dataclass
class Config:
    """The whole run. Top-level switches are given bare: `dry_run=true wait=true run_dir=/path`."""

    model: ModelConfig = MISSING
    strategy: StrategyConfig = MISSING
    task: TaskConfig = MISSING
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    run_name: str | None = doc(
        None, "Run name; null = `{model}-{task}-{strategy}-{cluster}`. In a sweep (`-m`), `-<what varies>` is added."
    )
    run_dir: str | None = doc(None, "Where the run lives; null = `./runs/{run_name}`. Same dir = same run.")
    dataset: list[str] | None = doc(
        None,
        "ms-swift `--dataset` values (hub ids, `id#N`, absolute paths; `tiny`, `tiny-dpo`, `tiny-grpo` = the "
        "built-in ones); null = `[tiny]` for the tiny model, and every other model must name its data.",
    )
    micro_batch_size: int = doc(1, "Samples per GPU (or CPU process) per forward pass.")
    global_batch_size: int | None = doc(
        None, "Samples per optimizer step over all ranks; null = micro_batch_size × data-parallel size."
    )
    seed: int = doc(42, "Random seed (ms-swift `--seed` and `--data_seed`).")
    keep_checkpoints: int = doc(
        0, "Committed checkpoints kept (older ones deleted after each commit; never the newest); 0 keeps all."
    )
    resilience: ResilienceConfig = field(default_factory=ResilienceConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    container: ContainerConfig = field(default_factory=ContainerConfig)
    preflight: bool = doc(
        False,
        "Run the pre-launch checks (docs/operations.md) on the allocation before the first attempt of each job: "
        "network, master port, shared run dir, model/dataset paths, free disk, GPUs, the object store; a failure "
        "stops the run.",
    )
    preflight_timeout_s: float = doc(60.0, "How long the preflight rendezvous and all-reduce may take, in seconds.")
    preflight_min_free_gb: float | None = doc(
        None,
        "Free disk preflight requires in the output dir, in GB; null = an estimate of one checkpoint from "
        "`model.params_b` (14 GB per billion parameters for full fine-tuning, 0.2 for LoRA; at least 1).",
    )
    dry_run: bool = doc(False, "Resolve, validate and print everything; write the run dir; submit nothing.")
    wait: bool = doc(False, "Wait for the job to finish (always true on the local scheduler).")
    array_parallelism: int = doc(
        0,
        "In a `-m` sweep on SLURM: 0 submits one job per point; N submits all points as one job array with at "
        "most N running at once (`--array=...%N`).",
    )
    swift: dict[str, Any] = doc({}, "Any ms-swift argument, given as `swift.<argument>=<value>`; wins over all.")


def register_configs() -> None:
    """Register the schemas so YAML files are type-checked against them (Hydra's ConfigStore)."""
    from hydra.core.config_store import ConfigStore

    # Only the root is registered: group YAMLs are checked when they merge into the typed root, and
    # registering group schemas would list them as selectable options (`model=schema`).
    ConfigStore.instance().store(name="swiftslurm_schema", node=Config)


# Keys under these free-form dicts are open-ended (any ms-swift argument, any variable), so
# `swift.max_steps=40` must add the key, as `++swift.max_steps=40` does, instead of failing Hydra's
# struct check with "Could not override 'swift.max_steps'".
_OPEN_DICT_OVERRIDE = re.compile(r"^(?:[A-Za-z_][\w-]*\.)*(?:swift|env|sbatch)\.[^=]+=")


def open_dict_overrides(overrides: list[str]) -> list[str]:
    """Prefix `++` to plain overrides of keys inside the free-form dicts (`swift.*`, `*.env.*`, ...)."""
    return [f"++{o}" if _OPEN_DICT_OVERRIDE.match(o) else o for o in overrides]
