"""What differs between training engines, in one place: an `Engine` adapter per launcher.

The plan side asks an adapter which arguments it forces and which combinations it refuses; the node side
asks it how a resume is expressed, whether a run reached its last step and which processes may receive the
stop signal (progress is the same for every engine: its plugin writes global rank 0's heartbeat). Nothing
outside an adapter branches on the engine (submitit keeps its schedulers apart the same way,
`submitit/core/job_environment.py`). Adapters import neither torch nor ms-swift: the plugin each one names is
what the training ranks import.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from swiftslurm.ckpt.checkpoint import is_last_step, newest_committed, read_manifest
from swiftslurm.signals import SAVE_SIGNAL, outermost_catchers

if TYPE_CHECKING:
    from swiftslurm.plan import BatchPlan, Parallelism, Topology
    from swiftslurm.planning.memory import ModelShape

ENGINES_DIR = Path(__file__).resolve().parent
# ms-swift arguments that do not change what is trained (see Engine.result_argv).
_NOT_RESULT_ARGS = frozenset({"--output_dir", "--ddp_timeout"})


class Engine:
    """The adapter protocol, with what the engines share. Subclasses fill in the differences."""

    launcher: str = ""  # the program (`swift`, `megatron`): plan.launcher, the key the node side finds us by
    title: str = ""  # the engine's name for people, in messages
    # The `strategy.engine` values this adapter runs: the one statement of the engine in the configuration,
    # from which the program follows (registry.engine_for_strategy).
    strategy_engines: tuple[str, ...] = ()
    commands: tuple[str, ...] = ("sft", "pt", "rlhf")  # `task.command` values the program has
    needs_gpus: bool = False  # no CPU training
    has_model_parallelism: bool = False  # tensor, pipeline, context and expert degrees (`strategy.tp`, ...)
    # The ms-swift argument that recomputes activations in backward (its default: on), which the memory
    # estimate follows; None: the estimate keeps every layer's activations.
    gradient_checkpointing_arg: str | None = "gradient_checkpointing"
    plugin: Path = ENGINES_DIR  # the file every rank imports (`--external_plugins`): commit and stop hooks
    callbacks: tuple[str, ...] = ()  # the callbacks that plugin registers, added to `--callbacks`
    replaced_callbacks: tuple[str, ...] = ()  # the engine's own callbacks ours replace (removed if asked for)
    # `swift sft` runs one process without torchrun; Megatron initialises torch.distributed from torchrun's
    # variables even for one process.
    torchrun_for_one_process: bool = False
    # Arguments swiftslurm owns for this engine: a user value would break the run directory or resume.
    managed_args: frozenset[str] = frozenset({"output_dir", "add_version"})
    finished_rule: str = "a committed checkpoint of the planned last step (its manifest says so)"  # for people

    # -- plan side ----------------------------------------------------------------------------------
    def straggler_gap(self, strategy_engine: str, deepspeed: str | None, fsdp: str | None) -> str | None:
        """Why this engine's runs of the strategy cannot time a node's own pace (engines/forward_clock.py), for
        the dry run; None: stragglers are detected."""
        return None

    def needs_torchrun_for_one_process(self, swift_argv: tuple[str, ...]) -> bool:
        """Whether a single process must still be started by torchrun (for its rank variables)."""
        return self.torchrun_for_one_process

    def default_args(self, seed: int) -> dict[str, Any]:
        """Arguments this engine runs with unless the configuration says otherwise."""
        return {}

    def batch_args(self, batch: BatchPlan) -> dict[str, Any]:
        """The planned batch in this engine's arguments."""
        return {"per_device_train_batch_size": batch.micro, "gradient_accumulation_steps": batch.grad_accum}

    def cpu_args(self, strategy_engine: str) -> dict[str, Any]:
        """Arguments for training on CPUs (`cluster.gpus_per_node=0`) with ``strategy_engine``."""
        return {}

    def parallel_args(self, par: Parallelism) -> dict[str, Any]:
        """Model-parallel degrees in this engine's arguments (none: the engine has no model parallelism)."""
        return {}

    def forced_args(self, args: Mapping[str, Any], output_dir: Path) -> dict[str, Any]:
        """Arguments this engine must run with under swiftslurm, merged last over everything else."""
        owned = (*self.callbacks, *self.replaced_callbacks)
        callbacks = [c for c in as_list(args.get("callbacks")) if c not in owned]
        plugins = [p for p in as_list(args.get("external_plugins")) if p != str(self.plugin)]
        return {
            "output_dir": str(output_dir),
            "add_version": False,  # no versioned vN-<time>/ subfolder: checkpoints must be where resume looks
            "callbacks": [*callbacks, *self.callbacks],
            "external_plugins": [*plugins, str(self.plugin)],
        }

    def result_argv(self, argv: tuple[str, ...]) -> list[list[str]]:
        """The arguments of ``argv`` that determine what is trained, one [--name, values...] group each (the
        plan's identity): without where the output goes (inside the run dir), how long NCCL waits (the
        cluster's), and this engine's own hooks (their path is wherever swiftslurm is installed)."""
        groups: list[list[str]] = []
        for word in argv:
            if word.startswith("--") or not groups:
                groups.append([word])
            else:
                groups[-1].append(word)
        kept = [[g[0], *(v for v in g[1:] if not self._is_ours(v))] for g in groups if g[0] not in _NOT_RESULT_ARGS]
        return [g for g in kept if len(g) > 1 or g[0] not in ("--callbacks", "--external_plugins")]

    def _is_ours(self, value: str) -> bool:
        """One of this engine's hooks: a callback name, or its plugin file wherever swiftslurm is (or was)
        installed, in this layout or an earlier one."""
        path = Path(value)
        return value in self.callbacks or (path.name == self.plugin.name and "swiftslurm" in path.parts)

    def refusal(self, args: Mapping[str, Any]) -> str | None:
        """Why these arguments cannot keep swiftslurm's promise with this engine (None: they can): a resumed
        run would not continue where it stopped, a commit could hash files still being written, or the
        engine would crash at start-up, after the queue wait."""
        return None

    def layout_refusal(self, args: Mapping[str, Any], topology: Topology, shape: ModelShape | None) -> str | None:
        """Why these arguments cannot run on ``topology`` (nodes × ranks) or on a model of ``shape`` (None: not
        known here): the divisibility rules the engine checks at start-up, after the queue wait. None: they can."""
        return None

    def resume_warnings(self, swift_argv: tuple[str, ...]) -> list[str]:
        """What a resume of these arguments does that the user may mean but should be told, one line each
        (`warning: ... HINT: ...`; the dry run and the submission print them)."""
        return []

    def reshard_refusal(self, args: Mapping[str, Any]) -> str | None:
        """Why a checkpoint of these arguments cannot be resumed at a smaller world size, so the run may not
        shrink (`resilience.min_nodes`); None: it can. Full replicas (DDP, LoRA) load at any world size."""
        return None

    def rank_zero_share(self, swift_argv: tuple[str, ...]) -> float:
        """The part of a checkpoint global rank 0 writes alone, for the save estimate (the rest every rank writes
        a share of). Default: none, each rank writes its own shards."""
        return 0.0

    def resume_form(self) -> str:
        """How a resume is expressed, for people (the dry run)."""
        return " ".join(self.resume_args(Path("CKPT"), ()))

    def describe(self) -> list[tuple[str, str]]:
        """The adapter's choices, for people (the dry run shows them)."""
        return [
            ("adapter", f"{type(self).__name__} (`{self.launcher}`)"),
            ("commit hook", f"{', '.join(self.callbacks)} from {self.plugin.name} (--external_plugins, every rank)"),
            ("progress", "logs/ATTEMPT/progress.json: global rank 0's heartbeat at each step, save and evaluation"),
            ("finished", self.finished_rule),
            ("resume", self.resume_form()),
            ("stop signal", "USR2 to the training ranks only (never to what they start, e.g. vLLM or data workers)"),
        ]

    # -- node side ----------------------------------------------------------------------------------
    def reshaped_args(self, batch: BatchPlan) -> tuple[str, ...]:
        """Arguments appended to the planned ones (ms-swift's parser keeps the last) to train with ``batch``
        instead: an attempt on fewer nodes than planned (slurm_env.AttemptShape.batch)."""
        return tuple(word for name, value in self.batch_args(batch).items() for word in (f"--{name}", str(value)))

    def resume_args(self, checkpoint: Path, swift_argv: tuple[str, ...]) -> tuple[str, ...]:
        raise NotImplementedError

    def prepare_reshard(self, checkpoint: Path, swift_argv: tuple[str, ...], data_parallel: int, python: str) -> None:
        """Leader only, before it publishes the resume point: make ``checkpoint`` loadable at ``data_parallel``
        ranks when this engine needs a conversion for that (beside the checkpoint; the committed one is never
        changed). ``data_parallel``: the ranks the optimizer state is partitioned over, the attempt's world
        size for the HF family (DeepSpeed ZeRO partitions over every rank). ``python``: the training Python
        (plan.python). Default: nothing to do."""

    def resume_args_at(self, checkpoint: Path, swift_argv: tuple[str, ...], data_parallel: int) -> tuple[str, ...]:
        """resume_args for an attempt with ``data_parallel`` ranks, which may differ from the number that wrote
        ``checkpoint`` (after prepare_reshard). Default: the checkpoint loads at any size as it is."""
        return self.resume_args(checkpoint, swift_argv)

    def reached_last_step(self, output_dir: Path, swift_argv: tuple[str, ...] = ()) -> bool:
        """Whether training is complete: the newest committed checkpoint is the planned last step (the
        commit hook writes that step into the manifest). Once it is, nothing trains again. A trainer's own
        word that it ended is not enough: it says so before its last checkpoint is committed, and a commit
        can still fail (a full disk, a lost peer) or be killed (the time limit)."""
        return committed_last_step(output_dir)

    def stop_recipients(self, trainer_pid: int) -> list[int]:
        """The processes that get the save signal: the training ranks, and nothing they started.

        A rank is the outermost process that catches it: `swift` and torchrun ignore it, the ranks install
        the plugin's handler, and whatever a rank forks inherits that handler (a data loader worker, a vLLM
        engine) or was exec'ed with the default action, which kills. Neither may get it."""
        return outermost_catchers(trainer_pid, SAVE_SIGNAL)


def committed_last_step(output_dir: Path) -> bool:
    """Whether the newest committed checkpoint in ``output_dir`` is the run's planned last step."""
    newest, _ = newest_committed(output_dir)
    return newest is not None and is_last_step(read_manifest(newest))


def argv_value(argv: tuple[str, ...], name: str) -> str | None:
    """The value of `--name` in an ms-swift argument list (the last one wins, as in ms-swift's parser)."""
    flag, found = f"--{name}", None
    for i, token in enumerate(argv[:-1]):
        if token == flag:
            found = argv[i + 1]
    return found


def argv_values(argv: tuple[str, ...], name: str) -> list[str]:
    """The values of the first `--name` in an ms-swift argument list (several for a list argument), up to the
    next option; none when it is not there."""
    if f"--{name}" not in argv:
        return []
    rest = argv[argv.index(f"--{name}") + 1 :]
    return list(itertools.takewhile(lambda word: not word.startswith("--"), rest))


def is_true(value: Any) -> bool:
    """An ms-swift boolean given as true: a bool from the configuration, or a word ms-swift's parser reads as
    true (transformers' string_to_bool) in the configuration or an argument list."""
    return str(value).lower() in ("true", "yes", "t", "y", "1")


def as_list(value: Any) -> list[Any]:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
