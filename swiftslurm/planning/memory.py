"""Peak GPU memory per GPU of a plan, before anything is queued (issue 16; calibration in docs/memory.md).

Pure arithmetic on the model's shape (its config.json, or the shipped table data/model_shapes.json for the
hub ids of conf/model/) and the plan: weights, gradients, optimizer states, activations of one micro batch
at max_length, and a fixed overhead. The bytes per parameter of each strategy are what ms-swift 4.6 really
keeps (measured on an H200, tests/gpu/gpu_memory.py), not the textbook 16: DDP full fine-tuning steps bf16
weights with bf16 Adam moments (8 B/param), FSDP2 keeps fp32 weights, gradients and moments (16), DeepSpeed
keeps bf16 weights and fp32 master weights, moments and gradient partitions.

The peak is `persistent + max(act, step + OVERLAP * act)`: weights and optimizer states stay; gradients (and
the optimizer step's buffers) appear while backward frees the activations, so the peak sees the gradients
and about half of the activations (fitted on the full fine-tunes of docs/memory.md: within 2% for DDP and FSDP2).
Nothing here imports torch, Hydra or ms-swift.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swiftslurm.errors import ConfigError

GIB = 2**30
SHAPES_FILE = Path(__file__).resolve().parents[1] / "data" / "model_shapes.json"
OVERLAP = 0.5  # share of the activations still alive when the gradients are (see the module doc)
CUDA_CONTEXT_GIB = 1.4  # CUDA context + cuBLAS workspace: nvidia-smi minus torch's reserved, H200, torch 2.11
NCCL_GIB = 0.5  # NCCL's buffers when there is more than one rank (not calibrated: one GPU was lent)
FRAGMENTATION = 0.08  # allocator's reserved over allocated: 1-14% measured (DeepSpeed highest)
WARN_FRACTION = 0.9  # above this share of the GPU's memory a plan fits only narrowly
DEFAULT_MAX_LENGTH = 2048  # assumed when the plan sets no `swift.max_length`
LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # ms-swift's default `all-linear`


@dataclass(frozen=True)
class ModelShape:
    """The config.json fields that size a decoder-only transformer (Qwen2/Qwen3, dense or MoE)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = False
    experts: int = 0  # MoE: routed experts per layer (0 = dense)
    expert_intermediate: int = 0
    experts_per_token: int = 0
    vision_params: int = 0  # a vision tower's parameters (Qwen3-VL), counted as weights only

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> ModelShape:
        c = config.get("text_config", config)
        heads = int(c["num_attention_heads"])
        return cls(
            hidden=int(c["hidden_size"]),
            intermediate=int(c.get("intermediate_size", 0)),
            layers=int(c["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(c.get("num_key_value_heads", heads)),
            head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
            vocab=int(c["vocab_size"]),
            tied=bool(c.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
            experts=int(c.get("num_experts", 0) or 0),
            expert_intermediate=int(c.get("moe_intermediate_size", 0) or 0),
            experts_per_token=int(c.get("num_experts_per_tok", 0) or 0),
            vision_params=int(config.get("vision_params", 0)),
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def attention_params(self) -> int:
        return self.hidden * (2 * self.q_dim + 2 * self.kv_dim)

    def mlp_params(self) -> int:
        if self.experts:
            return 3 * self.hidden * self.expert_intermediate * self.experts + self.hidden * self.experts
        return 3 * self.hidden * self.intermediate

    def layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.hidden

    def embedding_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def params(self) -> int:
        return self.layers * self.layer_params() + self.embedding_params() + self.hidden + self.vision_params

    def expert_params(self) -> int:
        return self.layers * 3 * self.hidden * self.expert_intermediate * self.experts if self.experts else 0

    def lora_params(self, rank: int) -> int:
        """LoRA A and B of every linear layer of every block (ms-swift's default `all-linear`)."""
        h, q, kv = self.hidden, self.q_dim, self.kv_dim
        mlp_in, mlp_out = (self.expert_intermediate, self.experts) if self.experts else (self.intermediate, 1)
        attention = (h + q) + 2 * (h + kv) + (q + h)
        mlp = (2 * (h + mlp_in) + (mlp_in + h)) * mlp_out
        return self.layers * rank * (attention + mlp)

    def activation_bytes_per_token(self, lora: bool) -> int:
        """Bytes one layer keeps per token for backward, bf16, SDPA attention (no seq² term), measured on
        the H200: layer and norm inputs (fp32 in RMSNorm), q/k/v after norm and RoPE, the attention output,
        SwiGLU's gate, up, activation and product; LoRA adds its dropped-out inputs (12 h, fitted)."""
        mlp = self.experts_per_token * self.expert_intermediate if self.experts else self.intermediate
        return 16 * self.hidden + 8 * mlp + 10 * (self.q_dim + self.kv_dim) + (12 * self.hidden if lora else 0)


@dataclass(frozen=True)
class Setup:
    """What of a plan sizes its memory: strategy, sharding degrees, batch shape, tuner."""

    engine: str  # `strategy.engine`: ddp | deepspeed | fsdp | megatron (the key of MODEL_STATES)
    deepspeed: str | None = None  # zero0..zero3, zero2_offload, zero3_offload
    full: bool = False  # full fine-tune (else LoRA)
    lora_rank: int = 8
    quant_bits: int | None = None
    data_parallel: int = 1  # ranks that shard ZeRO/FSDP/distributed-optimizer states
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    micro_batch: int = 1
    max_length: int = DEFAULT_MAX_LENGTH
    gradient_checkpointing: bool = True  # recompute in backward (the adapter says whether the engine does)
    weight_bytes: int = 2  # bf16; 4 for float32 models
    world_size: int = 1


@dataclass(frozen=True)
class Estimate:
    """Peak memory of one GPU, in bytes, by part."""

    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    def gib(self) -> float:
        return self.total / GIB

    def parts(self) -> str:
        named = zip(("weights", "grads", "optimizer", "activations", "overhead"), self._fields(), strict=True)
        return ", ".join(f"{name} {value / GIB:.1f}" for name, value in named)

    def _fields(self) -> tuple[float, ...]:
        return (self.weights, self.gradients, self.optimizer, self.activations, self.overhead)


# ------------------------------------------------------------------------------------------ model states


States = tuple[float, float, float, float]  # (weights, gradients, optimizer, step) bytes per GPU


def model_states(shape: ModelShape, s: Setup) -> States:
    """(weights, gradients, optimizer, step) bytes per GPU; `step` is what exists only from backward to the
    optimizer step (gradients, fp32 gradient partitions, Adam's temporaries), part of `gradients`."""
    return MODEL_STATES[s.engine](shape, s)


def _lora_states(shape: ModelShape, s: Setup) -> States:
    """LoRA in the HF Trainer family: the base is frozen; adapters are fp32 with fp32 grads and Adam moments."""
    weights, lora, n = _weight_bytes(shape, s), shape.lora_params(s.lora_rank), s.data_parallel
    if s.deepspeed in ("zero3", "zero3_offload"):
        weights = weights / n if s.deepspeed == "zero3" else 2 * _largest_layer(shape)
    return weights + 4 * lora, 4 * lora, 8 * lora, 4 * lora


def _replica_states(shape: ModelShape, s: Setup) -> States:
    """DDP: Transformers' AdamW on the model's own dtype, a full replica per rank."""
    if not s.full:
        return _lora_states(shape, s)
    p, b = shape.params(), s.weight_bytes
    return b * p, b * p, 2 * b * p, b * p


def _zero_states(shape: ModelShape, s: Setup) -> States:
    """DeepSpeed ZeRO: bf16 weights, fp32 master weights, moments and gradient partitions over the ranks."""
    if not s.full:
        return _lora_states(shape, s)
    p, n, zero = shape.params(), s.data_parallel, s.deepspeed
    if zero in ("zero2", "zero2_offload"):
        optim = 0.0 if zero == "zero2_offload" else 12 * p / n  # fp32 master + 2 moments, partitioned
        grads = 8 * p / n  # bf16 and fp32 gradient partitions, step buffers (DeepSpeed's estimate: 6 of these 8)
        return 2 * p, grads, optim, grads
    if zero == "zero3":
        grads = 6 * p / n
        return 2 * p / n + 4 * _largest_layer(shape), grads, 12 * p / n, grads  # two layers gathered (DeepSpeed: 4 B)
    if zero == "zero3_offload":  # on the GPU: fetched layers, buckets (~1.2 B/param fitted on one GPU)
        return 1.2 * p / n + 2 * _largest_layer(shape), 0.0, 0.0, 0.0
    if zero == "zero1":
        return 2 * p, 2 * p, 12 * p / n, 2 * p
    return _replica_states(shape, s)  # zero0: DDP's states


def _fsdp_states(shape: ModelShape, s: Setup) -> States:
    """FSDP2: fp32 sharded weights, gradients and moments; one layer unsharded in bf16."""
    if not s.full:
        return _lora_states(shape, s)
    p, n = shape.params(), s.data_parallel
    return 4 * p / n + 2 * _largest_layer(shape), 4 * p / n, 8 * p / n, 4 * p / n


def _weight_bytes(shape: ModelShape, s: Setup) -> float:
    """Frozen or trained weights: quantised linear layers take bits/8 plus ~6% for scales (NF4, double quant)."""
    if not s.quant_bits:
        return float(s.weight_bytes * shape.params())
    linear = shape.layers * (shape.attention_params() + shape.mlp_params())
    return linear * s.quant_bits / 8 * 1.06 + 2 * (shape.params() - linear)


def _largest_layer(shape: ModelShape) -> float:
    return float(max(shape.layer_params(), shape.vocab * shape.hidden))


def _megatron_states(shape: ModelShape, s: Setup) -> States:
    """Megatron: bf16 weights and fp32 main gradients split over TP × PP (experts over EP too); the
    distributed optimizer shards fp32 master weights and moments over the data-parallel ranks as well."""
    experts = shape.expert_params()
    dense = shape.params() - experts
    p = dense / (s.tp * s.pp) + experts / (s.ep * s.tp * s.pp)
    if not s.full:
        lora = shape.lora_params(s.lora_rank) / (s.tp * s.pp)
        return 2 * p + 4 * lora, 4 * lora, 8 * lora, 4 * lora
    return 2 * p, 4 * p, 12 * p / s.data_parallel, 4 * p


# Each `strategy.engine`'s model states; an engine without an entry has no estimate written for it yet.
MODEL_STATES: dict[str, Callable[[ModelShape, Setup], States]] = {
    "ddp": _replica_states,
    "deepspeed": _zero_states,
    "fsdp": _fsdp_states,
    "megatron": _megatron_states,
}
# Each `strategy.engine`'s ranks that shard weights or optimizer states (Setup.data_parallel): DDP replicates.
SHARDS_STATES = {"ddp": False, "deepspeed": True, "fsdp": True, "megatron": True}


# ------------------------------------------------------------------------------------------ activations


def activations(shape: ModelShape, s: Setup) -> float:
    """Activation bytes of one micro batch at max_length. With gradient checkpointing (ms-swift's default)
    each layer keeps its input and one layer is recomputed at a time (×1.5 for its backward's temporaries);
    the logits (bf16, their fp32 copy and its gradient) are large for Qwen's 152k vocabulary."""
    tokens = s.micro_batch * s.max_length / s.cp
    per_layer = shape.activation_bytes_per_token(lora=not s.full) * tokens
    if s.tp > 1:  # tensor parallelism shards what a layer keeps; sequence parallelism its norms and dropouts too
        per_layer /= s.tp if s.sequence_parallel else 1 + (s.tp - 1) * 0.8 / s.tp
    layers = shape.layers  # 1F1B: the first stage holds pp micro batches of layers/pp layers each
    kept = layers * per_layer
    if s.gradient_checkpointing:
        kept = layers * 2 * shape.hidden * tokens + 1.5 * per_layer
    logits = tokens * shape.vocab * 10 / s.tp
    return kept + logits


# ------------------------------------------------------------------------------------------ the estimate


def estimate(shape: ModelShape, s: Setup) -> Estimate:
    weights, grads, optim, step = model_states(shape, s)
    act = activations(shape, s)
    counted = max(act - step, OVERLAP * act)  # the peak is states + max(act, step + OVERLAP * act)
    fixed = CUDA_CONTEXT_GIB * GIB + (NCCL_GIB * GIB if s.world_size > 1 else 0.0)
    overhead = FRAGMENTATION * (weights + grads + optim + counted) + fixed
    return Estimate(weights, grads, optim, counted, overhead)


def shipped_shapes() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(SHAPES_FILE.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def find_shape(model_id: str, tiny_config: dict[str, Any] | None = None) -> ModelShape | None:
    """The model's shape: the tiny model's own config, a local model dir's config.json, or the shipped
    table for a hub id; None when none of them knows it (the dry run then says so, and nothing is refused)."""
    if tiny_config is not None:
        return ModelShape.from_config(tiny_config)
    local = Path(model_id) / "config.json"
    if model_id.startswith("/") and os.path.isfile(local):  # os.path: False for a name too long
        return _local_shape(model_id, local)
    known = shipped_shapes().get(model_id)
    return ModelShape.from_config(known) if known else None


def _local_shape(model_id: str, config_file: Path) -> ModelShape:
    """A local model's shape from its config.json, or a ConfigError naming what is wrong with the file."""
    try:
        config = json.loads(config_file.read_text())
        if not isinstance(config, dict):
            raise TypeError(f"a {type(config).__name__}, not an object")
        return ModelShape.from_config(config)
    except (OSError, ValueError, TypeError, KeyError, ZeroDivisionError) as err:
        what = f"lacks {err}" if isinstance(err, KeyError) else f"cannot be read as a model config ({err})"
        raise ConfigError(
            f"model.id={model_id}: its config.json {what}; transformers and Megatron read the model's shape "
            "from it. HINT: point model.id at a Hugging Face model folder (config.json with hidden_size, "
            "num_hidden_layers, num_attention_heads, vocab_size)."
        ) from None
