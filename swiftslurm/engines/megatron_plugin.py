"""Megatron-SWIFT plugin (`--external_plugins`) for `megatron sft|pt`, imported by every training rank.

Megatron-SWIFT has no signal handling of its own: a plain USR2 kills every rank and nothing is saved. Two
callbacks (registered in `megatron_callbacks_map`, named in `--callbacks`) give it swiftslurm's behaviour,
with the same parts as the `swift` plugin (hooks.py): `swiftslurm_megatron_stop` saves the iteration every
rank agreed on and ends the training loop after that save; `swiftslurm_megatron_commit` commits each
checkpoint once every rank has written its shards, and writes global rank 0's heartbeat: each iteration's end,
each save and evaluation (rundir/beat.py; a thread writes it, off the training loop). Importing it registers
the rank's stack dump (hooks.py) and blocks the stop signals in every process the rank starts (signals.py:
only the ranks see them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swift.megatron.callbacks import megatron_callbacks_map
from swift.megatron.callbacks.base import MegatronCallback

from swiftslurm.engines.hooks import Committer, StopRequest, is_global_rank_zero, pauses, register_stack_dump
from swiftslurm.engines.megatron import pauses_after
from swiftslurm.rundir.beat import EVAL
from swiftslurm.signals import children_never_see_stop_signals

register_stack_dump()  # at import: a rank that hangs while loading the model or the data has stacks too
children_never_see_stop_signals()  # at import: before any data loader worker or engine starts


class MegatronStopCallback(MegatronCallback):
    """Save the current iteration and stop once a stop signal has reached any rank."""

    def __init__(self, trainer: Any) -> None:
        super().__init__(trainer)
        self._stop = StopRequest()
        self._eval_iters: int | None = None  # the planned eval_iters, while the stop iteration is saved

    def on_train_begin(self) -> None:
        self._stop.vote.join()

    def on_step_end(self) -> None:
        if self._stop.should_stop_now(self.state.iteration):
            self.state.should_save = True  # the trainer saves after this step's logging, then calls on_save
            # The stop checkpoint first: Megatron evaluates before it saves, and its default_flow callback, which
            # runs after this one, asks for the evaluation by eval_iters; 0 until the save is done.
            self._eval_iters, self.args.eval_iters = self.args.eval_iters, 0
            self.state.should_eval = False

    def on_save(self, output_dir: str) -> None:
        if self._stop.stopping:
            # The trainer loops `while iteration < train_iters`: ending it here is the one clean exit it has.
            # The commit hook read the planned last step at train begin, so the manifest keeps the real one.
            self.args.train_iters = self.state.iteration
            if self._eval_iters is not None:
                self.args.eval_iters, self._eval_iters = self._eval_iters, None

    def on_train_end(self) -> None:
        self._stop.finish(print_cost=is_global_rank_zero())


class MegatronCommitCallback(MegatronCallback):
    """Commit each checkpoint once all ranks have written it."""

    def __init__(self, trainer: Any) -> None:
        super().__init__(trainer)
        self._committer = Committer(engine="megatron")
        self._last_step: int | None = None

    def on_train_begin(self) -> None:
        self._last_step = int(self.args.train_iters)  # the planned last iteration (epochs already counted)
        self._committer.train_begun(int(self.state.iteration))

    def on_step_end(self) -> None:
        # After swiftslurm_megatron_stop (named before this one), which may have asked for a save.
        save, evaluate = pauses_after(self.state.iteration, self.args, self.state.should_save)
        self._committer.step_ended(int(self.state.iteration), self._last_step, pauses(evaluate, save))

    def on_eval_begin(self) -> None:
        self._committer.beat.pausing(EVAL)  # already so when on_step_end foresaw it

    def on_eval_end(self) -> None:
        self._committer.beat.pause_ended(EVAL)

    def on_save(self, output_dir: str) -> None:
        self._committer.after_save(Path(output_dir), last_step=self._last_step)

    def on_train_end(self) -> None:
        self._committer.finish()


megatron_callbacks_map["swiftslurm_megatron_stop"] = MegatronStopCallback
megatron_callbacks_map["swiftslurm_megatron_commit"] = MegatronCommitCallback
