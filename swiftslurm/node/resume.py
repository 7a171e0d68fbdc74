"""Every node resumes from the same checkpoint: the leader picks it and publishes it in
logs/<attempt>/resume.json; the other nodes wait for that file."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from swiftslurm.errors import NodeError, SwiftSlurmError
from swiftslurm.node.ckpt.checkpoint import ResumePoint, prepare_resume, write_json_atomic
from swiftslurm.node.storage.store import CheckpointStore
from swiftslurm.node.storage.sync import restore
from swiftslurm.node.watch import POLL_S
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import RESUME
from swiftslurm.storage_spec import StorageSpec

RESUME_WAIT_S = 900.0  # restoring a large checkpoint from object storage can take a while


class Interrupted(Exception):
    """A stop signal came before the resume point was published: this attempt starts no trainer."""


def agree_on_resume(
    plan: JobPlan, attempt_dir: Path, leader: bool, stopped: Callable[[], bool] = lambda: False
) -> ResumePoint:
    """The leader picks the resume point (and sets aside what is newer) and publishes it; the other nodes
    wait for that choice, so every rank loads the same checkpoint even while the leader is still
    quarantining or restoring. Raises Interrupted when ``stopped()`` (a stop signal was recorded) before the
    choice is published, or when the leader published that one was."""
    path = attempt_dir / RESUME
    return _choose(plan, attempt_dir, path, stopped) if leader else _wait_for_choice(path, stopped)


def publish_signalled(resume_file: Path) -> None:
    """Tell the nodes waiting for the resume point that a stop signal came first: nobody trains, they end."""
    resume_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(resume_file, {"checkpoint": None, "step": 0, "signalled": True})


def publish_failure(resume_file: Path, why: str) -> None:
    """Tell the nodes waiting for the resume point that there is none: they stop waiting and fail."""
    resume_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(resume_file, {"checkpoint": None, "step": 0, "error": why})


def _choose(plan: JobPlan, attempt_dir: Path, path: Path, stopped: Callable[[], bool]) -> ResumePoint:
    if plan.storage is not None:
        _restore_or_tell(plan.storage, plan.output_dir, path, stopped)
    if stopped():  # the last moment to end the attempt before the other nodes start their trainers
        raise Interrupted("a stop signal came before the resume point was published")
    point = prepare_resume(plan.output_dir, tag=attempt_dir.name, move=True)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    chosen = {"checkpoint": str(point.checkpoint) if point.checkpoint else None, "step": point.step}
    write_json_atomic(path, {**chosen, "complete": point.complete})
    return point


def _wait_for_choice(path: Path, stopped: Callable[[], bool]) -> ResumePoint:
    deadline = time.time() + RESUME_WAIT_S
    while not path.is_file():
        if stopped():
            raise Interrupted(f"a stop signal came while waiting for node 0 to publish {path}")
        if time.time() > deadline:
            raise NodeError(f"node 0 did not publish {path} within {RESUME_WAIT_S:.0f} s; is node 0 alive?")
        time.sleep(POLL_S)
    chosen = json.loads(path.read_text())
    if chosen.get("signalled"):
        raise Interrupted("node 0 ended the attempt before training: a stop signal came first")
    if chosen.get("error"):
        raise NodeError(f"node 0 could not prepare the resume point: {chosen['error']}")
    checkpoint = Path(chosen["checkpoint"]) if chosen["checkpoint"] else None
    return ResumePoint(checkpoint, chosen["step"], complete=bool(chosen.get("complete")))


def _restore_or_tell(spec: StorageSpec, output_dir: Path, resume_file: Path, stopped: Callable[[], bool]) -> None:
    """Fetch the remote checkpoint when the store is ahead (a wiped disk, a new cluster). If the store cannot
    be read, fail the attempt rather than resume behind it; the other nodes learn it from the resume file."""
    store = CheckpointStore(spec)
    try:
        _cancelled_when_stopped(lambda: restore(spec, output_dir, store), store, stopped)
    except SwiftSlurmError as err:
        publish_failure(resume_file, str(err))
        raise


def _cancelled_when_stopped(work: Callable[[], object], store: CheckpointStore, stopped: Callable[[], bool]) -> None:
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
    running.result()
