"""What the engines' plugins share, run inside every training rank: the stop request and the commit.

`StopRequest` installs the stop-signal handler (it only records) and the vote that makes every rank stop at the
same step (stop_vote.py); global rank 0 publishes that step (STOP_FILE_ENV), and each node's wrapper ends its
trainer once that checkpoint, and no other, is committed. `Committer`, after each save, meets every rank at a
barrier (so all shards, optimizer and RNG states are written), then the ranks checksum the files together
(shared_commit.py) and global rank 0 writes the manifest last, in a background thread so training goes on
meanwhile; a save waits for the previous commit, so at most one is in flight. The thread is not a daemon: a
process that exits normally finishes its commit first; one that is killed leaves the checkpoint uncommitted,
which is exactly what it is. A commit that fails during training is logged (resume falls back to an older
checkpoint); the last one, joined when training ends, fails the trainer (`CommitFailed`): the run is not
finished without it. Without object storage, retention (`keep_checkpoints`) is applied here after a
commit, so the newest committed checkpoint is never deleted, and only while the run's leader holds the run dir's
lease; with storage the wrapper's NodeSync applies it, since only it knows what is uploaded (the wrapper then
passes 0). The manifest carries the plan's identity the wrapper passes (IDENTITY_ENV) and the leader's fencing token
(TOKEN_ENV); it is not written once that leader lost the run dir's lease.

For the hang watchdog (node/hang.py, node/stacks.py), every rank registers its stack dump at import
(`register_stack_dump`), and global rank 0 writes the heartbeat the wrapper follows (rundir/beat.py): each
step's end, and the begin and end of each save, evaluation and epoch boundary, which the wrapper must not take
for a slow step. The Committer writes it, as it knows when a save is over: once every rank has written it and
the previous commit is done (`after_save`), and, at the end, while the last commit is still being written. The
training loop only hands each beat over: a daemon thread writes the newest (rundir/beat.py), so no step waits
for the file system. The Committer flushes it where order matters: before a checkpoint's commit starts (the
wrapper ends a stopping trainer on that manifest) and at the end, before the process may exit.

Global rank 0 also writes the trainer's timeline (rundir/timeline.py): loop begun, each save and commit, loop
ended, for the goodput ledger.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from swiftslurm.ckpt import checkpoint, shared_commit
from swiftslurm.engines.stop_vote import StopVote
from swiftslurm.errors import CommitFailed
from swiftslurm.rundir import lease
from swiftslurm.rundir.beat import EPOCH, EVAL, SAVE, StepBeat
from swiftslurm.rundir.jsonio import peek_json, write_json_atomic
from swiftslurm.rundir.layout import stack_file
from swiftslurm.rundir.timeline import COMMITTED, TRAIN_BEGIN, TRAIN_END, TimelineWriter
from swiftslurm.signals import RANK_STOP_SIGNALS, SAVE_SIGNAL, dump_stacks_on_signal, ignore_from_now_on, install

KEEP_ENV = "SWIFTSLURM_KEEP_CHECKPOINTS"  # set by the wrapper from the plan
TOKEN_ENV = lease.TOKEN_ENV  # the leader's fencing token: commits and retention run only while its lease holds
IDENTITY_ENV = "SWIFTSLURM_PLAN_IDENTITY"  # set by the wrapper from the plan, written into each manifest
STACKS_ENV = "SWIFTSLURM_STACKS_DIR"  # set by the wrapper: where each rank writes its stacks on DUMP_SIGNAL
STOP_FILE_ENV = "SWIFTSLURM_STOP_FILE"  # set by the wrapper: where global rank 0 publishes the agreed stop step
_stacks: IO[str] | None = None  # this rank's stack file, open for as long as the process lives


def register_stack_dump(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Make DUMP_SIGNAL write this process's Python stacks, every thread, to its rank's file under STACKS_ENV
    (None: not under the wrapper, or registered already). faulthandler writes from a C signal handler, so a
    rank blocked inside a collective (in C++, with or without the GIL) still writes them, and nothing else
    in the process changes: the signal is ignored by default, and only the wrapper sends it."""
    global _stacks
    folder = environ.get(STACKS_ENV)
    if not folder or _stacks is not None:
        return None
    path = stack_file(Path(folder), int(environ.get("RANK", "0")))
    path.parent.mkdir(parents=True, exist_ok=True)
    # Appended: a trainer restarted in the same attempt keeps the earlier dump. Never closed: faulthandler
    # writes to it for as long as the process lives.
    _stacks = open(path, "a")  # noqa: SIM115
    dump_stacks_on_signal(_stacks)
    return path


def pauses(evaluate: bool, save: bool, epoch_end: bool = False) -> tuple[str, ...]:
    """The pauses due, in the order both engines' training loops run them: the evaluation, then the save (which
    may keep the best checkpoint by its metric), then the next epoch's data loader."""
    return tuple(kind for kind, due in ((EVAL, evaluate), (SAVE, save), (EPOCH, epoch_end)) if due)


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
        install(self._record, RANK_STOP_SIGNALS)

    def _record(self, signum: int, frame: Any) -> None:
        self.requested = True  # only recorded: the step in progress finishes, then all ranks vote

    def should_stop_now(self, step: int) -> bool:
        """Call at every step end on every rank: True once, at the step all ranks save and stop at."""
        if self.vote.step_end(self.requested) and not self.stopping:
            print(f"[swiftslurm] stop signal: saving step {step} and stopping", flush=True)
            self.stopping = True
            if is_global_rank_zero():
                publish_stop_step(step)
            return True
        return False

    def finish(self, print_cost: bool) -> None:
        self.vote.finish()
        if print_cost and (cost := self.vote.cost_line()):
            print(cost, flush=True)


def publish_stop_step(step: int, environ: Mapping[str, str] = os.environ) -> None:
    """Global rank 0, once every rank agreed to stop at ``step``: say so in STOP_FILE_ENV's file, before the
    save begins. Each node's wrapper ends its trainer on the manifest of that step's checkpoint only: the
    commit of an earlier save can land after the signal, while the stop checkpoint is still being written.
    A failed write is reported and training goes on (the wrapper then waits for the trainer's own exit)."""
    if not (path := environ.get(STOP_FILE_ENV)):
        return
    try:
        write_json_atomic(Path(path), {"step": step}, durable=False)
    except OSError as err:
        print(f"[swiftslurm] the stop step cannot be published in {path} ({err})", flush=True)


def agreed_stop_step(path: Path) -> int | None:
    """The step global rank 0 published with `publish_stop_step` (None: none yet)."""
    step = (peek_json(path) or {}).get("step")
    return step if isinstance(step, int) else None


class Committer:
    """Commit each checkpoint once all ranks have written it; the ranks hash it together (shared_commit.py)."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self._commit: threading.Thread | None = None  # at most one in flight
        self._folder: Path | None = None  # what it commits
        self._failure: BaseException | None = None  # why it failed, once it has
        self._group: Any = None  # the CPU group the commits use, created at the first save
        self.timeline = TimelineWriter(None)  # rank 0's, from train_begun on
        self.beat = StepBeat(None)  # rank 0's heartbeat, from train_begun on

    def train_begun(self, step: int) -> None:
        """The training loop begins (model and resume checkpoint loaded): from here on, time is training."""
        self.timeline = TimelineWriter.from_environ(is_global_rank_zero())
        self.timeline.event(TRAIN_BEGIN, step=step)
        self.beat = StepBeat.from_environ(is_global_rank_zero())

    def step_ended(self, step: int, last_step: int | None, follows: tuple[str, ...]) -> None:
        """Every rank, at every step's end: ``follows``, the pauses due before the next step (`pauses`)."""
        self.timeline.step_ended()
        self.beat.step_ended(step, last_step, follows)

    def after_save(self, folder: Path, last_step: int | None) -> None:
        """Every rank calls this once its share of ``folder`` is written. The previous commit is finished
        first: commits that overlap share the disks and cores and each takes longer, so the newest, the one a
        stop signal waits for, would be committed later."""
        self.wait()
        # Its step's beat on disk before its manifest: the wrapper ends a stopping trainer on that manifest and
        # records the last step it read from the beat.
        self.beat.flush()
        self._join_group()
        barrier()
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self._commit = threading.Thread(
            target=self._run_commit, args=(folder, world_size, last_step), name="swiftslurm-commit"
        )
        self._folder, self._failure = folder, None
        self._commit.start()
        self.timeline.saved(checkpoint.checkpoint_step(folder) or 0)
        self.beat.pause_ended(SAVE)  # the loop goes on; the commit runs beside it

    def wait(self) -> BaseException | None:
        """Return once the commit in flight (if any) is done: why it failed, or None."""
        if self._commit is not None:
            self._commit.join()
            self._commit = None
        return self._failure

    def _join_group(self) -> None:
        """A collective call (every rank, same point): the commits' own gloo group, so hashing in a background
        thread never shares a group with the training loop or the stop vote."""
        import torch.distributed as dist

        if self._group is None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            self._group = dist.new_group(backend="gloo")

    def _run_commit(self, folder: Path, world_size: int, last_step: int | None) -> None:
        try:
            started = time.monotonic()
            files = shared_commit.hash_together(folder, self._group) if self._group is not None else None
            if is_global_rank_zero():
                self._commit_hashed(folder, world_size, last_step, files, started)
        except lease.LeaseLost as err:  # another job leads the run now: this trainer's commits do not count
            print(f"[swiftslurm] not committing {folder.name}: {err}", flush=True)
        except Exception as err:  # logged and left uncommitted: resume falls back to an older one
            self._failed(folder, err)
        finally:
            if self._group is not None:
                # No rank's commit ends before rank 0's manifest is written: a rank that exits (training over)
                # while rank 0 still commits can make torchrun stop rank 0 mid-commit (docs/gpu.md).
                import torch.distributed as dist

                try:
                    dist.barrier(group=self._group)
                except Exception as err:  # a peer lost: whether rank 0 committed is not known here
                    self._failed(folder, err)

    def _failed(self, folder: Path, err: BaseException) -> None:
        print(f"[swiftslurm] could not commit {folder.name}: {err!r}", flush=True)
        self._failure = self._failure or err

    def _commit_hashed(
        self, folder: Path, world_size: int, last_step: int | None, files: list[dict[str, Any]] | None, started: float
    ) -> None:
        identity = os.environ.get(IDENTITY_ENV) or None
        token, fence = self._lease_fence(folder)
        manifest = checkpoint.commit(
            folder,
            world_size,
            swift_version(),
            last_step=last_step,
            engine=self.engine,
            identity=identity,
            files=files,
            lease_token=token,
            fence=fence,
        )
        self.timeline.event(COMMITTED, step=manifest["step"])
        took, size_gb = time.monotonic() - started, sum(entry["size"] for entry in manifest["files"]) / 1e9
        hashers = world_size if files is not None else 1
        print(
            f"[swiftslurm] committed {folder.name} ({size_gb:.2f} GB hashed by {hashers} ranks in {took:.1f} s)",
            flush=True,
        )
        keep = int(os.environ.get(KEEP_ENV, "0"))
        if keep > 0 and self._leads():
            for gone in checkpoint.prune_committed(folder.parent, keep):
                print(f"[swiftslurm] pruned {gone.name} (keep_checkpoints={keep})", flush=True)

    @staticmethod
    def _lease_fence(folder: Path) -> tuple[int | None, Callable[[], None] | None]:
        """The leader's token, and the check that refuses ``folder``'s manifest once that leader lost the run
        dir's lease (rundir/lease.py), compared right before the rename. Without a token (the trainer started by
        hand) there is no lease to check."""
        token, run_dir = os.environ.get(TOKEN_ENV), os.environ.get("SWIFTSLURM_RUN_DIR")
        if token is None or run_dir is None:
            return None, None
        held, where = int(token), Path(run_dir)
        return held, lambda: lease.fence(where, held, f"commit {folder.name}")

    @staticmethod
    def _leads() -> bool:
        """Whether this run's leader still holds the run dir's lease (rundir/lease.py): a leader that lost it
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
        ignore_from_now_on((SAVE_SIGNAL,))
        ended = time.time()
        if self._commit is not None:  # the last checkpoint's commit is still being written: part of its save
            self.beat.pausing(SAVE)
        # The last beat on disk before the process may exit (the writer thread is a daemon).
        self.beat.flush()
        failure = self.wait()
        self.timeline.event(TRAIN_END, started=round(ended, 3))
        if failure is not None and self._folder is not None:
            # Swallowed, the trainer would exit 0 with its last checkpoint never committed (nor uploaded).
            raise CommitFailed(
                f"the commit of the last checkpoint, {self._folder}, failed: {failure!r}. HINT: the next attempt "
                "resumes from the newest committed checkpoint and trains to this step again; if the error is a "
                "full disk, free space on the output directory's file system."
            ) from failure
