"""Every node resumes from the same checkpoint: the leader picks it and publishes it in
logs/<attempt>/resume.json; the other nodes wait for that file as long as the leader's heartbeat says it
is alive (swiftslurm.node.heartbeat), however long its restore takes, and take only one with their own job
run's nonce (rundir/lease.py): an earlier job with the same id may have left one there. A stop signal before
the choice is published ends the attempt on every node before any trainer starts (Interrupted).

When the object store cannot be read (down past botocore's retries, expired credentials), the leader resumes
from the newest local checkpoint if it is at least as new as the newest step this run dir uploaded, and says
so in the attempt's record (ResumePoint.restore_error); otherwise no trainer starts on any node (Unrestored)
and the attempt is concluded as an infrastructure failure, retried with back-off."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import replace
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import (
    ResumePoint,
    checkpoint_step,
    newest_committed,
    prepare_resume,
    reclaim_set_aside,
)
from swiftslurm.engines.registry import engine_for
from swiftslurm.errors import NodeError, StorageError, SwiftSlurmError
from swiftslurm.node.heartbeat import LeaderBeat, leader_silence
from swiftslurm.node.watch import POLL_S, wait_pause
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.jsonio import peek_json, write_json_atomic
from swiftslurm.rundir.layout import LEADER_BEAT, RESUME, node_log
from swiftslurm.rundir.lease import Lease
from swiftslurm.storage.store import CheckpointStore
from swiftslurm.storage.sync import last_synced_step, restore


class Interrupted(Exception):
    """A stop signal came before the resume point was published: this attempt starts no trainer."""


class Unrestored(Exception):
    """The object store could not be read, and the local checkpoints are older than what was uploaded to it:
    this attempt starts no trainer (``str()``: why, for the record)."""


def agree_on_resume(
    plan: JobPlan,
    attempt_dir: Path,
    leader: bool,
    lease: Lease | None = None,
    nonce: str | None = None,
    stopped: Callable[[], bool] = lambda: False,
    ranks: int | None = None,
) -> ResumePoint:
    """The leader picks the resume point (and sets aside what is newer) and publishes it; the other nodes
    wait for that choice, so every rank loads the same checkpoint even while the leader is still
    quarantining or restoring. Raises Interrupted when ``stopped()`` (a stop signal was recorded) before the
    choice is published, or when the leader published that one was. ``ranks``: this attempt's ranks when the
    run may change size (slurm_env.AttemptShape.reshard_ranks): the leader makes the resume point loadable at
    that many first (engine.prepare_reshard)."""
    path = attempt_dir / RESUME
    if not leader:
        return _wait_for_choice(path, attempt_dir / LEADER_BEAT, nonce, stopped)
    with LeaderBeat(attempt_dir / LEADER_BEAT).running() as beat:
        return _choose(plan, attempt_dir, path, beat, lease, nonce, stopped, ranks)


def publish_signalled(resume_file: Path, nonce: str | None = None) -> None:
    """Tell the nodes waiting for the resume point that a stop signal came first: nobody trains, they end."""
    resume_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(resume_file, {"checkpoint": None, "step": 0, "signalled": True, "nonce": nonce})


def publish_unrestored(resume_file: Path, why: str, nonce: str | None = None) -> None:
    """Tell the nodes waiting for the resume point that the store could not be restored from: nobody trains."""
    resume_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(resume_file, {"checkpoint": None, "step": 0, "unrestored": why, "nonce": nonce})


def publish_failure(resume_file: Path, why: str, nonce: str | None = None) -> None:
    """Tell the nodes waiting for the resume point that there is none: they stop waiting and fail."""
    resume_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(resume_file, {"checkpoint": None, "step": 0, "error": why, "nonce": nonce})


def _choose(
    plan: JobPlan,
    attempt_dir: Path,
    path: Path,
    beat: LeaderBeat,
    lease: Lease | None,
    nonce: str | None,
    stopped: Callable[[], bool],
    ranks: int | None = None,
) -> ResumePoint:
    identity = plan.identity()
    restore_error, reclaimed, restored = None, None, None
    try:
        if plan.storage is not None:
            _fence(lease, "restore from object storage")
            # Before the restore, which may set aside a damaged local copy of its own: that one stays.
            reclaimed = tuple(reclaim_set_aside(plan.output_dir))
            restored, restore_error = _restore(plan, beat, identity, stopped)
        if stopped():  # the last moment to end the attempt before the other nodes start their trainers
            raise Interrupted("a stop signal came before the resume point was published")
        beat.doing("choosing the resume point")
        _fence(lease, "quarantine newer checkpoints")
        point = prepare_resume(plan.output_dir, attempt_dir.name, move=True, identity=identity, reclaimed=reclaimed)
        if ranks is not None and point.checkpoint is not None and not point.complete:
            _reshard(plan, point.checkpoint, ranks, beat, lease, stopped)
    except Unrestored as why:
        publish_unrestored(path, str(why), nonce)
        raise
    except SwiftSlurmError as err:  # another plan's checkpoint, the lease lost
        publish_failure(path, str(err), nonce)
        raise
    attempt_dir.mkdir(parents=True, exist_ok=True)
    chosen = {"checkpoint": str(point.checkpoint) if point.checkpoint else None, "step": point.step}
    write_json_atomic(path, {**chosen, "complete": point.complete, "nonce": nonce})
    came_from = f"s3://{plan.storage.bucket}/{plan.storage.root}{restored.name}" if plan.storage and restored else None
    return replace(point, restore_error=restore_error, restored=came_from if point.checkpoint == restored else None)


def _restore(
    plan: JobPlan, beat: LeaderBeat, identity: str, stopped: Callable[[], bool]
) -> tuple[Path | None, str | None]:
    """Restore from the store what it has newer than the local checkpoints: what was downloaded (None:
    nothing newer), and None for the error. When the store cannot be read: why (the resume point is then the
    newest local checkpoint), or Unrestored when that is older than the newest step this run dir uploaded
    (training from it would lose the steps in between)."""
    assert plan.storage is not None
    beat.doing(f"looking for a newer checkpoint in {plan.storage.url}")
    store = CheckpointStore(plan.storage)
    restoring = lambda: restore(plan.storage, plan.output_dir, beat, identity, store)  # noqa: E731
    try:
        return _cancelled_when_stopped(restoring, store, stopped), None
    except StorageError as err:
        local, _ = newest_committed(plan.output_dir)
        local_step, synced = (checkpoint_step(local) or 0) if local else 0, last_synced_step(Path(plan.run_dir))
        if local_step < synced:
            raise Unrestored(
                f"the object store could not be read, and the newest local checkpoint (step {local_step}) is older "
                f"than step {synced}, uploaded before: {err}"
            ) from err
        print(f"[swiftslurm] resuming from local step {local_step}, not older than any upload: {err}", flush=True)
        return None, str(err)


def _reshard(
    plan: JobPlan, checkpoint: Path, ranks: int, beat: LeaderBeat, lease: Lease | None, stopped: Callable[[], bool]
) -> None:
    """Make ``checkpoint`` loadable at ``ranks`` before the choice is published, so that no node resumes
    from a half-made conversion (a ZeRO checkpoint written by another number of ranks; minutes for a large
    model, while the others wait on the heartbeat). The goodput ledger counts it as restore: it is part of
    the agree_on_resume phase."""
    beat.doing(f"making {checkpoint.name} loadable at {ranks} ranks")
    _fence(lease, "convert the checkpoint for another world size")
    engine_for(plan.launcher).prepare_reshard(checkpoint, plan.swift_argv, ranks, plan.python)
    if stopped():  # a conversion may be long: no trainer starts once a stop signal came
        raise Interrupted("a stop signal came while the resume point was converted for this attempt's ranks")


def _fence(lease: Lease | None, step: str) -> None:
    if lease is not None:
        lease.check(step)


def _cancelled_when_stopped(
    work: Callable[[], Path | None], store: CheckpointStore, stopped: Callable[[], bool]
) -> Path | None:
    """Run ``work`` (a restore, maybe hundreds of GB) in a thread of its own, so that a stop signal cancels
    it within POLL_S instead of after the download: SLURM kills the job GraceTime after its signal. A
    cancelled download leaves nothing behind (CheckpointStore.download); one that finished is kept."""
    with ThreadPoolExecutor(1, thread_name_prefix="swiftslurm-restore") as pool:
        running = pool.submit(work)
        while not wait([running], timeout=POLL_S).done:
            if stopped():
                store.cancel()  # again at each poll: a transfer may start after the previous cancel
    if stopped():
        raise Interrupted("a stop signal came during the restore from object storage; it was cancelled")
    return running.result()


def _ours(path: Path, nonce: str | None) -> dict[str, Any] | None:
    """The choice in ``path`` if it is this job run's resume.json: the nonces match (both None outside SLURM,
    where one node is the whole job, or when SLURM could not say when the job started); else None."""
    chosen = peek_json(path)
    return chosen if chosen is not None and chosen.get("nonce") == nonce else None


def _wait_for_choice(
    path: Path, beat: Path, nonce: str | None = None, stopped: Callable[[], bool] = lambda: False
) -> ResumePoint:
    waiting_since = time.time()
    while (chosen := _ours(path, nonce)) is None:
        if stopped():
            raise Interrupted(f"a stop signal came while waiting for node 0 to publish {path}")
        if (silence := leader_silence(beat, time.time(), waiting_since)) is not None:
            raise NodeError(
                f"{silence}; it has not published {path}, this node stops waiting. HINT: node 0's log "
                f"{node_log(path.parent, 0)} and its wrapper's output say why (`python -m swiftslurm logs "
                f"{path.parent.parent.parent} --node 0` shows both); the next attempt resumes from the newest "
                "committed checkpoint."
            )
        time.sleep(wait_pause(time.time() - waiting_since))
    if chosen.get("signalled"):
        raise Interrupted("node 0 ended the attempt before training: a stop signal came first")
    if chosen.get("unrestored"):
        raise Unrestored(f"node 0 starts no trainer: {chosen['unrestored']}")
    if chosen.get("error"):
        raise NodeError(f"node 0 could not prepare the resume point: {chosen['error']}")
    checkpoint = Path(chosen["checkpoint"]) if chosen["checkpoint"] else None
    return ResumePoint(checkpoint, chosen["step"], complete=bool(chosen.get("complete")))
