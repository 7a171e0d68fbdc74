"""ms-swift plugin (`--external_plugins`) for `swift sft|pt|rlhf`, imported by every training rank.

It registers two Trainer callbacks (hooks.py does the work). `swiftslurm_stop` saves the current step and
stops when a stop signal arrives (TERM, INT, USR1 or USR2: the wrapper forwards SLURM's USR2), all ranks at
the same step. `swiftslurm_commit` commits each checkpoint once every rank has written it, and writes global
rank 0's heartbeat: each step's end, each save, evaluation and epoch end (rundir/beat.py; a thread writes it,
off the training loop); every rank times
its training forwards, and each node's local rank 0 publishes the node's pace (engines/forward_clock.py,
rundir/pace.py). Retention (`save_total_limit`, here `keep_checkpoints`) is applied after a commit. Importing
it registers the rank's stack dump (hooks.py) and blocks the stop signals in every process the rank starts
(signals.py: only the ranks see them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

from swiftslurm.engines.forward_clock import NodePace
from swiftslurm.engines.hooks import Committer, StopRequest, pauses, register_stack_dump
from swiftslurm.rundir.beat import EVAL
from swiftslurm.signals import children_never_see_stop_signals

register_stack_dump()  # at import: a rank that hangs while loading the model or the data has stacks too
children_never_see_stop_signals()  # at import: before any data loader worker or engine starts


class StopCallback(TrainerCallback):
    """Save the current step and stop training once a stop signal has reached any rank.

    It replaces ms-swift's `graceful_exit`, which does the same with a GPU all-reduce and a device
    synchronisation after every step, and which also stops whenever a file `/tmp/stop` exists on a node.
    """

    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self._stop = StopRequest()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._stop.vote.join()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._stop.should_stop_now(state.global_step):
            # The stop checkpoint first, nothing before it: the Trainer evaluates before it saves, and with
            # save_strategy=best the evaluation's verdict replaces should_save (a worse metric drops the save).
            control.should_save, control.should_evaluate = True, False
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._stop.stopping:
            # The Trainer saves and evaluates once more at the end of the epoch it stopped in (epoch strategies):
            # the stop checkpoint is saved, and a second save of that step would rewrite it under its manifest.
            control.should_save, control.should_evaluate = False, False
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._stop.stopping:
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._stop.finish(print_cost=state.is_world_process_zero)
        return control


class CommitCallback(TrainerCallback):
    """Commit each checkpoint once all ranks have written it."""

    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self._committer = Committer(engine="swift")
        self._pace: NodePace | None = None  # this rank's training forwards' pace (rundir/pace.py)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._committer.train_begun(state.global_step)  # after the resume checkpoint was loaded
        # the unwrapped model (inside DDP's wrapper); the trainer, whose fetches of the next batches are timed
        self._pace = NodePace.attach(kwargs.get("model"), args, self.trainer)
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # The Trainer's flow callback runs first: what follows this step is decided (a stop's save too, as
        # swiftslurm_stop is named before this one; after a stop signal the watchdog is off anyway).
        follows = pauses(control.should_evaluate, control.should_save)
        self._committer.step_ended(state.global_step, state.max_steps, follows)
        if self._pace is not None:
            self._pace.step_ended(state.global_step)
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # The data loader starts over (workers, shuffling), and an epoch strategy saves and evaluates here.
        self._committer.beat.pausing(*pauses(control.should_evaluate, control.should_save, epoch_end=True))
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._committer.beat.pause_ended(EVAL)
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self._committer.after_save(folder, last_step=state.max_steps)
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._committer.finish()
        return control


callbacks_map["swiftslurm_stop"] = StopCallback
callbacks_map["swiftslurm_commit"] = CommitCallback
