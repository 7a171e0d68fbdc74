"""ms-swift plugin (`--external_plugins`), imported by every training rank: saves on signals, commits checkpoints.

It registers two callbacks. `swiftslurm_stop` saves the current step and stops when a stop signal arrives
(TERM, INT, USR1 or USR2: the wrapper forwards SLURM's USR2), all ranks at the same step (stop_vote.py).
`swiftslurm_commit`: after each save every rank meets at a barrier (so all
shards, optimizer and RNG states are written), then global rank 0 checksums the files and writes the
manifest last, in a background thread so training goes on meanwhile. The thread is not a daemon: a
process that exits normally finishes its commit first; one that is killed leaves the checkpoint
uncommitted, which is exactly what it is. Retention (`save_total_limit`, here `keep_checkpoints`) is
applied after a commit, so the newest committed checkpoint is never deleted.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

from swiftslurm.node import checkpoint
from swiftslurm.node.stop_vote import StopVote

log = logging.getLogger("swiftslurm")
KEEP_ENV = "SWIFTSLURM_KEEP_CHECKPOINTS"  # set by the wrapper from the plan


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _swift_version() -> str:
    from importlib.metadata import version

    return version("ms-swift")


class StopCallback(TrainerCallback):
    """Save the current step and stop training once a stop signal has reached any rank.

    It replaces ms-swift's `graceful_exit`, which does the same with a GPU all-reduce and a device
    synchronisation after every step, and which also stops whenever a file `/tmp/stop` exists on a node.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)

    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self._requested = False
        self._stopping = False
        self._vote = StopVote()
        for sig in self.SIGNALS:
            signal.signal(sig, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self._requested = True  # only recorded: the step in progress finishes, then all ranks vote

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._vote.join()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._vote.step_end(self._requested) and not self._stopping:
            print(f"[swiftslurm] stop signal: saving step {state.global_step} and stopping", flush=True)
            self._stopping = True
            control.should_save = True
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._stopping:
            control.should_training_stop = True
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._vote.finish()
        if state.is_world_process_zero and (cost := self._vote.cost_line()):
            print(cost, flush=True)
        return control


class CommitCallback(TrainerCallback):
    """Commit each checkpoint once all ranks have written it."""

    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self._commits: list[threading.Thread] = []

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        _barrier()
        if state.is_world_process_zero:
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
            thread = threading.Thread(target=self._commit, args=(folder, world_size), name="swiftslurm-commit")
            thread.start()
            self._commits.append(thread)
        return control

    def _commit(self, folder: Path, world_size: int) -> None:
        try:
            checkpoint.commit(folder, world_size, _swift_version())
            print(f"[swiftslurm] committed {folder.name}", flush=True)
            keep = int(os.environ.get(KEEP_ENV, "0"))
            if keep > 0:
                for gone in checkpoint.prune_committed(folder.parent, keep):
                    print(f"[swiftslurm] pruned {gone.name} (keep_checkpoints={keep})", flush=True)
        except Exception as err:  # logged and left uncommitted: resume falls back to an older one
            print(f"[swiftslurm] could not commit {folder.name}: {err!r}", flush=True)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # Training is over: a save signal that arrives now (SLURM delivers it to each node at its own moment,
        # and the wrapper forwards it) has nothing left to save, but once Python finalises it restores the
        # default action and the signal would kill this rank, failing a run that ended well.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        for thread in self._commits:
            thread.join()
        return control


callbacks_map["swiftslurm_stop"] = StopCallback
callbacks_map["swiftslurm_commit"] = CommitCallback
