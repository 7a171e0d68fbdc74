"""A streamed dataset resumes at its data position on the real cluster with real ms-swift: the resumed attempt
skips the batches before its checkpoint (ms-swift's DataLoaderDispatcher reads them again) instead of training
on the stream's first batches a second time, so it ends with the same adapter bytes as a run never stopped.
The plan warns of that re-read (docs/resilience.md, 'What the adapters refuse')."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts, preempt_at_steps, submit, wait_for_job
from tests.cluster.conftest import ADAPTER, LONG

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
STREAM = (*LONG, "swift.streaming=true")


def test_a_streamed_run_preempted_mid_training_ends_identical_to_one_never_stopped(
    tmp_path: Path, slurm_cluster: None
) -> None:
    baseline = tmp_path / "uninterrupted"
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={baseline}", *STREAM, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "warning: swift.streaming=true" in done.stderr

    run_dir = tmp_path / "run"
    job = submit(run_dir, *STREAM)
    preempt_at_steps(run_dir, job, [30])
    assert wait_for_job(job) == "COMPLETED"
    first, last = attempts(run_dir)[0], attempts(run_dir)[-1]
    assert (first["reason"], last["reason"]) == ("preempted", "finished")
    assert last["resume_step"] == first["committed_step"] >= 30
    assert (run_dir / ADAPTER).read_bytes() == (baseline / ADAPTER).read_bytes()
