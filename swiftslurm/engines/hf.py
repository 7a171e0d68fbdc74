"""`swift sft|pt|rlhf`: the Hugging Face Trainer family (SFT, continued pre-training, DPO, GRPO, ...)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swiftslurm.ckpt.checkpoint import universal_companion
from swiftslurm.engines import zero_reshard
from swiftslurm.engines.base import ENGINES_DIR, Engine, argv_value, committed_last_step, is_true
from swiftslurm.engines.progress import finished_steps
from swiftslurm.errors import NodeError

if TYPE_CHECKING:
    from swiftslurm.plan import Topology
    from swiftslurm.planning.memory import ModelShape

# The ms-swift plugin that makes DeepSpeed ZeRO train on CPU ranks (gloo).
DEEPSPEED_CPU_PATCH = ENGINES_DIR.parent / "data" / "deepspeed_cpu_patch.py"
# The attention implementations ms-swift 4.6 packs or trains padding-free with (SftArguments._check_padding_free).
FLASH_ATTN_IMPLS = ("flash_attn", "flash_attention_2", "flash_attention_3", "flash_attention_4")
# Settings with which a resumed run would not continue where it stopped, or a commit could hash files still
# being written (ms-swift 4.6 with transformers 5): why, and what to do instead.
_BREAKS_RESUME = {
    "save_only_model": (
        "checkpoints would hold the weights only, so a resume would restart the optimizer, learning-rate "
        "schedule and random state (the Trainer skips the missing files without a word) and a DeepSpeed resume "
        "fails",
        "leave save_only_model out (keep_checkpoints=N bounds the disk the checkpoints take)",
    ),
    "use_flash_ckpt": (
        "DLRover's flash checkpoint writes the files to disk in the background after the save returns, so "
        "swiftslurm could commit a checkpoint still being written",
        "leave use_flash_ckpt out",
    ),
    "resume_only_model": (
        "every requeued attempt resumes from the newest checkpoint, and would load the weights only: the "
        "optimizer, learning-rate schedule and random state would start over",
        "leave resume_only_model out; to start from another run's weights set model.id=/abs/path/checkpoint-N "
        "(full) or swift.adapters=[/abs/path/checkpoint-N] (LoRA)",
    ),
}
# Of a checkpoint's bytes, the 16-bit weights: 2 of the 14 a parameter takes with fp32 Adam state and master
# weights (planning/make.py, CHECKPOINT_GB_PER_B_PARAMS); LoRA's trainable parameters the same.
WEIGHTS_SHARE = 2 / 14


class HfTrainerEngine(Engine):
    launcher = "swift"
    title = "the Hugging Face Trainer"
    strategy_engines = ("ddp", "deepspeed", "fsdp")
    plugin = ENGINES_DIR / "swift_plugin.py"
    callbacks = ("swiftslurm_stop", "swiftslurm_commit")
    # ms-swift's own save-on-signal callback: swiftslurm_stop replaces it (one GPU synchronisation less a step).
    replaced_callbacks = ("graceful_exit",)
    managed_args = frozenset({"output_dir", "add_version", "resume_from_checkpoint"})
    finished_rule = (
        "a committed checkpoint of the planned last step (its manifest says so); with save_strategy=no, "
        "ms-swift's end-of-training summary in logging.jsonl"
    )

    def default_args(self, seed: int) -> dict[str, Any]:
        # data_seed: the data order after a resume is the one an uninterrupted run would have seen.
        return {"data_seed": seed}

    def cpu_args(self, strategy_engine: str) -> dict[str, Any]:
        # Without use_cpu every CPU rank silently trains its own copy (parallel_mode != DISTRIBUTED).
        args: dict[str, Any] = {"use_cpu": True, "fp16": False, "bf16": False}
        if strategy_engine == "deepspeed":
            args["external_plugins"] = [str(DEEPSPEED_CPU_PATCH)]
        return args

    def straggler_gap(self, strategy_engine: str, deepspeed: str | None, fsdp: str | None) -> str | None:
        if (deepspeed or "").startswith("zero3"):
            return "ZeRO-3 gathers parameters inside the forward"
        if fsdp or strategy_engine == "fsdp":
            return "FSDP gathers parameters inside the forward"
        return None

    def needs_torchrun_for_one_process(self, swift_argv: tuple[str, ...]) -> bool:
        # Without torchrun's RANK/WORLD_SIZE/MASTER_ADDR, DeepSpeed's init_distributed looks for them through
        # MPI (mpi_discovery): on a SLURM node with mpi4py and an Open MPI built without PMI, MPI_Init aborts
        # the process (seen on an H200 node with ZeRO-3 on one GPU). torchrun with one process sets them.
        return "--deepspeed" in swift_argv

    def refusal(self, args: Mapping[str, Any]) -> str | None:
        for name, (why, fix) in _BREAKS_RESUME.items():
            if is_true(args.get(name)):
                return f"swift.{name}=true: {why}. HINT: {fix}."
        if is_true(args.get("streaming")) and not _positive(args.get("max_steps")):
            return (
                "swift.streaming=true needs swift.max_steps: a stream has no length, so the Trainer cannot count "
                "the steps of an epoch (it stops at start-up, after the queue wait). HINT: add swift.max_steps=N."
            )
        for name in ("packing", "padding_free"):
            if is_true(args.get(name)) and args.get("attn_impl") not in FLASH_ATTN_IMPLS:
                return (
                    f"swift.{name}=true needs flash attention (ms-swift stops at start-up otherwise, after the queue "
                    f"wait). HINT: add swift.attn_impl=flash_attn (or {', '.join(FLASH_ATTN_IMPLS[1:])})."
                )
        return None

    def layout_refusal(self, args: Mapping[str, Any], topology: Topology, shape: ModelShape | None) -> str | None:
        if args.get("rlhf_type") == "grpo":
            return _grpo_refusal(args, topology)
        return None

    def resume_warnings(self, swift_argv: tuple[str, ...]) -> list[str]:
        # The Trainer fast-forwards the data to the checkpoint's step unless told not to; a stream (ms-swift's
        # DataLoaderDispatcher) is fast-forwarded by reading and encoding every batch before it, on rank 0.
        if is_true(argv_value(swift_argv, "ignore_data_skip")):
            return [
                "warning: swift.ignore_data_skip=true: every resumed attempt starts the data of its epoch again from "
                "the beginning, so it trains again on the batches before its checkpoint. HINT: leave "
                "ignore_data_skip out unless that is what you want."
            ]
        if is_true(argv_value(swift_argv, "streaming")):
            return [
                "warning: swift.streaming=true: a resumed attempt reads and encodes the stream again up to its "
                "checkpoint before its first step, which late in a long run may take longer than "
                "resilience.startup_timeout_s (the attempt then counts as hung). HINT: raise "
                "resilience.startup_timeout_s, or train on a dataset on disk without streaming."
            ]
        return []

    def reshard_refusal(self, args: Mapping[str, Any]) -> str | None:
        # FSDP2 saves a torch distributed checkpoint, which reshards on load. A DeepSpeed ZeRO-1/2 checkpoint
        # holds one optimizer shard per data-parallel rank; the leader converts it to DeepSpeed's universal
        # form for another size (prepare_reshard). ZeRO-3 and offload are not verified that way.
        deepspeed = args.get("deepspeed")
        if deepspeed and (why := zero_reshard.unsupported(str(deepspeed))) is not None:
            return (
                f"resilience.min_nodes with DeepSpeed (deepspeed={deepspeed}): {why}, and a ZeRO checkpoint "
                "holds one optimizer shard per data-parallel rank. HINT: use strategy=zero2 (ZeRO-1/2 without "
                "offload), strategy=ddp, LoRA or strategy=fsdp2, or leave resilience.min_nodes out "
                "(docs/resilience.md, 'Resume on fewer nodes')."
            )
        return None

    def rank_zero_share(self, swift_argv: tuple[str, ...]) -> float:
        # The Trainer saves the model from global rank 0 alone: ZeRO-1/2 hold it whole on every rank, ZeRO-3
        # gathers the 16-bit weights to rank 0 to save them (stage3_gather_16bit_weights_on_model_save, set
        # in ms-swift's zero3 presets); ZeRO's optimizer state is one file per rank. Without ZeRO (DDP, zero0)
        # rank 0 saves the optimizer state too. FSDP2 saves a sharded state dict: every rank its part.
        deepspeed = argv_value(swift_argv, "deepspeed")
        if argv_value(swift_argv, "fsdp"):
            return 0.0
        return WEIGHTS_SHARE if deepspeed and deepspeed != "zero0" else 1.0

    def resume_args(self, checkpoint: Path, swift_argv: tuple[str, ...]) -> tuple[str, ...]:
        return ("--resume_from_checkpoint", str(checkpoint))

    def prepare_reshard(self, checkpoint: Path, swift_argv: tuple[str, ...], data_parallel: int, python: str) -> None:
        # A DeepSpeed ZeRO checkpoint holds one optimizer shard per data-parallel rank and loads only at that
        # size; its universal form loads at any (zero_reshard.py). DDP, LoRA and FSDP2 checkpoints need nothing.
        deepspeed = argv_value(swift_argv, "deepspeed")
        if deepspeed and zero_reshard.needs_universal(zero_reshard.zero_shards(checkpoint), data_parallel):
            zero_reshard.convert(checkpoint, deepspeed, python)

    def resume_args_at(self, checkpoint: Path, swift_argv: tuple[str, ...], data_parallel: int) -> tuple[str, ...]:
        shards = zero_reshard.zero_shards(checkpoint)
        if not (argv_value(swift_argv, "deepspeed") and zero_reshard.needs_universal(shards, data_parallel)):
            return self.resume_args(checkpoint, swift_argv)
        if not zero_reshard.is_whole(checkpoint):  # the leader publishes the resume point only after convert()
            raise NodeError(
                f"{checkpoint} was written by {shards} ranks and this attempt has {data_parallel}, but its "
                f"universal form {universal_companion(checkpoint)} is missing or incomplete. HINT: "
                "node 0's log says why its conversion failed; the next attempt converts it again."
            )
        return zero_reshard.universal_resume_args(checkpoint)

    def reached_last_step(self, output_dir: Path, swift_argv: tuple[str, ...] = ()) -> bool:
        # ms-swift saves the last step whenever it saves at all (its DefaultFlowCallbackNew), and logs the
        # end-of-training summary before the Trainer's on_train_end joins that save's commit: the summary says
        # training is over, not that its result is committed. It counts only when nothing is ever saved.
        if not saves(swift_argv):
            steps = finished_steps(output_dir)
            return steps is not None and steps[0] >= steps[1]
        return committed_last_step(output_dir)


def saves(swift_argv: tuple[str, ...]) -> bool:
    """Whether the trainer saves checkpoints: unless `--save_strategy no` (Transformers' default: steps)."""
    return (argv_value(swift_argv, "save_strategy") or "steps").lower() != "no"


def _positive(value: Any) -> bool:
    """A step count above zero (a value that is not a number is refused later, by its type)."""
    try:
        return int(value) > 0
    except (TypeError, ValueError):
        return value is not None


def _grpo_refusal(args: Mapping[str, Any], topology: Topology) -> str | None:
    """ms-swift 4.6's GRPO rules (rlhf_trainers/args_mixin.py, rollout_mixin.py), on the planned world size:
    groups of `num_generations` completions per prompt must tile the generation batch, and a colocated vLLM
    engine's tensor-parallel group must tile the ranks of one node."""
    generations = _whole(args.get("num_generations"), 8)
    world = topology.world_size
    per_step = _whole(args.get("per_device_train_batch_size"), 1) * world
    steps = args.get("steps_per_generation") or args.get("gradient_accumulation_steps") or 1
    batch = _whole(args.get("generation_batch_size"), per_step * _whole(steps, 1))
    fits = [n for n in range(2, batch + 1) if batch % n == 0]
    fix = (
        f"set swift.num_generations to one of {fits[:6]}" if fits else "set global_batch_size=2 swift.num_generations=2"
    )
    if generations < 2:
        return (
            f"swift.num_generations={generations}: GRPO compares completions of one prompt, so it needs at least 2 "
            f"(ms-swift stops at start-up). HINT: {fix}."
        )
    if batch % generations:
        return (
            f"swift.num_generations={generations} does not divide the generation batch of {batch} completions "
            f"(micro_batch_size × {world} ranks × steps per generation), so prompts would not form whole groups. "
            f"HINT: {fix}, or change global_batch_size."
        )
    tp = _whole(args.get("vllm_tensor_parallel_size"), 1)
    if is_true(args.get("use_vllm")) and args.get("vllm_mode") == "colocate" and topology.procs_per_node % tp:
        return (
            f"swift.vllm_tensor_parallel_size={tp} with task.vllm_mode=colocate: each vLLM engine spans {tp} of a "
            f"node's {topology.procs_per_node} training GPUs, which it must divide. HINT: set "
            f"swift.vllm_tensor_parallel_size to a divisor of {topology.procs_per_node}."
        )
    return None


def _whole(value: Any, default: int) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default  # a value of the wrong type is swift_args.value_error's to name
