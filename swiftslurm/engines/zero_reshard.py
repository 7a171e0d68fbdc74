"""Resume a DeepSpeed ZeRO-1/2 checkpoint at another data-parallel size, through DeepSpeed's universal checkpoint.

A ZeRO checkpoint (`checkpoint-N/global_stepN/`, named by `checkpoint-N/latest`) holds one optimizer shard per
data-parallel rank (`*zero_pp_rank_R_mp_rank_00_optim_states.pt`), and DeepSpeed loads it only at the size
that wrote it. DeepSpeed's `ds_to_universal` rewrites the shards as one folder per parameter, which loads at
any size when the DeepSpeed config says `checkpoint: {load_universal: true}`; DeepSpeed then reads the tag
from `latest_universal` in the folder the Trainer resumes from (`load_checkpoint(dir, tag=None)`).

The committed checkpoint is never changed (its manifest stays valid). Its universal form is written beside
it, as the companion `checkpoint-N-universal/` (quarantined and pruned with it), and the Trainer resumes
from that folder:

    global_stepN_universal/  ds_to_universal's output (fp32 weights and Adam moments per parameter)
    latest_universal         its tag, written by ds_to_universal
    ds_config.json           the planned DeepSpeed config with checkpoint.load_universal (UNIVERSAL_CONFIG)
    trainer_state.json, rng_state_R.pth, ...   links to the checkpoint's own files: the step, the data position

It is built under a temporary name and renamed when whole, so a kill mid-conversion leaves nothing that
looks whole. The node process imports neither torch nor DeepSpeed: the conversion runs in the training
Python (plan.python), which has them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import MANIFEST, universal_companion
from swiftslurm.errors import NodeError

UNIVERSAL_CONFIG = "ds_config.json"  # in checkpoint-N-universal/: what `--deepspeed` points at on resume
# DeepSpeed's names, part of its checkpoint format.
_LATEST = "latest"  # in checkpoint-N: the tag (global_stepN) of the ZeRO state
_LATEST_UNIVERSAL = "latest_universal"
_OPTIM_SHARD = "*zero_pp_rank_*_mp_rank_00_optim_states.pt"  # one per data-parallel rank (ZeRO-1/2/3)
_MODEL_SHARD = "*zero_pp_rank_*_mp_rank_00_model_states.pt"  # one per rank with ZeRO-3 only (partitioned weights)
# ms-swift's `--deepspeed` presets: files in its package's config/ folder (swift/arguments/sft_args.py).
SWIFT_PRESETS = frozenset({"zero0", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload"})

Runner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def zero_tag(checkpoint: Path) -> str | None:
    """The tag of a checkpoint's ZeRO state (`global_stepN`), or None when it has none (DDP, LoRA, FSDP)."""
    latest = checkpoint / _LATEST
    if not latest.is_file():
        return None
    tag = latest.read_text().strip()
    return tag if (checkpoint / tag).is_dir() else None


def zero_shards(checkpoint: Path) -> int:
    """How many data-parallel ranks wrote a checkpoint's ZeRO optimizer state (0: it has none). This is read
    from the files, not the manifest: it is what DeepSpeed will try to load."""
    tag = zero_tag(checkpoint)
    return len(list((checkpoint / tag).glob(_OPTIM_SHARD))) if tag else 0


def is_zero3(checkpoint: Path) -> bool:
    tag = zero_tag(checkpoint)
    return bool(tag) and any((checkpoint / str(tag)).glob(_MODEL_SHARD))


def needs_universal(shards: int, data_parallel: int) -> bool:
    """Whether a checkpoint with ``shards`` ZeRO optimizer shards must go through the universal form to resume
    at ``data_parallel`` ranks. A checkpoint without ZeRO state, or written at this size, loads as it is."""
    return shards > 0 and shards != data_parallel


def universal_config(planned: Mapping[str, Any]) -> dict[str, Any]:
    """The planned DeepSpeed config, told to load a universal checkpoint (nothing else changes)."""
    checkpoint = dict(planned.get("checkpoint") or {})
    return {**planned, "checkpoint": {**checkpoint, "load_universal": True}}


def planned_config(deepspeed: str, swift_config_dir: Path | None) -> dict[str, Any]:
    """The DeepSpeed config that `--deepspeed VALUE` means to ms-swift: a preset name (a file in
    ``swift_config_dir``), a JSON file, or a JSON string (swift/utils/utils.py: json_parse_to_dict)."""
    if deepspeed in SWIFT_PRESETS:
        if swift_config_dir is None:
            raise ValueError(f"--deepspeed {deepspeed} is an ms-swift preset: its config folder is needed")
        return dict(json.loads((swift_config_dir / f"{deepspeed}.json").read_text()))
    path = Path(deepspeed)
    return dict(json.loads(path.read_text() if path.is_file() else deepspeed))


def unsupported(deepspeed: str) -> str | None:
    """Why a run with `--deepspeed VALUE` (a preset name, a JSON file or string) could not resume at another
    data-parallel size through the universal form (None: ZeRO-0/1/2 without offload, which it can). Known at
    plan time, on the login node: presets by name (their files are in the training Python's ms-swift)."""
    if deepspeed in SWIFT_PRESETS:
        stage, offload = int(deepspeed[len("zero")]), deepspeed.endswith("_offload")
    else:
        try:
            zero = planned_config(deepspeed, None).get("zero_optimization") or {}
        except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
            return f"its ZeRO stage cannot be read ({err})"
        stage = int(zero.get("stage", 0))
        offload = any(_offloads(zero.get(key)) for key in ("offload_optimizer", "offload_param"))
    if stage >= 3:
        # Verified only at DeepSpeed level (zero_train.py): ms-swift's ZeRO-3 (zero.Init, the 16-bit weights
        # gathered on save) through the universal form is not.
        return f"ZeRO-3 (stage {stage}) is not verified to resume at another world size"
    if offload:
        return "ZeRO with CPU/NVMe offload is not verified to resume at another world size"
    return None


def _offloads(section: Any) -> bool:
    return isinstance(section, Mapping) and str(section.get("device", "none")).lower() not in ("none", "")


def universal_resume_args(checkpoint: Path) -> tuple[str, ...]:
    """ms-swift arguments, appended to the planned ones (its parser keeps the last value), that resume
    ``checkpoint`` from its universal form (convert() must have made it)."""
    folder = universal_companion(checkpoint)
    return ("--resume_from_checkpoint", str(folder), "--deepspeed", str(folder / UNIVERSAL_CONFIG))


def conversion_argv(python: str, checkpoint: Path, tag: str, into: Path) -> list[str]:
    """DeepSpeed's converter for ``checkpoint``'s ZeRO state, writing ``into``/<tag>_universal and
    ``into``/latest_universal. One worker each: it runs on the leader while the other nodes wait, and
    more workers only hold more shards in memory at once."""
    return [
        python,
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(checkpoint / tag),
        "--output_folder",
        str(into / f"{tag}_universal"),
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
        # HF Trainer's DeepSpeed checkpoints lack `universal_checkpoint_info` (Megatron-DeepSpeed's tensor and
        # pipeline layout): the converter refuses them without it, and the injected default (a version, no
        # layout) is right for a model without tensor or pipeline parallelism.
        "--inject_missing_state",
    ]


def swift_config_dir(python: str, run: Runner) -> Path:
    """ms-swift's preset folder, found by the training Python without importing ms-swift."""
    code = "import importlib.util as u; print(u.find_spec('swift').submodule_search_locations[0])"
    done = run([python, "-c", code])
    return Path(done.stdout.strip()) / "config"


def convert(checkpoint: Path, deepspeed: str, python: str, run: Runner | None = None) -> Path:
    """Write ``checkpoint``'s universal form beside it (once: a whole one is reused) and return its folder.

    ``deepspeed``: the planned `--deepspeed` value; ``python``: the training Python (plan.python).
    Only the leader calls this, before it publishes the resume point; every node then appends
    universal_resume_args(checkpoint)."""
    run = run or _run
    target = universal_companion(checkpoint)
    if is_whole(checkpoint):
        return target
    tag = zero_tag(checkpoint)
    if tag is None:
        raise NodeError(f"{checkpoint} has no DeepSpeed ZeRO state ({_LATEST} names no folder): nothing to convert")
    _remove_unfinished(target)
    try:
        _build(checkpoint, tag, deepspeed, python, run, target)
    except (OSError, ValueError) as err:  # a full disk, an unreadable config: a resume failure like the others
        raise NodeError(
            f"converting {checkpoint} to DeepSpeed's universal form failed: {err}. HINT: the checkpoint itself "
            "is unchanged; free space beside it or fix the DeepSpeed config, or resume at the node count that "
            "wrote it (leave resilience.min_nodes out)."
        ) from err
    return target


def _build(checkpoint: Path, tag: str, deepspeed: str, python: str, run: Runner, target: Path) -> None:
    config_dir = swift_config_dir(python, run) if deepspeed in SWIFT_PRESETS else None
    config = universal_config(planned_config(deepspeed, config_dir))
    building = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=checkpoint.parent))
    try:
        run(conversion_argv(python, checkpoint, tag, building))
        (building / UNIVERSAL_CONFIG).write_text(json.dumps(config, indent=2))
        _link_trainer_files(checkpoint, building)
        building.chmod(checkpoint.stat().st_mode & 0o7777)  # mkdtemp's 0700, made like the checkpoint's own
        os.rename(building, target)
    except BaseException:  # a failure, or a stop signal's exception: nothing half-built stays behind
        shutil.rmtree(building, ignore_errors=True)
        raise


def is_whole(checkpoint: Path) -> bool:
    """Whether ``checkpoint``'s universal form is whole: convert() renames it into place only then, so a
    folder without its `latest_universal` was made by something else and is never resumed from."""
    return (universal_companion(checkpoint) / _LATEST_UNIVERSAL).is_file()


def _link_trainer_files(checkpoint: Path, into: Path) -> None:
    """Link the Trainer's own files (state, RNG, scheduler, tokenizer) from the checkpoint, relative so the
    output dir may move; not the ZeRO state (replaced), DeepSpeed's `latest` or the commit manifest."""
    for path in checkpoint.iterdir():
        if path.is_file() and path.name not in (_LATEST, MANIFEST):
            (into / path.name).symlink_to(Path("..") / checkpoint.name / path.name)


def _remove_unfinished(target: Path) -> None:
    """Remove what a conversion killed midway left (only this swiftslurm writes `.NAME.building-*`)."""
    for stale in target.parent.glob(f".{target.name}.building-*"):
        shutil.rmtree(stale, ignore_errors=True)


def _run(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise NodeError(
            f"converting the ZeRO checkpoint for another world size failed (exit {done.returncode}): "
            f"{' '.join(argv)}\n{tail}\nHINT: the checkpoint itself is unchanged; run that command by hand to "
            "see why, or resume at the node count that wrote it (leave resilience.min_nodes out)."
        )
    return done
