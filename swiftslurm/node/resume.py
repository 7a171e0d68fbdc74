"""Every node resumes from the same checkpoint: the leader picks it and publishes it in
logs/<attempt>/resume.json; the other nodes wait for that file."""

from __future__ import annotations

import json
import time
from pathlib import Path

from swiftslurm.errors import NodeError, SwiftSlurmError
from swiftslurm.node.ckpt.checkpoint import ResumePoint, prepare_resume, write_json_atomic
from swiftslurm.node.storage.sync import restore
from swiftslurm.node.watch import POLL_S
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import RESUME
from swiftslurm.storage_spec import StorageSpec

RESUME_WAIT_S = 900.0  # restoring a large checkpoint from object storage can take a while


def agree_on_resume(plan: JobPlan, attempt_dir: Path, leader: bool) -> ResumePoint:
    """The leader picks the resume point (and sets aside what is newer) and publishes it; the other nodes
    wait for that choice, so every rank loads the same checkpoint even while the leader is still
    quarantining or restoring."""
    path = attempt_dir / RESUME
    return _choose(plan, attempt_dir, path) if leader else _wait_for_choice(path)


def publish_failure(resume_file: Path, why: str) -> None:
    """Tell the nodes waiting for the resume point that there is none: they stop waiting and fail."""
    resume_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(resume_file, {"checkpoint": None, "step": 0, "error": why})


def _choose(plan: JobPlan, attempt_dir: Path, path: Path) -> ResumePoint:
    if plan.storage is not None:
        _restore_or_tell(plan.storage, plan.output_dir, path)
    point = prepare_resume(plan.output_dir, tag=attempt_dir.name, move=True)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    chosen = {"checkpoint": str(point.checkpoint) if point.checkpoint else None, "step": point.step}
    write_json_atomic(path, {**chosen, "complete": point.complete})
    return point


def _wait_for_choice(path: Path) -> ResumePoint:
    deadline = time.time() + RESUME_WAIT_S
    while not path.is_file():
        if time.time() > deadline:
            raise NodeError(f"node 0 did not publish {path} within {RESUME_WAIT_S:.0f} s; is node 0 alive?")
        time.sleep(POLL_S)
    chosen = json.loads(path.read_text())
    if chosen.get("error"):
        raise NodeError(f"node 0 could not prepare the resume point: {chosen['error']}")
    checkpoint = Path(chosen["checkpoint"]) if chosen["checkpoint"] else None
    return ResumePoint(checkpoint, chosen["step"], complete=bool(chosen.get("complete")))


def _restore_or_tell(spec: StorageSpec, output_dir: Path, resume_file: Path) -> None:
    """Fetch the remote checkpoint when the store is ahead (a wiped disk, a new cluster). If the store cannot
    be read, fail the attempt rather than resume behind it; the other nodes learn it from the resume file."""
    try:
        restore(spec, output_dir)
    except SwiftSlurmError as err:
        publish_failure(resume_file, str(err))
        raise
