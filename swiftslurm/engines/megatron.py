"""`megatron sft|pt`: Megatron-SWIFT (tensor, pipeline, context and expert parallelism).

Facts it rests on, seen on H200s with ms-swift 4.6 and megatron-core 0.19 (docs/gpu.md): the progress line
`{'loss': ..., 'iteration': 'K/N', ...}` is printed by the LAST rank only, so on a multi-node job it is not
in node 0's log; the same line goes to `output_dir/logging.jsonl` (on the shared run dir). (swiftslurm's
progress is its plugin's heartbeat from global rank 0, on node 0, as for the other engine.) Checkpoints are
`checkpoint-N/` holding `iter_000000N/` (mcore distributed format), `latest_checkpointed_iteration.txt`,
`args.json` and safetensors. A resume is `--mcore_model CKPT --finetune false` (full) or `--mcore_adapter
CKPT --finetune false` (LoRA): iteration, optimizer, scheduler and RNG come back from the checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swiftslurm.engines.base import ENGINES_DIR, Engine, argv_value, as_list, is_true

if TYPE_CHECKING:
    from swiftslurm.plan import BatchPlan, Parallelism, Topology
    from swiftslurm.planning.memory import ModelShape


# Settings with which a resumed run would not continue where it stopped, or a commit could hash files still
# being written (Megatron-SWIFT 4.6): why, and what to do instead.
_BREAKS_RESUME = {
    "async_save": (
        "Megatron writes the checkpoint after its save hook returns, so swiftslurm could commit a checkpoint "
        "still being written",
        "leave async_save out; a big checkpoint needs save time instead (cluster.signal_lead_s; "
        "docs/resilience.md, 'Save budget')",
    ),
    "no_save_optim": (
        "a resumed run would not continue where it stopped (its optimizer state is not saved)",
        "leave no_save_optim out",
    ),
    "no_save_rng": (
        "a resumed run would not continue where it stopped (its random state is not saved)",
        "leave no_save_rng out",
    ),
    "no_load_optim": (
        "a resumed run would not continue where it stopped (its optimizer state is not loaded)",
        "leave no_load_optim out",
    ),
    "no_load_rng": (
        "a resumed run would not continue where it stopped (its random state is not loaded)",
        "leave no_load_rng out",
    ),
    # The streaming loader is built without the consumed samples (trainers/utils.py, build_streaming_dataloader);
    # a dataset on disk is sampled from them (MegatronPretrainingRandomSampler).
    "streaming": (
        "Megatron-SWIFT 4.6 does not skip the consumed samples of a stream, so every resumed attempt would train "
        "again on the stream's first batches",
        "leave streaming out (a dataset on disk resumes at its consumed samples, packed or not), or stream with "
        "the Hugging Face engine (task=sft with strategy=zero3, fsdp2, ...), whose resume skips them",
    ),
}


class MegatronEngine(Engine):
    launcher = "megatron"
    title = "Megatron"
    strategy_engines = ("megatron",)
    needs_gpus = True
    has_model_parallelism = True
    # Megatron recomputes by its own settings (recompute_granularity): the estimate keeps every layer's activations.
    gradient_checkpointing_arg = None
    plugin = ENGINES_DIR / "megatron_plugin.py"
    callbacks = ("swiftslurm_megatron_stop", "swiftslurm_megatron_commit")
    torchrun_for_one_process = True
    # finetune: swiftslurm sets it for a resume (false: load iteration, optimizer and RNG from the checkpoint).
    managed_args = frozenset({"output_dir", "add_version", "finetune"})

    def straggler_gap(self, strategy_engine: str, deepspeed: str | None, fsdp: str | None) -> str | None:
        return "the Megatron plugin times no forward"

    def batch_args(self, batch: BatchPlan) -> dict[str, Any]:
        return {"micro_batch_size": batch.micro, "global_batch_size": batch.global_}

    def parallel_args(self, par: Parallelism) -> dict[str, Any]:
        return {
            "tensor_model_parallel_size": par.tp,
            "pipeline_model_parallel_size": par.pp,
            "context_parallel_size": par.cp,
            "expert_model_parallel_size": par.ep,
            "sequence_parallel": par.sequence_parallel,
        }

    def refusal(self, args: Mapping[str, Any]) -> str | None:
        if args.get("vllm_mode"):
            return (
                f"task.vllm_mode={args['vllm_mode']}: strategy=megatron needs a Megatron task without vLLM, as "
                "swiftslurm does not combine vLLM rollouts with Megatron (untested: which processes catch the stop "
                "signal). HINT: use task=grpo with strategy=zero3 (or zero2/fsdp2), or task=megatron_sft."
            )
        for name, (why, fix) in _BREAKS_RESUME.items():
            if is_true(args.get(name)):
                return f"swift.{name}=true: {why}. HINT: {fix}."
        if args.get("quant_bits") is not None or args.get("quant_method") is not None:
            fields = (("strategy.quant_bits", "quant_bits"), ("swift.quant_method", "quant_method"))
            given = " and ".join(f"{field}={args[k]}" for field, k in fields if args.get(k) is not None)
            return (
                f"{given}: Megatron-SWIFT loads the weights through its own bridge and ignores quantisation, so "
                "the run would train in full precision. HINT: set strategy.quant_bits=null and leave quant_method "
                "out, or use strategy=qlora with task=sft."
            )
        if "none" in [str(v) for v in as_list(args.get("report_to"))]:
            # ms-swift 4.6 turns each report_to entry into a callback name: 'none' is a KeyError at start-up.
            return (
                "swift.report_to=none crashes `megatron` 4.6 at start-up (KeyError 'none'). HINT: leave report_to "
                "out (set by a config group such as model=tiny: add ~model.swift.report_to to the command)."
            )
        return None

    def layout_refusal(self, args: Mapping[str, Any], topology: Topology, shape: ModelShape | None) -> str | None:
        """megatron-core's divisibility rules on the model's shape: attention and KV heads split over the
        tensor-parallel group, layers over the pipeline stages (unless the first or last stage's count is set),
        routed experts over the expert-parallel group."""
        if shape is None:
            return None
        tp = int(args.get("tensor_model_parallel_size", 1))
        pp = int(args.get("pipeline_model_parallel_size", 1))
        ep = int(args.get("expert_model_parallel_size", 1))
        for count, what in ((shape.heads, "attention heads"), (shape.kv_heads, "key-value heads")):
            if count % tp:
                return _degree_refusal("tp", tp, count, what, topology.world_size)
        uneven = args.get("decoder_first_pipeline_num_layers") or args.get("decoder_last_pipeline_num_layers")
        if shape.layers % pp and not uneven:
            return _degree_refusal("pp", pp, shape.layers, "layers", topology.world_size)
        if shape.experts and shape.experts % ep:
            return _degree_refusal("ep", ep, shape.experts, "routed experts", topology.world_size)
        return None

    def reshard_refusal(self, args: Mapping[str, Any]) -> str | None:
        return (
            "resilience.min_nodes with `megatron`: swiftslurm has not shown that Megatron's distributed checkpoint "
            "(distributed optimizer, tp/pp/ep layout) resumes at a smaller data-parallel size, with the same "
            "global batch and data position. HINT: leave resilience.min_nodes out (a lost node is then excluded "
            "and the run waits for the planned node count)."
        )

    def resume_args(self, checkpoint: Path, swift_argv: tuple[str, ...]) -> tuple[str, ...]:
        # LoRA checkpoints hold the adapter (peft format): the base model still comes from --model.
        lora = (argv_value(swift_argv, "tuner_type") or "full") != "full"
        return ("--mcore_adapter" if lora else "--mcore_model", str(checkpoint), "--finetune", "false")

    def resume_form(self) -> str:
        return "--mcore_model CKPT --finetune false (full); --mcore_adapter CKPT --finetune false (LoRA)"


def _degree_refusal(name: str, degree: int, count: int, what: str, world_size: int) -> str:
    fits = [d for d in range(1, min(count, world_size) + 1) if count % d == 0 and world_size % d == 0]
    return (
        f"strategy.{name}={degree} does not divide the model's {count} {what} (megatron-core stops at start-up). "
        f"HINT: set strategy.{name} to one of {fits[-6:]}."
    )


def pauses_after(iteration: int, args: Any, saving: bool) -> tuple[bool, bool]:
    """Whether a save, an evaluation follows ``iteration`` (the plugin announces them to the hang watchdog).
    Megatron-SWIFT appends its `default_flow` callback after ours (`callbacks += ['print', 'default_flow']`), so
    its flags are not set yet when ours runs: its rule (ms-swift 4.6, swift/megatron/callbacks/default_flow.py)
    is applied here to the same arguments. ``saving``: a save was asked already (the stop vote)."""
    last = iteration >= args.train_iters
    evaluates = getattr(args, "eval_iters", 0) > 0 and (last or _every(iteration, getattr(args, "eval_steps", None)))
    return saving or last or _every(iteration, getattr(args, "save_steps", None)), bool(evaluates)


def _every(iteration: int, interval: int | None) -> bool:
    return bool(interval) and iteration % int(interval or 1) == 0
