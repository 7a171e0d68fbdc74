"""Every node resumes from the same checkpoint: the leader picks it and publishes it in
logs/<attempt>/resume.json; the other nodes wait for that file as long as the leader's heartbeat says it
is alive (swiftslurm.node.heartbeat), however long its restore takes."""

from __future__ import annotations

import json
import time
from pathlib import Path

from swiftslurm.errors import NodeError, SwiftSlurmError
from swiftslurm.node.ckpt.checkpoint import ResumePoint, prepare_resume, write_json_atomic
from swiftslurm.node.heartbeat import LeaderBeat, leader_silence
from swiftslurm.node.storage.sync import restore
from swiftslurm.node.watch import POLL_S
from swiftslurm.plan import JobPlan
from swiftslurm.rundir import LEADER_BEAT, RESUME, node_log
from swiftslurm.storage_spec import StorageSpec


def agree_on_resume(plan: JobPlan, attempt_dir: Path, leader: bool) -> ResumePoint:
    """The leader picks the resume point (and sets aside what is newer) and publishes it; the other nodes
    wait for that choice, so every rank loads the same checkpoint even while the leader is still
    quarantining or restoring."""
    path = attempt_dir / RESUME
    if not leader:
        return _wait_for_choice(path, attempt_dir / LEADER_BEAT)
    with LeaderBeat(attempt_dir / LEADER_BEAT).running() as beat:
        return _choose(plan, attempt_dir, path, beat)


def publish_failure(resume_file: Path, why: str) -> None:
    """Tell the nodes waiting for the resume point that there is none: they stop waiting and fail."""
    resume_file.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(resume_file, {"checkpoint": None, "step": 0, "error": why})


def _choose(plan: JobPlan, attempt_dir: Path, path: Path, beat: LeaderBeat) -> ResumePoint:
    if plan.storage is not None:
        _restore_or_tell(plan.storage, plan.output_dir, path, beat)
    beat.doing("choosing the resume point")
    point = prepare_resume(plan.output_dir, tag=attempt_dir.name, move=True)
    attempt_dir.mkdir(parents=True, exist_ok=True)
    chosen = {"checkpoint": str(point.checkpoint) if point.checkpoint else None, "step": point.step}
    write_json_atomic(path, {**chosen, "complete": point.complete})
    return point


def _wait_for_choice(path: Path, beat: Path) -> ResumePoint:
    waiting_since = time.time()
    while not path.is_file():
        if (silence := leader_silence(beat, time.time(), waiting_since)) is not None:
            raise NodeError(
                f"{silence}; it has not published {path}, this node stops waiting. HINT: node 0's log "
                f"{node_log(path.parent, 0)} and logs/slurm-<job id>.out say why; the next attempt resumes from "
                "the newest committed checkpoint."
            )
        time.sleep(POLL_S)
    chosen = json.loads(path.read_text())
    if chosen.get("error"):
        raise NodeError(f"node 0 could not prepare the resume point: {chosen['error']}")
    checkpoint = Path(chosen["checkpoint"]) if chosen["checkpoint"] else None
    return ResumePoint(checkpoint, chosen["step"], complete=bool(chosen.get("complete")))


def _restore_or_tell(spec: StorageSpec, output_dir: Path, resume_file: Path, beat: LeaderBeat) -> None:
    """Fetch the remote checkpoint when the store is ahead (a wiped disk, a new cluster). If the store cannot
    be read, fail the attempt rather than resume behind it; the other nodes learn it from the resume file."""
    beat.doing(f"looking for a newer checkpoint in {spec.url}")
    try:
        restore(spec, output_dir, beat)
    except SwiftSlurmError as err:
        publish_failure(resume_file, str(err))
        raise
