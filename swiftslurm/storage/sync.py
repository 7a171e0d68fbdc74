"""Node 0 and the object store: restore before training, upload what gets committed, drain at the end.

The run directory is shared by every node (plan.json and the resume point must be), and the commit
callback's manifest lists every file of a checkpoint, so node 0 sees each committed checkpoint whole and
uploads it alone; the other nodes take no part. What is remote, pending and failing is written to
<run_dir>/sync.json for `status` and for people; when each upload ran, to <run_dir>/uploads.jsonl.

With object storage, local retention (`keep_checkpoints`) is applied here rather than by the trainer: a
checkpoint is deleted locally only once the store no longer needs it (uploaded, or superseded by a newer
upload), so a checkpoint waiting for its upload is never pruned, whatever the speed of saves and uploads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import checkpoint_dirs, checkpoint_step, is_committed, newest_committed, prune_committed
from swiftslurm.plan import StorageSpec
from swiftslurm.rundir.jsonio import read_json, read_jsonl, write_json_atomic
from swiftslurm.rundir.layout import SYNC_STATE, UPLOAD_HISTORY
from swiftslurm.storage.store import CheckpointStore, TransferReport, remove_stale_downloads, restore_if_newer
from swiftslurm.storage.uploader import Uploader

log = logging.getLogger("swiftslurm.sync")
SCAN_S = 2.0  # how often the output dir is looked at for newly committed checkpoints
LAST_FAILURES = 5  # failures kept in sync.json


def restore(
    spec: StorageSpec,
    output_dir: Path,
    report: TransferReport | None = None,
    identity: str | None = None,
    store: CheckpointStore | None = None,
) -> Path | None:
    """Before training (node 0): remove what a killed restore left, then fetch the newest remote checkpoint that
    passes its check if it is newer than every committed local one (a wiped scratch disk, a new cluster),
    unless another plan than ``identity`` committed it (refused). Returns what was downloaded, or None.
    ``report`` follows the download (node 0's heartbeat); ``store``: the caller's, to `cancel` the download from
    another thread."""
    remove_stale_downloads(output_dir)
    local, _ = newest_committed(output_dir)
    local_step = (checkpoint_step(local) or 0) if local else 0
    store = store if store is not None else CheckpointStore(spec)
    return restore_if_newer(store, output_dir, local_step, report, identity)


def last_synced_step(run_dir: Path) -> int:
    """The newest step this run dir knows the store to hold: uploaded, or found there already, by any of its
    attempts (uploads.jsonl; a restored checkpoint is found there by the attempt that restored it); 0: none."""
    steps = (row.get("step") for row in read_jsonl(run_dir / UPLOAD_HISTORY))
    return max((step for step in steps if isinstance(step, int)), default=0)


class NodeSync:
    """One attempt's uploads: `poll` during training submits newly committed checkpoints to a background
    Uploader (also those an earlier attempt left behind) and prunes the uploaded ones beyond the newest
    ``keep_local`` (0 keeps all); `drain` waits for them, bounded, at the end."""

    def __init__(
        self,
        spec: StorageSpec,
        run_dir: Path,
        output_dir: Path,
        store: CheckpointStore | None = None,
        keep_local: int = 0,
        leads: Callable[[], bool] | None = None,
    ):
        self.spec = spec
        self.keep_local = keep_local
        self._leads = leads
        self.state_path = run_dir / SYNC_STATE
        self.output_dir = output_dir
        self.uploader = Uploader(
            store if store is not None else CheckpointStore(spec), history=run_dir / UPLOAD_HISTORY, leads=leads
        )
        self._submitted: set[int] = set()
        self._scanned_at = float("-inf")
        self._written: dict[str, Any] | None = None

    def poll(self, now: float) -> None:
        """Submit committed checkpoints not submitted yet (at most every SCAN_S), and refresh sync.json; nothing
        once this node lost the run dir's lease (sync.json is the new leader's)."""
        if now - self._scanned_at < SCAN_S or (self._leads is not None and not self._leads()):
            return
        self._scanned_at = now
        for step, path in checkpoint_dirs(self.output_dir):
            if step not in self._submitted and is_committed(path):
                self.uploader.submit(path)
                self._submitted.add(step)
        self._prune_local()
        self._write_state()

    def drain(self, timeout_s: float, left_s: Callable[[], float] | None = None) -> list[int]:
        """Submit the last commits, wait up to ``timeout_s`` (or less, as ``left_s`` says: Uploader.drain) for
        every upload, stop; return the steps not uploaded."""
        self.poll(float("inf"))
        started = time.monotonic()
        left = [checkpoint_step(path) or 0 for path in self.uploader.drain(max(timeout_s, 0.0), left_s)]
        self._prune_local()
        state = self._write_state()
        if left:
            log.warning(
                f"[swiftslurm] not uploaded to {self.spec.url}: {', '.join(f'checkpoint-{s}' for s in left)} "
                f"(after {time.monotonic() - started:.0f} s); the next attempt uploads them. "
                f"Last failure: {state['last_failure']}"
            )
        else:
            log.info(f"[swiftslurm] every committed checkpoint is in {self.spec.url}: {state['remote']}")
        return left

    def stop(self) -> None:
        """This node lost the run dir's lease: stop at once, uploading nothing more (an upload in flight is
        cancelled), and leave sync.json to the new leader."""
        self.uploader.drain(0.0)

    def _prune_local(self) -> None:
        """Beyond the newest ``keep_local`` committed checkpoints, delete those the store has (or has a newer
        one instead of); keep every one still pending, and any not submitted yet."""
        if self.keep_local <= 0 or (self._leads is not None and not self._leads()):
            return  # keeps all, or this node lost the run dir's lease: another leader owns retention now
        for gone in prune_committed(self.output_dir, self.keep_local, only=self.uploader.settled()):
            why = f"the store has it, or a newer one (keep_checkpoints={self.keep_local})"
            log.info(f"[swiftslurm] pruned {gone.name} locally: {why}")

    def state(self) -> dict[str, Any]:
        failures = self.uploader.failures()
        return {
            "url": self.spec.url,
            "remote": self.uploader.remote(),
            "pending": [checkpoint_step(p) or 0 for p in self.uploader.pending()],
            "refused": [checkpoint_step(p) or 0 for p in self.uploader.refused()],  # changed after their commit
            "failures": len(failures),
            "last_failure": failures[-1] if failures else None,
            "recent_failures": failures[-LAST_FAILURES:],
        }

    def _write_state(self) -> dict[str, Any]:
        state = self.state()
        if state != self._written:
            write_json_atomic(self.state_path, {**state, "updated": round(time.time(), 3)})
            self._written = state
        return state


def record_uploaded(run_dir: Path, step: int) -> None:
    """sync.json after a checkpoint was uploaded outside an attempt (the storage CLI): remote, not pending."""
    state = read_json(run_dir / SYNC_STATE)
    if state is None:
        return
    remote = sorted({*state.get("remote", []), step})
    pending = [s for s in state.get("pending", []) if s != step]
    write_json_atomic(
        run_dir / SYNC_STATE, {**state, "remote": remote, "pending": pending, "updated": round(time.time(), 3)}
    )
