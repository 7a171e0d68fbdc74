"""A tiny Qwen3 model, tokenizer and chat dataset, built locally for smoke tests.

No model hub is reachable from the places swiftslurm is tested, so the assets that
`swift sft --model_type qwen3 --template qwen3` needs are generated here: a byte-level
BPE tokenizer (741 tokens) trained on the generated dataset, a randomly initialised
Qwen3 with ~120k parameters (0.5 MB of safetensors), and a `messages` jsonl dataset. Everything is seeded, so
two builds give byte-identical files.

Two RLHF datasets sit beside the chat dataset (conf names `tiny-dpo`, `tiny-grpo`, `DATASETS`): preference
pairs for `swift rlhf --rlhf_type dpo` (`messages` ending in the chosen answer, plus `rejected_response`) and
arithmetic prompts with a `solution` column for GRPO (rewarded by `REWARD_PLUGIN`). They are added to a
cache that predates them without touching its other files, so the tokenizer, model and chat data (and every
run trained on them) stay as they were.

Other sizes are presets (`PRESETS`, `--preset NAME`): `qwen3-0.5b` is Qwen3-0.6B's shape (28 layers,
hidden 1024) with the same small tokenizer, ~0.44B parameters in bf16, and longer multi-turn chats
(~300-900 tokens each), for GPU runs and throughput measurements (docs/gpu.md).

The assets are built once per cache directory and reused. The build goes into a
temporary sibling directory that is renamed into place when complete: a reader either
sees no directory or a finished one, and concurrent builders (several ranks, several
jobs on a shared file system) cannot corrupt each other; the loser of the rename just
discards its copy.

torch, transformers and tokenizers are imported inside the build functions only, so
importing this module stays cheap on the login side.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Bump when the generated assets change, so old caches are not reused.
ASSETS_VERSION = "tiny-v1"
SEED = 1234
NUM_CONVERSATIONS = 400
VOCAB_SIZE = 1024

MODEL_SUBDIR = "model"
DATASET_FILE = "data/train.jsonl"
# Versioned on their own: a change to them renames the file instead of bumping ASSETS_VERSION (the model).
DPO_FILE = "data/dpo-v1.jsonl"
GRPO_FILE = "data/grpo-v1.jsonl"
NUM_RLHF_SAMPLES = 256
# The ms-swift plugin with the GRPO reward for `tiny-grpo` (`--external_plugins`, `--reward_funcs NAME`).
REWARD_PLUGIN = Path(__file__).resolve().parent / "data" / "tiny_rewards.py"
REWARD_NAME = "swiftslurm_arithmetic"
# The conf `dataset` names of the built-in datasets, and their files in the cache.
DATASETS = {"tiny": DATASET_FILE, "tiny-dpo": DPO_FILE, "tiny-grpo": GRPO_FILE}
# Written last inside the temporary directory: its presence marks a finished build.
MANIFEST_FILE = "tiny_assets.json"

# Qwen3's special tokens that ms-swift's `qwen3` template emits as text: they must be
# single tokens, never split by BPE. The first three are "special" (skipped when
# decoding); the rest are ordinary added tokens, as in Qwen3's own tokenizer.
IM_START, IM_END, ENDOFTEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
ADDED_TOKENS = ["<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# A compact Qwen3-style chat template: ChatML turns, reasoning stripped from assistant
# turns before the last user message, and `enable_thinking=False` adding the empty
# think block that Qwen3 (and ms-swift's `qwen3` template) use for non-thinking mode.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{%- set content = m.content %}"
    "{%- if loop.index0 < ns.last_user and '</think>' in content %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Deliberately tiny, but shaped like a real Qwen3 (GQA, q/k norms, tied embeddings as
# in the small Qwen3 checkpoints) so LoRA target modules and templates behave the same.
MODEL_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class Preset:
    """One size of generated assets. `turns=None` keeps the original tiny dataset (mostly one turn)."""

    version: str  # the cache directory's name; bump when the generated assets change
    model_config: dict[str, Any]
    dtype: str  # "float32" or "bfloat16": how the weights are saved (and `config.dtype`)
    num_conversations: int
    turns: tuple[int, int] | None = None  # user turns per chat, drawn uniformly from [min, max]


def _qwen3_shape(hidden: int, intermediate: int, layers: int) -> dict[str, Any]:
    """A Qwen3 of the small checkpoints' layout (16 query heads, 8 KV heads of 128, tied embeddings)."""
    return {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 4096,
        "tie_word_embeddings": True,
    }


PRESETS: dict[str, Preset] = {
    "tiny": Preset(ASSETS_VERSION, MODEL_CONFIG, "float32", NUM_CONVERSATIONS),
    # Qwen3-0.6B's layer shapes (its 151k vocabulary would be most of the weights; ours has ~1k tokens).
    "qwen3-0.5b": Preset("qwen3-0.5b-v1", _qwen3_shape(1024, 3072, 28), "bfloat16", 4000, turns=(10, 30)),
    # Qwen3-1.7B's layer shapes with 32 layers instead of 28: 1.6B parameters without its vocabulary, the
    # smallest model the save-budget benchmark takes for a real ZeRO-3 full fine-tune (issue: >= 1.5B).
    "qwen3-1.6b": Preset("qwen3-1.6b-v1", _qwen3_shape(2048, 6144, 32), "bfloat16", 4000, turns=(10, 30)),
}

# fmt: off
WORDS = [
    "apple", "river", "stone", "cloud", "green", "tiger", "piano", "lemon", "house", "night",
    "bread", "chair", "ocean", "paper", "light", "sugar", "train", "water", "zebra", "music",
]
# fmt: on


@dataclass(frozen=True)
class TinyAssets:
    """Paths of a finished build: pass them as `--model` and `--dataset`."""

    model_dir: Path
    dataset_path: Path
    dpo_path: Path  # preference pairs: `messages` (ending in the chosen answer) + `rejected_response`
    grpo_path: Path  # arithmetic prompts: `messages` (one user turn) + `solution`

    def dataset(self, name: str) -> Path:
        """The file of the built-in dataset `name` (a key of `DATASETS`)."""
        return self.model_dir.parent / DATASETS[name]


def default_cache_dir(env: Mapping[str, str] | None = None, preset: str = "tiny") -> Path:
    """`$SWIFTSLURM_CACHE/tiny-v1`, else `~/.cache/swiftslurm/tiny-v1` (another preset: its version).

    `env` defaults to `os.environ`; the planner passes the environment of the target.
    """
    env = os.environ if env is None else env
    root = env.get("SWIFTSLURM_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "swiftslurm"
    return base / _preset(preset).version


def _preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def asset_paths(env: Mapping[str, str] | None = None, cache_dir: Path | None = None) -> TinyAssets:
    """Where the assets are (or will be) for `env`/`cache_dir`, without building anything."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(env)
    return _assets_in(cache_dir.expanduser().absolute())


def build_tiny_assets(cache_dir: Path | None = None, preset: str = "tiny") -> TinyAssets:
    """Return the assets of `preset` under `cache_dir`, building them first if missing.

    Safe to call from many processes at once: each builds into its own temporary
    directory and only one rename wins.
    """
    spec = _preset(preset)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir(preset=preset)
    cache_dir = cache_dir.expanduser().absolute()
    assets = _assets_in(cache_dir)
    if cache_dir.exists():
        _check_complete(cache_dir)
        _ensure_rlhf_data(cache_dir)
        return assets

    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    # Same parent, so the final rename stays on one file system and is atomic.
    tmp = Path(tempfile.mkdtemp(prefix=f".{cache_dir.name}.tmp-", dir=cache_dir.parent))
    try:
        # mkdtemp makes the directory 0700; give the renamed cache the usual umask mode.
        os.chmod(tmp, 0o777 & ~_current_umask())
        _build_into(tmp, spec)
        try:
            os.rename(tmp, cache_dir)
        except OSError:
            # Another process finished first (rename onto a non-empty dir fails);
            # its build is identical, so use it.
            if not cache_dir.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _check_complete(cache_dir)
    _ensure_rlhf_data(cache_dir)
    return assets


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _assets_in(cache_dir: Path) -> TinyAssets:
    return TinyAssets(
        model_dir=cache_dir / MODEL_SUBDIR,
        dataset_path=cache_dir / DATASET_FILE,
        dpo_path=cache_dir / DPO_FILE,
        grpo_path=cache_dir / GRPO_FILE,
    )


def _ensure_rlhf_data(cache_dir: Path) -> None:
    """Write the DPO and GRPO datasets into a finished cache where they are missing.

    Each file appears whole or not at all (temporary file + `os.replace`): the file is its own marker, and
    concurrent writers write the same bytes, so whichever rename lands last changes nothing.
    """
    for name, rows in ((DPO_FILE, make_preference_pairs), (GRPO_FILE, make_grpo_prompts)):
        path = cache_dir / name
        if not path.is_file():
            _write_jsonl_atomically(path, rows(NUM_RLHF_SAMPLES, SEED))


def _write_jsonl_atomically(path: Path, rows: list[dict[str, Any]]) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        os.chmod(tmp, 0o666 & ~_current_umask())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _check_complete(cache_dir: Path) -> None:
    # Only a rename of a finished build creates cache_dir, so a missing manifest means
    # someone else wrote there; refuse rather than train on unknown files.
    if not (cache_dir / MANIFEST_FILE).is_file():
        raise RuntimeError(f"{cache_dir} exists but is not a finished tiny-assets build; delete it and retry")


def _build_into(root: Path, spec: Preset = PRESETS["tiny"]) -> None:
    """Build dataset, tokenizer and model into `root`; the manifest is written last."""
    conversations = make_conversations(spec.num_conversations, SEED, spec.turns)
    dataset_path = root / DATASET_FILE
    dataset_path.parent.mkdir(parents=True)
    with open(dataset_path, "w", encoding="utf-8") as f:
        for conv in conversations:
            f.write(json.dumps(conv, ensure_ascii=False) + "\n")

    model_dir = root / MODEL_SUBDIR
    tokenizer = train_tokenizer(conversations, spec.model_config["max_position_embeddings"])
    tokenizer.save_pretrained(model_dir)
    num_params = save_random_model(model_dir, tokenizer, spec.model_config, spec.dtype)

    manifest = {
        "version": spec.version,
        "seed": SEED,
        "vocab_size": len(tokenizer),
        "num_parameters": num_params,
        "num_conversations": len(conversations),
        "model_config": spec.model_config,
    }
    if spec.dtype != "float32":  # the tiny manifest stays as it always was
        manifest["dtype"] = spec.dtype
    (root / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")


def make_conversations(n: int, seed: int, turns: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """`n` synthetic chats (arithmetic and word tasks) in ms-swift `messages` format.

    About one in five has a system prompt and, without `turns`, one in five a second turn, so the
    template's system and multi-turn paths are exercised too. With `turns=(a, b)` each chat has
    between a and b user turns (long samples for GPU throughput runs).
    """
    rng = random.Random(seed)
    conversations = []
    for _ in range(n):
        messages: list[dict[str, str]] = []
        if rng.random() < 0.2:
            messages.append({"role": "system", "content": "You are a concise assistant."})
        count = (2 if rng.random() < 0.2 else 1) if turns is None else rng.randint(*turns)
        for _turn in range(count):
            question, answer = _make_task(rng)
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": answer})
        conversations.append({"messages": messages})
    return conversations


def _make_task(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(5)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    word = rng.choice(WORDS)
    if kind == 0:
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}."
    if kind == 1:
        return f"What is {a} - {b}?", f"{a} - {b} = {a - b}."
    if kind == 2:
        a, b = a % 13, b % 13
        return f"What is {a} times {b}?", f"{a} times {b} is {a * b}."
    if kind == 3:
        return f"Spell '{word}' backwards.", f"'{word}' backwards is '{word[::-1]}'."
    return f"Write '{word}' in capital letters.", f"{word.upper()}"


def make_preference_pairs(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` DPO pairs in ms-swift's format: `messages` ending in the chosen answer, and `rejected_response`.

    The tasks are the chat dataset's; the rejected answer is the same sentence with a wrong result (a number
    off by 1-9, the word not reversed, the word in lower case), so the pair differs in a few tokens only.
    """
    rng = random.Random(f"dpo-{seed}")
    pairs = []
    for _ in range(n):
        question, chosen, rejected = _make_pair(rng)
        messages = [{"role": "user", "content": question}, {"role": "assistant", "content": chosen}]
        pairs.append({"messages": messages, "rejected_response": rejected})
    return pairs


def _make_pair(rng: random.Random) -> tuple[str, str, str]:
    kind = rng.randrange(4)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    wrong = rng.choice([-1, 1]) * rng.randint(1, 9)
    word = rng.choice(WORDS)
    if kind == 0:
        return f"What is {a} + {b}?", f"{a} + {b} = {a + b}.", f"{a} + {b} = {a + b + wrong}."
    if kind == 1:
        return f"What is {a} - {b}?", f"{a} - {b} = {a - b}.", f"{a} - {b} = {a - b + wrong}."
    if kind == 2:
        return (
            f"Spell '{word}' backwards.",
            f"'{word}' backwards is '{word[::-1]}'.",
            f"'{word}' backwards is '{word}'.",
        )
    return f"Write '{word}' in capital letters.", word.upper(), word


def make_grpo_prompts(n: int, seed: int) -> list[dict[str, Any]]:
    """`n` GRPO prompts: one user turn asking a small sum or difference, and its `solution` (the number).

    ms-swift generates the completions and passes `solution` to the reward functions as a keyword.
    """
    rng = random.Random(f"grpo-{seed}")
    prompts = []
    for _ in range(n):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        question, answer = (f"What is {a} + {b}?", a + b) if rng.random() < 0.5 else (f"What is {a} - {b}?", a - b)
        prompts.append({"messages": [{"role": "user", "content": question}], "solution": str(answer)})
    return prompts


def train_tokenizer(
    conversations: list[dict[str, Any]], max_length: int = MODEL_CONFIG["max_position_embeddings"]
) -> Any:
    """Train a byte-level BPE on the chats rendered with the ChatML markup.

    Training on the rendered text (not only the contents) gives the template's
    frequent pieces, e.g. "user\\n", merges of their own. Returns a
    `PreTrainedTokenizerFast` with Qwen3's special tokens, pad and eos set as in Qwen3.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        # All 256 byte symbols, so any text (not just the training text) is encodable.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_render_chatml(conversations), trainer=trainer)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        extra_special_tokens=[IM_START, IM_END],
        model_max_length=max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(ADDED_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _render_chatml(conversations: list[dict[str, Any]]) -> list[str]:
    texts = []
    for conv in conversations:
        parts = [f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in conv["messages"]]
        texts.append("".join(parts))
    return texts


def save_random_model(
    model_dir: Path, tokenizer: Any, model_config: dict[str, Any] = MODEL_CONFIG, dtype: str = "float32"
) -> int:
    """Save a seeded random Qwen3ForCausalLM (safetensors, in `dtype`) sized to `tokenizer`.

    Initialised in float32 on the CPU whatever the dtype, so a build is the same on every machine.
    Returns the number of parameters.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    im_end = tokenizer.convert_tokens_to_ids(IM_END)
    pad = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        bos_token_id=None,
        eos_token_id=im_end,
        pad_token_id=pad,
        **model_config,
    )
    config.dtype = "float32"
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config)  # float32: torch's default dtype
    if dtype != "float32":
        model = model.to(getattr(torch, dtype))
        config.dtype = dtype
    # Greedy by default: sampling would make smoke-test generations differ run to run.
    model.generation_config = GenerationConfig(
        eos_token_id=[im_end, pad], pad_token_id=pad, do_sample=False, max_new_tokens=32
    )
    model.save_pretrained(model_dir)
    return sum(p.numel() for p in model.parameters())


def main(argv: list[str] | None = None) -> None:
    """`python -m swiftslurm.tiny [--cache-dir D] [--preset NAME]`: build (if needed) and print the paths."""
    parser = argparse.ArgumentParser(
        prog="python -m swiftslurm.tiny", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $SWIFTSLURM_CACHE/<preset version>")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="which size (default: tiny)")
    args = parser.parse_args(argv)
    assets = build_tiny_assets(args.cache_dir, args.preset)
    print(f"model_dir={assets.model_dir}")
    print(f"dataset_path={assets.dataset_path}")
    print(f"dpo_path={assets.dpo_path}")
    print(f"grpo_path={assets.grpo_path}")
    print(f"reward_plugin={REWARD_PLUGIN}")


if __name__ == "__main__":
    main()
