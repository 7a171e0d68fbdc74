"""Committed checkpoints go to the object store in the background, newest first; training never waits.

See swiftslurm.storage.store for the remote layout (a checkpoint is remote only once its manifest is).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from swiftslurm.ckpt.checkpoint import checkpoint_step, is_committed
from swiftslurm.rundir.jsonio import append_jsonl
from swiftslurm.storage.priority import lower_this_thread
from swiftslurm.storage.send import ChangedSinceCommit
from swiftslurm.storage.store import CheckpointStore, UploadResult

log = logging.getLogger("swiftslurm.uploader")


@dataclass
class _Pending:
    checkpoint: Path
    attempts: int = 0
    not_before: float = 0.0  # monotonic time of the next try (back-off after a failure)

    @property
    def step(self) -> int:
        return checkpoint_step(self.checkpoint) or 0


class Uploader:
    """Uploads committed checkpoints in one background thread, one at a time, newest first; training never waits.
    Newest first, so that with uploads slower than saves the store still gets the newest commit; an older one
    that remote retention would delete at once is skipped (`_outranked`).

    A failed upload is logged and stays pending for a retry with back-off, unless the bytes read to upload are
    not its manifest's (ChangedSinceCommit): sending them again cannot help, so it is refused, not retried. After each
    upload the remote retention (`keep`) is applied, and a line is appended to ``history`` (JSON: step, started
    (Unix time), seconds, files, size, already_remote) when given: when each upload ran, to set beside
    training's steps.
    `drain` ends it: it waits (bounded) and returns what is still not uploaded. The thread is not a daemon,
    and an interpreter exiting without `drain` drains for `wait_at_exit_s` first. Once ``leads()`` says this
    node lost the run dir's lease (asked before every upload), nothing more is uploaded or pruned."""

    BACKOFF_S = (2.0, 60.0)  # first retry after 2 s, doubling up to 60 s
    DRAIN_BACKOFF_S = 1.0  # while draining, retry at once (botocore has backed off per request already)
    DRAIN_POLL_S = 0.5  # while draining, how often the caller's `left_s` is asked

    def __init__(
        self,
        store: CheckpointStore,
        keep: int | None = None,
        history: Path | None = None,
        leads: Callable[[], bool] | None = None,
    ) -> None:
        self.store = store
        self.keep = store.spec.keep if keep is None else keep
        self.leads = leads  # whether this node still leads the run (rundir/lease.py); only a leader uploads, prunes
        self.history = history
        self._pending: list[_Pending] = []
        self._failures: list[str] = []
        self._refused: list[Path] = []  # changed after their commit: not uploaded, not retried
        self._remote: list[int] = []  # steps now in the store: uploaded, or found there already
        self._settled: set[int] = set()  # steps done with: in the store, or skipped as outranked
        self._draining = False
        self._stopping = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="swiftslurm-uploader")
        self._thread.start()
        self._register_exit_drain()

    def submit(self, checkpoint: Path) -> None:
        """Queue a committed checkpoint for upload; returns at once."""
        with self._changed:
            if self._stopping:
                raise RuntimeError("Uploader.submit after drain: the uploader has stopped")
            if all(p.checkpoint != checkpoint for p in self._pending):
                self._pending.append(_Pending(checkpoint))
            self._changed.notify_all()

    def pending(self) -> list[Path]:
        """Submitted checkpoints not uploaded yet (the one uploading now included), oldest first."""
        with self._changed:
            return [p.checkpoint for p in sorted(self._pending, key=lambda p: p.step)]

    def remote(self) -> list[int]:
        """Steps of the submitted checkpoints that are in the store (uploaded now or earlier), oldest first."""
        with self._changed:
            return sorted(self._remote)

    def settled(self) -> set[int]:
        """Steps of the submitted checkpoints the store no longer needs from local disk: uploaded, found there
        already, or skipped because `keep` newer ones are remote. What local retention may delete."""
        with self._changed:
            return set(self._settled)

    def refused(self) -> list[Path]:
        """Submitted checkpoints that changed after their commit, so are not uploaded and not retried."""
        with self._changed:
            return sorted(self._refused, key=lambda path: checkpoint_step(path) or 0)

    def failures(self) -> list[str]:
        """Every failed attempt so far, as logged."""
        with self._changed:
            return list(self._failures)

    def drain(self, timeout_s: float, left_s: Callable[[], float] | None = None) -> list[Path]:
        """Wait up to ``timeout_s`` for every submitted checkpoint to be uploaded, then stop (an upload still
        running is cancelled). ``left_s``, asked every DRAIN_POLL_S outside the lock, may end the wait
        sooner (a stop signal came). Returns what is not uploaded (pending or refused), oldest first, for the
        final report."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            self._draining = True
            for item in self._pending:
                item.not_before = min(item.not_before, time.monotonic())
            self._changed.notify_all()
        while (left := min(deadline - time.monotonic(), left_s() if left_s else timeout_s)) > 0:
            with self._changed:
                if not self._pending:
                    break
                self._changed.wait(min(left, self.DRAIN_POLL_S))
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        self.store.cancel()
        self._thread.join(timeout=self.store.spec.timeout_s + 5)
        if self._thread.is_alive():
            log.warning("[swiftslurm] the uploader is still finishing a request; it stops when that ends")
        return sorted([*self.pending(), *self.refused()], key=lambda path: checkpoint_step(path) or 0)

    def _run(self) -> None:
        # Uploads use what training leaves idle; the send threads, created from this one, inherit it.
        lower_this_thread(self.store.spec.background_priority)
        while (item := self._next_due()) is not None:
            self._attempt(item)

    def _next_due(self) -> _Pending | None:
        """The newest pending checkpoint whose back-off is over (waiting for one), or None: time to stop."""
        with self._changed:
            while not self._stopping:
                now = time.monotonic()
                due = [p for p in self._pending if p.not_before <= now]
                if due:
                    return max(due, key=lambda p: p.step)
                soonest = min((p.not_before - now for p in self._pending), default=1.0)
                self._changed.wait(timeout=min(max(soonest, 0.05), 1.0))
            return None

    def _register_exit_drain(self) -> None:
        """If the interpreter exits without `drain`, drain first. atexit would be too late: Python's exit first
        stops concurrent.futures' threads (no transfer can start after that) and then joins ours. threading's
        own exit hooks run before both, newest first, so registering after concurrent.futures' puts ours first."""
        import concurrent.futures.thread  # noqa: F401 - registers its exit hook, which must run after ours

        def at_exit() -> None:
            if not self._stopping and (left := self.drain(self.store.spec.wait_at_exit_s)):
                log.warning(f"[swiftslurm] exiting with {len(left)} checkpoint(s) not uploaded: {left}")

        getattr(threading, "_register_atexit")(at_exit)  # noqa: B009 - private, CPython >= 3.9, untyped

    def _attempt(self, item: _Pending) -> None:
        try:
            if self.leads is not None and not self.leads():  # checked before every upload
                self._drop(item, "this job lost the run dir's lease to another job, which uploads from now on")
                return
            uploaded = not self._outranked(item)
            if uploaded:
                started = time.time()
                self._record(started, self.store.upload(item.checkpoint))
        except Exception as err:  # background work: log it, keep the checkpoint pending, carry on
            self._failed(item, err)
            return
        with self._changed:
            self._pending.remove(item)
            self._settled.add(item.step)
            if uploaded:
                self._remote.append(item.step)
            self._changed.notify_all()
        self._apply_retention()

    def _record(self, started: float, result: UploadResult) -> None:
        if self.history is None:
            return
        line = asdict(result) | {"started": round(started, 3), "seconds": round(result.seconds, 3)}
        try:
            append_jsonl(self.history, [line], durable=False)
        except OSError as err:  # a record of the upload, not the upload: never fail it for this
            log.warning(f"[swiftslurm] could not append to {self.history}: {err}")

    def _outranked(self, item: _Pending) -> bool:
        """Whether `keep` newer checkpoints are already remote, so retention would delete this one at once."""
        if self.keep <= 0:
            return False
        newer = [step for step in self.store.committed_steps() if step > item.step]
        if len(newer) >= self.keep:
            log.info(f"[swiftslurm] not uploading {item.checkpoint.name}: {len(newer)} newer ones are remote")
            return True
        return False

    def _drop(self, item: _Pending, why: str) -> None:
        message = f"not uploading {item.checkpoint.name}: {why}"
        with self._changed:
            self._pending.remove(item)
            self._failures.append(message)
            self._changed.notify_all()
        log.warning(f"[swiftslurm] {message}")

    def _failed(self, item: _Pending, err: Exception) -> None:
        with self._changed:
            item.attempts += 1
            if not is_committed(item.checkpoint):  # deleted locally (retention) meanwhile: nothing left to send
                self._pending.remove(item)
                message = f"{item.checkpoint} is not (or no longer) committed locally; dropped: {err}"
            elif isinstance(err, ChangedSinceCommit):
                self._pending.remove(item)
                self._refused.append(item.checkpoint)
                message = f"{item.checkpoint.name} is not uploaded and not retried: {err}"
            else:
                first, cap = self.BACKOFF_S
                wait = self.DRAIN_BACKOFF_S if self._draining else min(first * 2 ** (item.attempts - 1), cap)
                item.not_before = time.monotonic() + wait
                message = f"upload of {item.checkpoint.name} failed (attempt {item.attempts}, retry in {wait:.0f} s)"
                message += f": {err}"
            self._failures.append(message)
            self._changed.notify_all()
        log.warning(f"[swiftslurm] {message}")

    def _apply_retention(self) -> None:
        if self.keep <= 0:
            return
        if self.leads is not None and not self.leads():
            log.warning("[swiftslurm] not pruning the store: this job lost the run dir's lease to another job")
            return
        try:
            for step in self.store.prune(self.keep):
                log.info(f"[swiftslurm] pruned remote checkpoint-{step} (keep={self.keep})")
        except Exception as err:  # retention is housekeeping: the next upload tries again
            with self._changed:
                self._failures.append(f"remote retention failed: {err}")
            log.warning(f"[swiftslurm] remote retention failed: {err}")
