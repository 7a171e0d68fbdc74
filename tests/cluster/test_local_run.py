"""The embedded default, for real: the tiny Qwen3 trained by ms-swift on this CPU, no SLURM."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts

pytestmark = pytest.mark.slow


def test_default_command_trains_and_reports_loss_and_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    done = swiftslurm(f"run_dir={run_dir}", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    loss = re.search(r"final loss\s+([0-9.]+)", done.stdout)
    assert loss and 0 < float(loss.group(1)) < 20, done.stdout
    assert f"last checkpoint  {run_dir}/output/checkpoint-40" in done.stdout
    assert (run_dir / "output" / "checkpoint-40" / "adapter_model.safetensors").is_file()
    [attempt] = attempts(run_dir)
    assert attempt["exit_code"] == 0 and attempt["resumed_from"] is None

    # Same run directory again: other settings are refused; the same settings find the run finished and
    # submit nothing (a run that stopped would be resubmitted and continue from its newest checkpoint).
    again = swiftslurm(f"run_dir={run_dir}", "swift.max_steps=50", cwd=tmp_path)
    assert again.returncode == 2 and "different settings (--max_steps 40 → 50)" in again.stderr, again.stderr
    assert "committed checkpoint-40" in again.stderr
    again = swiftslurm(f"run_dir={run_dir}", cwd=tmp_path)
    assert again.returncode == 0 and "already finished" in again.stdout, again.stdout + again.stderr[-3000:]
    assert len(attempts(run_dir)) == 1
    plan = (run_dir / "plan.json").read_bytes()
    renamed = swiftslurm(f"run_dir={run_dir}", "run_name=other", cwd=tmp_path)  # nothing submitted: nothing written
    assert "HINT: a new run_dir=PATH trains anew." in renamed.stdout, renamed.stdout + renamed.stderr[-3000:]
    assert (run_dir / "plan.json").read_bytes() == plan

    (run_dir / "status.json").unlink()  # as if the job had died before its wrapper could write a final state
    (run_dir / "attempts.jsonl").unlink()
    again = swiftslurm(f"run_dir={run_dir}", cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert attempts(run_dir)[-1]["resumed_from"] == str(run_dir / "output" / "checkpoint-40")
