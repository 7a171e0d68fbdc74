"""What the engines' plugins share, run inside every training rank: the stop request and the commit.

`StopRequest` installs the stop-signal handler (it only records) and the vote that makes every rank stop at
the same step (stop_vote.py). `Committer`, after each save, meets every rank at a barrier (so all shards,
optimizer and RNG states are written), then global rank 0 checksums the files and writes the manifest last,
in a background thread so training goes on meanwhile. The thread is not a daemon: a process that exits
normally finishes its commit first; one that is killed leaves the checkpoint uncommitted, which is exactly
what it is. Retention (`keep_checkpoints`) is applied after a commit, so the newest committed checkpoint is
never deleted.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

from swiftslurm.node import lease
from swiftslurm.node.ckpt import checkpoint
from swiftslurm.node.engines.stop_vote import StopVote

KEEP_ENV = "SWIFTSLURM_KEEP_CHECKPOINTS"  # set by the wrapper from the plan
TOKEN_ENV = lease.TOKEN_ENV  # the leader's fencing token: retention runs only while its lease holds
IDENTITY_ENV = "SWIFTSLURM_PLAN_IDENTITY"  # set by the wrapper from the plan, written into each manifest
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def is_global_rank_zero() -> bool:
    import torch.distributed as dist

    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def swift_version() -> str:
    from importlib.metadata import version

    return version("ms-swift")


class StopRequest:
    """A stop signal, recorded by the handler; `agreed(step)` says when every rank has agreed to stop."""

    def __init__(self) -> None:
        self.requested = False
        self.stopping = False
        self.vote = StopVote()
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._record)

    def _record(self, signum: int, frame: Any) -> None:
        self.requested = True  # only recorded: the step in progress finishes, then all ranks vote

    def should_stop_now(self, step: int) -> bool:
        """Call at every step end on every rank: True once, at the step all ranks save and stop at."""
        if self.vote.step_end(self.requested) and not self.stopping:
            print(f"[swiftslurm] stop signal: saving step {step} and stopping", flush=True)
            self.stopping = True
            return True
        return False

    def finish(self, print_cost: bool) -> None:
        self.vote.finish()
        if print_cost and (cost := self.vote.cost_line()):
            print(cost, flush=True)


class Committer:
    """Commit each checkpoint once all ranks have written it."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self._commits: list[threading.Thread] = []

    def after_save(self, folder: Path, last_step: int | None) -> None:
        """Every rank calls this once its share of ``folder`` is written."""
        barrier()
        if is_global_rank_zero():
            world_size = int(os.environ.get("WORLD_SIZE", "1"))
            thread = threading.Thread(
                target=self._commit, args=(folder, world_size, last_step), name="swiftslurm-commit"
            )
            thread.start()
            self._commits.append(thread)

    def _commit(self, folder: Path, world_size: int, last_step: int | None) -> None:
        try:
            identity = os.environ.get(IDENTITY_ENV) or None
            checkpoint.commit(
                folder, world_size, swift_version(), last_step=last_step, engine=self.engine, identity=identity
            )
            print(f"[swiftslurm] committed {folder.name}", flush=True)
            keep = int(os.environ.get(KEEP_ENV, "0"))
            if keep > 0 and self._leads():
                for gone in checkpoint.prune_committed(folder.parent, keep):
                    print(f"[swiftslurm] pruned {gone.name} (keep_checkpoints={keep})", flush=True)
        except Exception as err:  # logged and left uncommitted: resume falls back to an older one
            print(f"[swiftslurm] could not commit {folder.name}: {err!r}", flush=True)

    @staticmethod
    def _leads() -> bool:
        """Whether this run's leader still holds the run dir's lease (node/lease.py): a leader that lost it
        must not prune. Without a token (the trainer started by hand) there is no lease to check."""
        token, run_dir = os.environ.get(TOKEN_ENV), os.environ.get("SWIFTSLURM_RUN_DIR")
        if token is None or run_dir is None or lease.holds(Path(run_dir), int(token)):
            return True
        print(f"[swiftslurm] not pruning: the lease on {run_dir} moved to another job", flush=True)
        return False

    def finish(self) -> None:
        # Training is over: a save signal that arrives now (SLURM delivers it to each node at its own moment,
        # and the wrapper forwards it) has nothing left to save, but once Python finalises it restores the
        # default action and the signal would kill this rank, failing a run that ended well.
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        for thread in self._commits:
            thread.join()
