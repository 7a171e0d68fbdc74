"""What a GPU model can run, from its compute capability: the attention kernels and precisions ms-swift is asked
for must exist on the `cluster.gpu_type` the job gets (FlashAttention-3 is Hopper's, bf16 needs Ampere)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from swiftslurm.engines.base import is_true

# `cluster.gpu_type` (SLURM's GRES type, lower case) -> CUDA compute capability.
COMPUTE_CAPABILITY = {
    "v100": 7.0, "t4": 7.5, "a100": 8.0, "a30": 8.0, "a10": 8.6, "a10g": 8.6, "a40": 8.6, "a6000": 8.6,
    "rtx3090": 8.6, "l4": 8.9, "l40": 8.9, "l40s": 8.9, "rtx4090": 8.9, "h100": 9.0, "h800": 9.0, "h200": 9.0,
    "h20": 9.0, "gh200": 9.0, "b200": 10.0, "gb200": 10.0,
}  # fmt: skip
# ms-swift's `--attn_impl` values -> (lowest capability, highest exclusive or None, the architectures, for people).
ATTENTION_NEEDS = {
    "flash_attn": (8.0, None, "Ampere or newer"),
    "flash_attention_2": (8.0, None, "Ampere or newer"),
    "flash_attention_3": (9.0, 10.0, "Hopper (H100, H200, H20)"),
    "flash_attention_4": (10.0, None, "Blackwell (B200)"),
}


def capability(gpu_type: str | None) -> float | None:
    return COMPUTE_CAPABILITY.get((gpu_type or "").lower().replace("-", "").replace("_", ""))


def refusal(args: Mapping[str, Any], gpu_type: str | None) -> str | None:
    """Why ``args`` ask for a kernel or precision the GPUs of ``gpu_type`` do not have; None when they do (or
    the GPU model is not known)."""
    cc = capability(gpu_type)
    if cc is None:
        return None
    impl = str(args.get("attn_impl"))
    if impl in ATTENTION_NEEDS:
        low, high, arch = ATTENTION_NEEDS[impl]
        if cc < low or (high is not None and cc >= high):
            fix = "flash_attn" if cc >= 8.0 and impl != "flash_attn" else "sdpa"
            return (
                f"swift.attn_impl={impl} needs {arch} GPUs, but cluster.gpu_type={gpu_type} is compute capability "
                f"{cc:g}. HINT: set swift.attn_impl={fix}."
            )
    if cc < 8.0 and (is_true(args.get("bf16")) or args.get("torch_dtype") == "bfloat16"):
        return (
            f"bfloat16 needs Ampere or newer GPUs, but cluster.gpu_type={gpu_type} is compute capability {cc:g}. "
            "HINT: set swift.torch_dtype=float16 swift.fp16=true (and leave bf16 out)."
        )
    return None


def warning(args: Mapping[str, Any], gpu_type: str | None) -> str | None:
    """fp16 on GPUs that have bf16: it may be meant, but it needs loss scaling and overflows where bf16 does not."""
    cc = capability(gpu_type)
    if cc is not None and cc >= 8.0 and (is_true(args.get("fp16")) or args.get("torch_dtype") == "float16"):
        return (
            f"warning: fp16 on cluster.gpu_type={gpu_type}, which has bf16: fp16 needs loss scaling and can "
            "overflow where bf16 does not. HINT: set swift.torch_dtype=bfloat16 (and leave fp16 out) unless "
            "fp16 is meant."
        )
    return None
