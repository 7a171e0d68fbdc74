"""The rules ms-swift 4.6 applies to its arguments after parsing them (its `__post_init__` methods), applied at
plan time to the merged arguments, so a value that would stop the job at start-up, after its queue wait, or
that ms-swift would silently ignore, is refused here instead.

`swift_args.value_error` checks what the argument annotations say (types, `Literal` choices); this module holds
what only ms-swift's code says: the tuners, DeepSpeed and FSDP presets it knows, the quantisation combinations
it accepts, ranges, and arguments that contradict each other. Rules that depend on the engine (Megatron's
divisibility, GRPO's generation groups) belong to the engine adapters (`Engine.layout_refusal`).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from swiftslurm.engines.base import as_list, is_true
from swiftslurm.errors import did_you_mean, one_of

# ms-swift arguments that restate planned facts; each has one home in the configuration.
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
    "use_vllm": "task.vllm_mode",
    "seed": "seed",
    "dataset": "dataset",
    "model": "model.id",
    "ddp_timeout": "cluster.nccl.timeout_s",
    # Transformers deletes old checkpoints before the new one is committed; swiftslurm prunes after.
    "save_total_limit": "keep_checkpoints",
}


def setting_of(name: str) -> str:
    """The configuration field that sets the ms-swift argument ``name``: its planned home, else `swift.<name>`."""
    return PLANNED_SWIFT_ARGS.get(name, f"swift.{name}")


# swift/arguments/base_args/base_args.py get_supported_tuners (ms-swift 4.6), without tuner plugins.
SWIFT_TUNERS = (
    "lora",
    "full",
    "longlora",
    "adalora",
    "llamapro",
    "adapter",
    "vera",
    "boft",
    "fourierft",
    "reft",
    "bone",
)
# swift/arguments/sft_args.py and rlhf_args.py: the presets in swift/config/ (else a JSON file's path).
DEEPSPEED_PRESETS = ("zero0", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload")
FSDP_PRESETS = ("fsdp2",)
SHARDS_WEIGHTS = ("zero3", "zero3_offload")  # DeepSpeed presets that partition the parameters themselves
BNB_BITS = (4, 8)  # QuantizeArguments.get_quantization_config: bnb supports these only

# (argument, lowest, highest, whether the lowest is allowed): what a value can mean, from ms-swift's and
# transformers' use of it (a dropout of 1 drops everything, a non-positive learning rate trains nothing).
RANGES: tuple[tuple[str, float, float | None, bool], ...] = (
    ("lora_dropout", 0.0, 1.0, True),
    ("num_train_epochs", 0.0, None, False),
    ("learning_rate", 0.0, None, False),
    ("lr", 0.0, None, False),
    ("warmup_ratio", 0.0, 1.0, True),
    ("split_dataset_ratio", 0.0, 1.0, True),
    ("weight_decay", 0.0, None, True),
    ("lora_rank", 1.0, None, True),
    ("lora_alpha", 0.0, None, False),
    ("max_length", 1.0, None, True),
    ("save_steps", 0.0, None, False),
    ("logging_steps", 0.0, None, False),
    ("eval_steps", 0.0, None, False),
    ("train_iters", 1.0, None, True),
    ("dataloader_num_workers", 0.0, None, True),
    ("temperature", 0.0, None, False),
    ("vllm_gpu_memory_utilization", 0.0, 1.0, False),  # vLLM's share of each GPU's memory
)
INCLUSIVE_HIGH = frozenset({"warmup_ratio", "vllm_gpu_memory_utilization"})  # the others' highest value is excluded


def tuner_choices(annotation_choices: tuple[Any, ...] | None) -> tuple[str, ...]:
    """The `--tuner_type` values of a command: its annotation's `Literal` where it has one (`megatron`), else the
    tuners ms-swift's code knows (`swift`, whose annotation is `str`)."""
    return tuple(str(c) for c in annotation_choices) if annotation_choices else SWIFT_TUNERS


def refusal(args: Mapping[str, Any], command: str, tuners: tuple[str, ...]) -> str | None:
    """Why ms-swift would refuse (or silently ignore) these merged arguments at start-up; None when it would not."""
    if (why := _tuner(args, command, tuners)) is not None:
        return why
    for check in (_deepspeed, _fsdp, _precision, _quantisation, _ranges, _dataset_suffixes):
        if (why := check(args)) is not None:
            return why
    return None


def _tuner(args: Mapping[str, Any], command: str, tuners: tuple[str, ...]) -> str | None:
    tuner = str(args.get("tuner_type"))
    if tuner in tuners:
        return None
    if tuner == "qlora":
        return (
            "strategy.tuner_type=qlora is not a tuner of ms-swift 4.6 (QLoRA is LoRA over quantised weights). "
            "HINT: use strategy=qlora (tuner_type=lora with strategy.quant_bits=4)."
        )
    return f"strategy.tuner_type={tuner!r} is not a tuner of `{command}`.{did_you_mean(tuner, tuners)} {one_of(tuners)}"


def _config_file(field: str, value: str, presets: tuple[str, ...]) -> str | None:
    """A preset name, or an absolute path to a JSON file (ms-swift reads it on the nodes, in the run dir)."""
    if value in presets:
        return None
    if not value.endswith(".json") and "/" not in value:
        return f"{field}={value!r} is not a preset of ms-swift 4.6.{did_you_mean(value, presets)} {one_of(presets)}"
    if not value.startswith("/"):
        return (
            f"{field}={value!r} is a relative path: ms-swift reads it on each node, in the run directory. "
            f"HINT: give an absolute path on a shared filesystem, or a preset ({', '.join(presets)})."
        )
    path = Path(value)
    top = Path(*path.parts[:2])
    if top != path and os.path.exists(top) and not os.path.isfile(path):  # os.path: False for a name too long
        return f"{field}={value!r} does not exist. HINT: fix the path, or use a preset ({', '.join(presets)})."
    return None


def _deepspeed(args: Mapping[str, Any]) -> str | None:
    value = args.get("deepspeed")
    if value is None or isinstance(value, dict):
        return None
    return _config_file(setting_of("deepspeed"), str(value), DEEPSPEED_PRESETS)


def _fsdp(args: Mapping[str, Any]) -> str | None:
    value = args.get("fsdp")
    return None if not value else _config_file(setting_of("fsdp"), str(value), FSDP_PRESETS)


def _precision(args: Mapping[str, Any]) -> str | None:
    if is_true(args.get("fp16")) and is_true(args.get("bf16")):
        return "swift.fp16=true and swift.bf16=true: a run trains in one precision. HINT: set swift.fp16=false."
    dtype = args.get("torch_dtype")
    for flag, other in (("fp16", "bfloat16"), ("bf16", "float16")):
        if is_true(args.get(flag)) and dtype == other:
            return (
                f"swift.{flag}=true with swift.torch_dtype={other}: the weights load in one precision and train in "
                f"the other. HINT: set swift.torch_dtype={'float16' if flag == 'fp16' else 'bfloat16'}."
            )
    return None


def _quantisation(args: Mapping[str, Any]) -> str | None:
    bits, method = args.get("quant_bits"), args.get("quant_method")
    if bits is None and method is None:
        return None
    if method is None:
        return (
            f"strategy.quant_bits={bits} without swift.quant_method: ms-swift then loads the model unquantised. "
            "HINT: add swift.quant_method=bnb (strategy=qlora sets it)."
        )
    if bits is None and method != "fp8":
        return f"swift.quant_method={method} needs strategy.quant_bits. HINT: set strategy.quant_bits=4."
    if method == "bnb" and bits not in BNB_BITS:
        return (
            f"strategy.quant_bits={bits} with swift.quant_method=bnb: bitsandbytes has 4 and 8 bits. "
            "HINT: set strategy.quant_bits=4."
        )
    if str(args.get("tuner_type")) == "full":
        return (
            f"strategy.quant_bits={bits} with strategy.tuner_type=full: quantised weights cannot be trained, only "
            "adapters over them. HINT: set strategy.tuner_type=lora, or strategy.quant_bits=null."
        )
    return _quantised_sharding(args, bits)


def _quantised_sharding(args: Mapping[str, Any], bits: Any) -> str | None:
    """ZeRO-3 and FSDP shard the parameters; bitsandbytes' 8-bit ones cannot be, and 4-bit ones only when
    stored in the dtype the other parameters have (transformers/peft: `bnb_4bit_quant_storage`)."""
    sharding = (
        f"strategy.deepspeed={args['deepspeed']}"
        if args.get("deepspeed") in SHARDS_WEIGHTS
        else f"strategy.fsdp={args['fsdp']}"
        if args.get("fsdp")
        else None
    )
    if sharding is None or args.get("quant_method") != "bnb":
        return None
    dtype = str(args.get("torch_dtype") or "bfloat16")
    if bits == 8:
        return (
            f"strategy.quant_bits=8 with {sharding}: bitsandbytes' 8-bit weights cannot be sharded. HINT: use "
            f"strategy.quant_bits=4 swift.bnb_4bit_quant_storage={dtype}, or strategy.deepspeed=zero2."
        )
    if str(args.get("bnb_4bit_quant_storage")) != dtype:
        return (
            f"strategy.quant_bits=4 with {sharding} shards the 4-bit weights only when they are stored as the "
            f"model's dtype ({dtype}). HINT: add swift.bnb_4bit_quant_storage={dtype}."
        )
    return None


def _ranges(args: Mapping[str, Any]) -> str | None:
    for name, low, high, low_ok in RANGES:
        value = args.get(name)
        if value is None or isinstance(value, (bool, list, tuple, dict)):
            continue
        try:
            number = float(value)
        except OverflowError:  # a whole number no float holds
            number = math.inf if value > 0 else -math.inf
        except (TypeError, ValueError):
            continue  # swift_args.value_error names the type
        too_low = number < low or (number == low and not low_ok)
        too_high = high is not None and (number > high if name in INCLUSIVE_HIGH else number >= high)
        if too_low or too_high or not math.isfinite(number):  # nan compares false with every limit
            limits = _range_text(low, high, low_ok, name)
            return f"{setting_of(name)}={value} is out of range: {limits}. HINT: {_range_fix(name)}."
    return None


def _range_text(low: float, high: float | None, low_ok: bool, name: str) -> str:
    lower = f"{'at least' if low_ok else 'above'} {low:g}"
    if high is None:
        return f"it must be a finite number {lower}"
    return f"it must be {lower} and {'at most' if name in INCLUSIVE_HIGH else 'below'} {high:g}"


_RANGE_FIXES: dict[str, str] = {
    "lora_dropout": "set swift.lora_dropout=0.05",
    "num_train_epochs": "set swift.num_train_epochs=1",
    "learning_rate": "set swift.learning_rate=1e-4",
    "lr": "set swift.lr=1e-5",
    "warmup_ratio": "set swift.warmup_ratio=0.05",
    "split_dataset_ratio": "set swift.split_dataset_ratio=0.01",
    "temperature": "set swift.temperature=1.0",
    "vllm_gpu_memory_utilization": "set swift.vllm_gpu_memory_utilization=0.5",
}


def _range_fix(name: str) -> str:
    return _RANGE_FIXES.get(name, f"leave swift.{name} out (ms-swift's default)")


_SUBSET_SUFFIX = re.compile(r"#([^/]*)$")


def _dataset_suffixes(args: Mapping[str, Any]) -> str | None:
    """`id#N` samples N rows (ms-swift's dataset syntax); anything but a positive whole N stops the job."""
    for item in as_list(args.get("dataset")):
        found = _SUBSET_SUFFIX.search(str(item))
        if found and not (found.group(1).isdigit() and int(found.group(1)) > 0):
            base = str(item)[: found.start()]
            return (
                f"dataset={item!r}: the `#N` suffix samples N rows, a positive whole number, not "
                f"{found.group(1)!r}. HINT: write dataset=['{base}#1000'], or leave the suffix out."
            )
    return None
