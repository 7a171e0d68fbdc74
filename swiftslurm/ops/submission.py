"""Which job carries a run now: swiftslurm's latest submission (job.json), a job submitted by hand that leads
the run dir, or one whose SLURM output file is the only trace. Read by `status` (ops/runs.py) and by the
ledger's accounting (ops/accounting.py), so both speak of the same job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from swiftslurm.rundir import lease
from swiftslurm.rundir.jsonio import read_json
from swiftslurm.rundir.layout import JOB, RESUME, SLURM_LOG, logs_dir


def submission(run_dir: Path) -> dict[str, Any]:
    """The job that carries the run; {} if never submitted. Newest first of: the job that took the run dir's
    lease last, if it took it after swiftslurm's latest submission (job.json) was made (a job submitted by hand
    that now leads); job.json; a job submitted by hand (`sbatch RUN_DIR/job.sbatch` writes no job.json) whose
    SLURM output file in logs/ is the newest and which was not refused the lease (if its wrapper never
    started, e.g. the node's Python cannot import swiftslurm, that file is the only trace of the job). A job
    refused the lease (another job leads the run) never becomes the run's job."""
    job = read_json(run_dir / JOB) or {}
    if job.get("scheduler") == "local":  # a process of this machine: no other job can carry the run
        return job
    held = lease.read(run_dir)
    holder, taken = str(held.get("job") or ""), float(held.get("acquired") or 0)
    by_slurm = holder and not holder.startswith(lease.LOCAL_PREFIX)  # a local run's leader: not a SLURM job
    if by_slurm and holder != str(job.get("job_id") or "") and taken > float(job.get("submitted") or 0):
        job = {"job_id": holder, "scheduler": "slurm", "by_hand": True}
    if job and not job.get("by_hand"):
        return job
    newest = _newest_hand_submitted(run_dir, not_before=taken)
    if newest is not None and newest != holder:
        return {"job_id": newest, "scheduler": "slurm", "by_hand": True}
    return job


def _newest_hand_submitted(run_dir: Path, not_before: float) -> str | None:
    """The newest job with a SLURM output file in logs/ written after ``not_before`` whose wrapper did not get
    as far as the resume point (a job refused the lease publishes its refusal in its attempt's resume.json)."""
    prefix, suffix = SLURM_LOG.split("%j")
    found = []
    for log in logs_dir(run_dir).glob(SLURM_LOG.replace("%j", "*")):
        job_id = log.name[len(prefix) : -len(suffix)]
        if job_id.isdigit() and _mtime(log) >= not_before and not (logs_dir(run_dir) / job_id / RESUME).exists():
            found.append(int(job_id))
    return str(max(found)) if found else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def superseded(status: dict[str, Any], job: dict[str, Any]) -> bool:
    """Whether status.json speaks of an earlier job than the run's latest submission (`resume`, or the same
    command again, after the run was cancelled or failed): its final state must not hide the new job."""
    written, latest = str(status.get("job_id") or ""), str(job.get("job_id") or "")
    if not written or not latest or written == latest:
        return False
    return float(job.get("submitted") or 0) > float(status.get("updated") or 0)
