"""The memory planner applied to a configuration: the estimate of the dry run, the refusal of a plan that
cannot fit its GPUs (naming the strategies that would), the narrow-fit warning, and `swiftslurm advise`.

The arithmetic is swiftslurm/planning/memory.py's; this module only reads the composed Config (the ms-swift arguments
that size memory, with the precedence of plan._swift_args) and compares with `cluster.gpu_memory_gib`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from swiftslurm import tiny
from swiftslurm.engines.registry import engine_for_strategy
from swiftslurm.errors import ConfigError
from swiftslurm.planning import memory
from swiftslurm.planning.memory import GIB, Estimate, ModelShape, Setup

if TYPE_CHECKING:
    from swiftslurm.plan import JobPlan
    from swiftslurm.planning.config import Config

# Strategies `advise` compares, fastest first when several fit (fewer collectives, no CPU round trips).
CANDIDATES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("strategy=ddp", {"engine": "ddp"}),
    ("strategy=zero2", {"engine": "deepspeed", "deepspeed": "zero2"}),
    ("strategy=fsdp2", {"engine": "fsdp"}),
    ("strategy=zero3", {"engine": "deepspeed", "deepspeed": "zero3"}),
    ("task=megatron_sft strategy=megatron strategy.tp=2", {"engine": "megatron", "tp": 2}),
    ("task=megatron_sft strategy=megatron strategy.tp=4", {"engine": "megatron", "tp": 4}),
    ("task=megatron_sft strategy=megatron strategy.tp=8", {"engine": "megatron", "tp": 8}),
    ("task=megatron_sft strategy=megatron strategy.tp=8 strategy.pp=2", {"engine": "megatron", "tp": 8, "pp": 2}),
    ("strategy=zero3_offload", {"engine": "deepspeed", "deepspeed": "zero3_offload"}),
    ("strategy=qlora", {"engine": "ddp", "quant_bits": 4}),
)


@dataclass(frozen=True)
class Option:
    override: str
    estimate: Estimate
    fits: bool


def swift_value(cfg: Config, key: str, default: Any = None) -> Any:
    """An ms-swift argument as the plan merges them: the user's `swift.*` wins over cluster, model, task, strategy."""
    for extra in (cfg.swift, cfg.cluster.swift, cfg.model.swift, cfg.task.swift, cfg.strategy.swift):
        if extra.get(key) is not None:
            return extra[key]
    return default


def _flag(value: Any) -> bool:
    return str(value).lower() not in ("false", "0", "no")


def setup_of(cfg: Config, nodes: int | None = None) -> Setup:
    """The plan's setup; on ``nodes`` nodes instead of `cluster.nodes` (a run resumed on fewer: the micro batch
    stays, ZeRO and FSDP shard over fewer ranks) when given."""
    s, world = cfg.strategy, (nodes or cfg.cluster.nodes) * max(cfg.cluster.gpus_per_node, 1)
    deepspeed = str(s.deepspeed) if s.deepspeed else None
    if deepspeed and deepspeed.endswith(".json"):  # a config file: its name tells the stage, as ms-swift's presets
        deepspeed = "zero3_offload" if "zero3" in deepspeed and "offload" in deepspeed else deepspeed
    engine = engine_for_strategy(s.engine)
    model_parallel = s.tp * s.pp * s.cp if engine.has_model_parallelism else 1
    dtype = str(swift_value(cfg, "torch_dtype", "bfloat16"))
    return Setup(
        engine=s.engine,
        deepspeed=deepspeed,
        full=s.tuner_type == "full",
        lora_rank=int(swift_value(cfg, "lora_rank", 8)),
        quant_bits=s.quant_bits,
        data_parallel=max(world // model_parallel, 1) if memory.SHARDS_STATES[s.engine] else 1,
        tp=s.tp,
        pp=s.pp,
        ep=s.ep,
        cp=s.cp,
        sequence_parallel=s.sequence_parallel,
        micro_batch=cfg.micro_batch_size,
        max_length=int(swift_value(cfg, "max_length", memory.DEFAULT_MAX_LENGTH)),
        gradient_checkpointing=_recomputes(cfg, s.engine),
        weight_bytes=4 if dtype in ("float32", "fp32") else 2,
        world_size=world,
    )


def _recomputes(cfg: Config, strategy_engine: str) -> bool:
    """Whether ``strategy_engine`` recomputes activations in backward under this config (the adapter names the
    ms-swift argument that says so, on by default; an engine without one keeps them all)."""
    arg = engine_for_strategy(strategy_engine).gradient_checkpointing_arg
    return arg is not None and _flag(swift_value(cfg, arg, True))


def shape_of(cfg: Config) -> ModelShape | None:
    if cfg.model.id == "tiny":
        return memory.find_shape("tiny", tiny.MODEL_CONFIG | {"vocab_size": tiny.VOCAB_SIZE})
    return memory.find_shape(cfg.model.id)


def options(cfg: Config, shape: ModelShape) -> list[Option]:
    """Each candidate strategy's estimate for this model, cluster and batch; fitting ones first, fastest first."""
    base, gpu = setup_of(cfg), (cfg.cluster.gpu_memory_gib or float("inf")) * GIB
    tuner = "full" if base.full else "lora"
    found = []
    for override, changes in CANDIDATES:
        if changes.get("quant_bits") and base.full:
            continue  # QLoRA trains adapters only
        if changes.get("tp", 1) * changes.get("pp", 1) > base.world_size:
            continue
        setup = _candidate(cfg, base, changes)
        text = f"{override} strategy.tuner_type={tuner}" if not changes.get("quant_bits") else override
        est = memory.estimate(shape, setup)
        found.append(Option(text, est, est.total <= gpu))
    fitting = [o for o in found if o.fits]
    return fitting + sorted((o for o in found if not o.fits), key=lambda o: o.estimate.total)


def _candidate(cfg: Config, base: Setup, changes: dict[str, Any]) -> Setup:
    reset = {"deepspeed": None, "quant_bits": None, "tp": 1, "pp": 1, "ep": 1, "cp": 1}
    setup = replace(base, **(reset | changes))
    model_parallel = setup.tp * setup.pp
    dp = base.world_size // model_parallel if memory.SHARDS_STATES[setup.engine] else 1
    return replace(setup, data_parallel=max(dp, 1), gradient_checkpointing=_recomputes(cfg, setup.engine))


def _describe(est: Estimate, gpu_gib: float | None) -> str:
    of = f" of the GPU's {gpu_gib:g} GiB ({100 * est.gib() / gpu_gib:.0f}%)" if gpu_gib else ""
    return f"~{est.gib():.1f} GiB per GPU{of}: {est.parts()} GiB"


def memory_line(cfg: Config) -> str:
    """The dry run's line: the estimate next to the GPU's memory, or why there is none."""
    if cfg.cluster.gpus_per_node == 0:
        return "memory   (CPU training: no GPU estimate)"
    shape = shape_of(cfg)
    if shape is None:
        return (
            f"memory   no estimate: {cfg.model.id} is neither a local model dir with a config.json nor in "
            f"{memory.SHAPES_FILE.name}"
        )
    est = plan_estimate(cfg, shape)
    return f"memory   {_describe(est, cfg.cluster.gpu_memory_gib)} (docs/memory.md)"


def _plan_estimate(cfg: Config, nodes: int | None = None) -> Estimate | None:
    """The plan's estimate (on ``nodes`` nodes when given); None on CPUs, or when the GPU's memory or the
    model's shape is unknown."""
    shape = shape_of(cfg) if cfg.cluster.gpus_per_node and cfg.cluster.gpu_memory_gib else None
    return plan_estimate(cfg, shape, nodes) if shape is not None else None


def plan_estimate(cfg: Config, shape: ModelShape, nodes: int | None = None) -> Estimate:
    """The plan's estimate (on ``nodes`` nodes instead of `cluster.nodes` when given); GRPO with vLLM
    colocated also gives vLLM its share of each GPU's memory."""
    est = memory.estimate(shape, setup_of(cfg, nodes))
    share = float(swift_value(cfg, "vllm_gpu_memory_utilization", 0.9)) if cfg.task.vllm_mode == "colocate" else 0
    return replace(est, overhead=est.overhead + share * (cfg.cluster.gpu_memory_gib or 0) * GIB)


def _vllm_share(cfg: Config) -> str:
    """vLLM colocated with no share set takes ms-swift's default of each GPU (in the overhead): say so, since
    no setting the user sees holds it."""
    if cfg.task.vllm_mode != "colocate" or swift_value(cfg, "vllm_gpu_memory_utilization") is not None:
        return ""
    return " (the overhead holds vLLM's share: swift.vllm_gpu_memory_utilization is unset, ms-swift's default 0.9)"


def check_fits(cfg: Config) -> None:
    """Refuse (ConfigError) a plan whose estimate exceeds the GPU's memory, naming the strategies that fit.
    Nothing is refused when the GPU's memory or the model's shape is unknown."""
    est, gpu_gib = _plan_estimate(cfg), cfg.cluster.gpu_memory_gib
    if est is None or gpu_gib is None or est.gib() <= gpu_gib:
        return
    shape = shape_of(cfg)
    assert shape is not None  # _plan_estimate found it
    fixes = [o.override for o in options(cfg, shape) if o.fits][:3]
    hint = "use " + ", or ".join(fixes) if fixes else "use more GPUs, or a smaller micro_batch_size or max_length"
    raise ConfigError(
        f"{cfg.model.name} with strategy={cfg.strategy.name} ({cfg.strategy.tuner_type}) needs "
        f"{_describe(est, gpu_gib)}{_vllm_share(cfg)}: it cannot fit cluster={cfg.cluster.name}. HINT: {hint} "
        "(`python -m swiftslurm advise ...` lists every strategy's estimate)."
    )


def shrunk_refusal(cfg: Config, nodes: int) -> str | None:
    """Why an attempt on ``nodes`` nodes (fewer than planned: `resilience.min_nodes`) would not fit its GPUs,
    naming the fewest nodes it fits on; None when it fits or nothing is known (CPUs, no shape or GPU size)."""
    est, gpu_gib = _plan_estimate(cfg, nodes), cfg.cluster.gpu_memory_gib
    if est is None or gpu_gib is None or est.gib() <= gpu_gib:
        return None
    fitting = (
        n for n in range(nodes + 1, cfg.cluster.nodes + 1) if (e := _plan_estimate(cfg, n)) and e.gib() <= gpu_gib
    )
    least = next(fitting, cfg.cluster.nodes)  # check_fits has refused a plan that does not fit its own count
    fix = f"raise resilience.min_nodes to {least}, the fewest nodes it fits on" if least < cfg.cluster.nodes else ""
    return (
        f"resilience.min_nodes={nodes}: on {nodes} node(s) {cfg.model.name} with strategy={cfg.strategy.name} "
        f"({cfg.strategy.tuner_type}) would need {_describe(est, gpu_gib)}: a run resumed there would not fit. "
        f"HINT: {fix or 'leave resilience.min_nodes out'}{', or leave it out' if fix else ''} (docs/memory.md)."
    )


def shrink_line(cfg: Config, plan: JobPlan) -> str | None:
    """The dry run's line for a run that may resume on fewer nodes: the range, and the smallest shape's
    gradient accumulation and memory estimate (None when the run never shrinks)."""
    least, planned = plan.resilience.min_nodes, plan.topology.nodes
    if least is None or least >= planned:
        return None
    est = _plan_estimate(cfg, least)
    memory_text = f", est. {est.gib():.1f} GiB/GPU" if est is not None else ""
    return (
        f"resilience  may resume on {least}..{planned} nodes (min_nodes={least}); at {least}: accumulation "
        f"{plan.batch_on(least).grad_accum}{memory_text} (docs/resilience.md)"
    )


def narrow_fit_warning(cfg: Config) -> str | None:
    """One line when the plan fits, but above WARN_FRACTION of the GPU's memory."""
    est, gpu_gib = _plan_estimate(cfg), cfg.cluster.gpu_memory_gib
    if est is None or gpu_gib is None or est.gib() <= memory.WARN_FRACTION * gpu_gib:
        return None
    return (
        f"warning: {cfg.model.name} needs {_describe(est, gpu_gib)}: it fits narrowly (docs/memory.md gives the "
        "estimate's error). HINT: `python -m swiftslurm advise ...` lists the strategies with more room."
    )


def advise_table(cfg: Config) -> str:
    """`advise`'s answer: every strategy's estimate, best first; one line when there is none to give."""
    if cfg.cluster.gpus_per_node == 0:
        return (
            f"nothing to advise: cluster={cfg.cluster.name} trains on the CPU (cluster.gpus_per_node=0), and advise "
            "compares the strategies' GPU memory. HINT: add the GPU cluster of the run (`advise +cluster=NAME ...`)."
        )
    shape = shape_of(cfg)
    if shape is None:
        return memory_line(cfg)
    gpu = cfg.cluster.gpu_memory_gib
    head = (
        f"{cfg.model.name} ({shape.params() / 1e9:.1f}B parameters), {cfg.cluster.nodes} node(s) × "
        f"{cfg.cluster.gpus_per_node} GPU(s) of {gpu or '?'} GiB, micro batch {cfg.micro_batch_size}, "
        f"max_length {setup_of(cfg).max_length}; best first:"
    )
    rows = [f"  {'fits' if o.fits else 'no  '}  {o.estimate.gib():7.1f} GiB  {o.override}" for o in options(cfg, shape)]
    return "\n".join([head, *rows])
