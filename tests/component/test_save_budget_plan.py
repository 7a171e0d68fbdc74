"""The plan warns when SLURM's stop signal comes too late for the model's checkpoint to be saved and committed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.unit.test_save_budget_plan import FULL_72B


def test_the_dry_run_prints_the_warning_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "swiftslurm", *FULL_72B, "dry_run=true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "signal_lead_s" in line]
    assert len(lines) == 1 and lines[0].startswith("swiftslurm: warning:") and "HINT: set" in lines[0]
