"""A trainer whose last commit fails exits non-zero, and the wrapper does not call the run finished (issue 25,
item 1): a real Transformers Trainer with ms-swift's flow and swiftslurm's commit callback (commit_train.py),
its commits forced to hit ENOSPC. Transformers logs the end-of-training summary to logging.jsonl before
on_train_end joins the last commit, so the summary is there either way."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import is_committed
from swiftslurm.engines.hf import HfTrainerEngine
from swiftslurm.engines.progress import finished_steps
from swiftslurm.node import decide

pytest.importorskip("swift")
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
CHILD = Path(__file__).with_name("commit_train.py")


def train(output: Path, fault: str) -> subprocess.CompletedProcess[str]:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SWIFTSLURM_")}, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, str(CHILD), str(output), fault], capture_output=True, text=True, timeout=300, cwd=REPO, env=env
    )


def test_a_last_commit_that_hits_a_full_disk_fails_the_trainer_and_the_run_is_not_finished(tmp_path: Path) -> None:
    output = tmp_path / "output"
    done = train(output, "full-disk")
    log = done.stdout + done.stderr
    assert done.returncode != 0, log
    assert finished_steps(output) == (2, 2)  # the summary was logged all the same
    assert (output / "checkpoint-2").is_dir() and not is_committed(output / "checkpoint-2")
    assert "swiftslurm.errors.CommitFailed: the commit of the last checkpoint" in log
    assert not HfTrainerEngine().reached_last_step(output, ("--max_steps", "2"))
    facts = decide.AttemptFacts(done.returncode, None, 2, False, False, log, 60.0, None)
    reason, why = decide.classify(facts)
    assert reason is decide.Reason.INFRA and why.startswith("OSError: [Errno 28] No space left on device"), why


def test_a_last_commit_that_lands_ends_the_trainer_cleanly_and_finishes_the_run(tmp_path: Path) -> None:
    output = tmp_path / "output"
    done = train(output, "ok")
    assert done.returncode == 0, done.stdout + done.stderr
    assert is_committed(output / "checkpoint-2")
    assert HfTrainerEngine().reached_last_step(output, ("--max_steps", "2"))
