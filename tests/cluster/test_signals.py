"""Issue 14 item 6: the wrapper owns stop signals for its whole life on the node, not only while the trainer runs.

SLURM's USR2 comes while node 0 is still preparing (preflight) or agreeing on the resume point (a restore from
object storage can take long; the other nodes wait for it). The attempt must end as a preemption that
swiftslurm itself records and requeues, and the requeued attempt must train the run to its end: not submitit's
own handler requeueing behind the wrapper's back (no record: the next attempt calls it lost), nor, under
`sbatch job.sbatch`, the signal's default action killing the wrapper (the job fails).

The moment is forced, whatever the machine's speed, by a phase observer of the wrapper
(tests/cluster/hold_plugin.py, named in SWIFTSLURM_PHASE_OBSERVERS): the leader of the first attempt holds at
the start of the phase until a stop signal is recorded, and says so in a file.

After training, the leader waits (bounded) for its uploads: a signal then must cut that wait to what SLURM's
end time allows, so that the wrapper ends and records the storage state before SLURM kills it.
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from swiftslurm.node.observers import OBSERVERS_ENV
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts, job_state, status, submit, wait_for_job, wait_until
from swiftslurm.testing.s3 import FaultProxy, Faults, SeaweedServer, use_test_credentials
from tests.cluster.conftest import BRIDGE
from tests.cluster.hold_plugin import HOLD_MARKER, HOLD_PHASE, PLUGIN, node_marker

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]
STEPS = ("swift.max_steps=20", "swift.save_steps=10")
HOLD_WAIT_S = 300  # submission, scheduling (and, before agree_on_resume, the preflight) before the leader holds
S3_HOST = BRIDGE  # where the s3_server fixture listens: the jobs reach it there
BUCKET = "swiftslurm-signals"
KILL_MARGIN_S = 30  # attempt.KILL_MARGIN_S: the drain ends this long before SLURM's end time


def sbatch_job(run_dir: Path) -> str:
    """Prepare the run dir and submit its job.sbatch with plain sbatch, as the README shows."""
    prepared = swiftslurm("+cluster=local-slurm", "dry_run=true", f"run_dir={run_dir}", *STEPS, cwd=run_dir.parent)
    assert prepared.returncode == 0, prepared.stderr
    job = subprocess.run(["sbatch", "--parsable", str(run_dir / "job.sbatch")], capture_output=True, text=True)
    assert job.returncode == 0, job.stderr
    return job.stdout.strip().split(";")[0]


# Each entry point and each phase once (the phase logic is the same behind both entry points; the other two
# pairings add ~90 s to the suite and no path of their own).
@pytest.mark.parametrize(("entry", "phase"), [("submitit", "agree_on_resume"), ("sbatch", "prepare")])
def test_a_signal_before_training_is_recorded_and_requeued_by_swiftslurm(
    tmp_path: Path, slurm_cluster: None, monkeypatch: pytest.MonkeyPatch, entry: str, phase: str
) -> None:
    held = tmp_path / "held"
    monkeypatch.setenv(OBSERVERS_ENV, str(PLUGIN))  # the job inherits the submitting environment
    monkeypatch.setenv(HOLD_PHASE, phase)
    monkeypatch.setenv(HOLD_MARKER, str(held))
    run_dir = tmp_path / "run"
    job = submit(run_dir, *STEPS) if entry == "submitit" else sbatch_job(run_dir)
    try:
        wait_until(held.is_file, HOLD_WAIT_S, f"node 0 to hold in {phase}")
        # Node 0 holds; the other node may still be starting its wrapper: the signal waits for it.
        wait_until(lambda: all(node_marker(held, n).is_file() for n in (0, 1)), HOLD_WAIT_S, "both wrappers up")
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


def phase(run_dir: Path) -> str | None:
    path = run_dir / "status.json"
    return json.loads(path.read_text()).get("phase") if path.is_file() else None


def test_a_signal_during_the_upload_drain_cuts_it_to_slurms_end_time(
    tmp_path: Path, s3_server: SeaweedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_test_credentials(monkeypatch)  # exported in the submitting shell, as a user would
    run_dir = tmp_path / "run"
    storage = ("storage=s3", f"storage.bucket={BUCKET}", "storage.addressing_style=path", "storage.region=us-east-1")
    with FaultProxy(s3_server.endpoint_url, Faults(), host=BRIDGE, lifetime_s=900) as proxy:
        # An hour for the uploads at the end: only the signal can end that wait before the time limit.
        job = submit(run_dir, *STEPS, *storage, f"storage.endpoint_url={proxy.url}", "storage.wait_at_exit_s=3600")
        try:
            # The store goes away once node 0 has restored and published the resume point: no checkpoint of
            # this run can reach it, so the drain after training waits for uploads that keep failing.
            wait_until((run_dir / "logs" / job / "resume.json").is_file, HOLD_WAIT_S, "the resume point")
            proxy.stop()
            wait_until(lambda: phase(run_dir) == "finish_uploads", 600, "the upload drain")
            # SLURM's end comes near (as at a preemption, which moves it to the end of the grace time), then
            # the signal: the drain must end KILL_MARGIN_S before that end, not after its hour.
            limit = _minutes_so_far(job) + 2
            subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={limit}"], check=True)
            subprocess.run(["scancel", "--signal=USR2", job], check=True)
            state = wait_for_job(job, timeout_s=limit * 60)
        finally:
            subprocess.run(["scancel", job], capture_output=True)
    assert state == "COMPLETED", (state, job_state(job))  # not TIMEOUT: the wrapper ended before the limit
    [record] = attempts(run_dir)  # finished, and nobody (submitit) requeued it
    assert (record["reason"], record["decision"]) == ("finished", "done"), record
    synced = status(run_dir)
    assert synced["state"] == "finished" and synced["storage"]["pending"] == [10, 20], synced
    assert "checkpoint-20, the last, is not uploaded" in synced["why"], synced  # finished, but not silently


def _minutes_so_far(job: str) -> int:
    """Whole minutes the job has run, rounded up."""
    fields = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, check=True).stdout
    run_time = dict(f.split("=", 1) for f in fields.split() if "=" in f)["RunTime"]
    hours, minutes, seconds = (int(x) for x in run_time.split("-")[-1].split(":"))
    return math.ceil(hours * 60 + minutes + seconds / 60)
