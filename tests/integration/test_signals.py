"""Issue 14 item 6: the wrapper owns stop signals for its whole life on the node, not only while the trainer runs.

SLURM's USR2 comes while node 0 is still preparing (preflight) or agreeing on the resume point (a restore from
object storage can take long; the other nodes wait for it). The attempt must end as a preemption that
swiftslurm itself records and requeues, and the requeued attempt must train the run to its end: not submitit's
own handler requeueing behind the wrapper's back (no record: the next attempt calls it lost), nor, under
`sbatch job.sbatch`, the signal's default action killing the wrapper (the job fails).

The moment is forced, whatever the machine's speed, by a test hook (swiftslurm/node/test_hold.py): the leader
of the first attempt holds at the start of the phase until a stop signal is recorded, and says so in a file.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from swiftslurm.node.test_hold import HOLD_MARKER, HOLD_PHASE
from tests.integration.conftest import attempts, status, submit, swiftslurm, wait_for_job, wait_until

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STEPS = ("swift.max_steps=20", "swift.save_steps=10")
HOLD_WAIT_S = 300  # submission, scheduling and the preflight before the leader holds


def sbatch_job(run_dir: Path) -> str:
    """Prepare the run dir and submit its job.sbatch with plain sbatch, as the README shows."""
    prepared = swiftslurm("+cluster=local-slurm", "dry_run=true", f"run_dir={run_dir}", *STEPS, cwd=run_dir.parent)
    assert prepared.returncode == 0, prepared.stderr
    job = subprocess.run(["sbatch", "--parsable", str(run_dir / "job.sbatch")], capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    return job.stdout.strip().split(";")[0]


@pytest.mark.parametrize(
    ("entry", "phase"),
    [("submitit", "agree_on_resume"), ("sbatch", "prepare"), ("submitit", "prepare"), ("sbatch", "agree_on_resume")],
)
def test_a_signal_before_training_is_recorded_and_requeued_by_swiftslurm(
    tmp_path: Path, slurm_cluster: None, monkeypatch: pytest.MonkeyPatch, entry: str, phase: str
) -> None:
    held = tmp_path / "held"
    monkeypatch.setenv(HOLD_PHASE, phase)  # the job inherits the submitting environment
    monkeypatch.setenv(HOLD_MARKER, str(held))
    run_dir = tmp_path / "run"
    job = submit(run_dir, *STEPS) if entry == "submitit" else sbatch_job(run_dir)
    try:
        wait_until(held.is_file, HOLD_WAIT_S, f"node 0 to hold in {phase}")
        subprocess.run(["scancel", "--signal=USR2", job], check=True)  # what SLURM sends ahead of a preemption
        state = wait_for_job(job)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    records = attempts(run_dir)
    assert records, f"no attempt recorded; job {state}"
    first, last = records[0], records[-1]
    assert (first["attempt"], first["reason"], first["decision"]) == (job, "preempted", "requeue"), first
    assert [name for name, _ in first["signals"]][:1] == ["SIGUSR2"], first
    assert first["first_step_at"] is None and first["last_step"] is None, first  # no trainer was started
    assert not (run_dir / "logs" / job / "node0.log").exists()  # nor its log
    results = [json.loads((run_dir / "logs" / job / f"node{n}.json").read_text()) for n in (0, 1)]
    assert [r["exit_code"] for r in results] == [0, 0], results  # both nodes ended cleanly, neither was lost
    assert (last["job_id"], last["restart_count"]) == (job, len(records) - 1), last  # requeued, same job
    assert (last["reason"], last["decision"], last["committed_step"]) == ("finished", "done", 20), last
    assert state == "COMPLETED" and status(run_dir)["state"] == "finished", (state, status(run_dir))
