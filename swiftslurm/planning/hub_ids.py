"""The released model ids of the hub families swiftslurm knows (Qwen's), so that an id that was never released
(a field guide's `Qwen/Qwen3-7B-Instruct`) is said at plan time: the hub cannot be asked offline, and the job
would stop at its download, after the queue wait. A warning, not a refusal: a newer release is not listed here."""

from __future__ import annotations

# family prefix -> released names (Hugging Face `Qwen/...`, ModelScope the same), as of 2026-12.
RELEASED = {
    "Qwen3-VL-": (
        "2B-Instruct 2B-Thinking 4B-Instruct 4B-Thinking 8B-Instruct 8B-Thinking 32B-Instruct 32B-Thinking "
        "30B-A3B-Instruct 30B-A3B-Thinking 235B-A22B-Instruct 235B-A22B-Thinking"
    ),
    "Qwen3-": (
        "0.6B 0.6B-Base 1.7B 1.7B-Base 4B 4B-Base 8B 8B-Base 14B 14B-Base 32B 30B-A3B 30B-A3B-Base 235B-A22B "
        "4B-Instruct-2507 4B-Thinking-2507 30B-A3B-Instruct-2507 30B-A3B-Thinking-2507 235B-A22B-Instruct-2507 "
        "235B-A22B-Thinking-2507 Next-80B-A3B-Instruct Next-80B-A3B-Thinking Coder-30B-A3B-Instruct "
        "Coder-480B-A35B-Instruct Embedding-0.6B Embedding-4B Embedding-8B Reranker-0.6B Reranker-4B Reranker-8B"
    ),
    "Qwen2.5-VL-": "3B-Instruct 7B-Instruct 32B-Instruct 72B-Instruct",
    "Qwen2.5-": (
        "0.5B 1.5B 3B 7B 14B 32B 72B 0.5B-Instruct 1.5B-Instruct 3B-Instruct 7B-Instruct 14B-Instruct "
        "32B-Instruct 72B-Instruct Math-7B-Instruct Math-72B-Instruct Coder-7B-Instruct Coder-32B-Instruct "
        "Math-RM-72B 7B-Instruct-1M 14B-Instruct-1M"
    ),
}
SUFFIXES = ("-FP8", "-AWQ", "-GPTQ-Int4", "-GPTQ-Int8", "-GGUF", "-MLX")  # quantised uploads of a released model


def unreleased_warning(field: str, model_id: str) -> str | None:
    """One line when ``model_id`` is `Qwen/<family><name>` of a known family but not a released name."""
    org, _, name = model_id.partition("/")
    if org.lower() != "qwen" or not name:
        return None
    family = next((f for f in RELEASED if name.startswith(f)), None)
    if family is None:
        return None
    base = next((name[: -len(s)] for s in SUFFIXES if name.endswith(s)), name)
    released = RELEASED[family].split()
    if base[len(family) :] in released:
        return None
    sizes = ", ".join(f"{family}{r}" for r in released[:8])
    return (
        f"warning: {field}={model_id} is not a released {family.rstrip('-')} model (the hub cannot be asked "
        f"offline; the job would stop at its download). HINT: use one of Qwen/{{{sizes}, ...}}."
    )
