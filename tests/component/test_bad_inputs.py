"""Bad input is refused before the queue, in one line that names the fix (issue 14, item 10).

The corpus is data: tests/data/bad_inputs/. Every refused case runs the real command line in this process
(Hydra composes conf/, swiftslurm plans, writes the run dir unless it refuses) and must exit 2 with at most
12 lines of output, no traceback, a message naming the field and the fix, and nothing written. A few run as
real subprocesses to prove the exit status and the streams as a shell sees them. Accepted cases must plan, and
their values reach the run dir exactly as given (quoted where a shell reads them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import CORPUS, split

SUBPROCESS_CASES = ["+cluster.node=4", "dry_run", "run_dir={tmp}/afile"]


@pytest.mark.parametrize("args", SUBPROCESS_CASES)
def test_a_shell_sees_exit_2_and_one_line_on_stderr(args: str, tmp_path: Path) -> None:
    case = next(c for c in CORPUS["refused"] if c["args"] == args)
    if case.get("setup") == "file":
        (tmp_path / "afile").write_text("")
    argv = [a.replace("{tmp}", str(tmp_path)) for a in split(args)] + ["dry_run=true"]
    done = subprocess.run(
        [sys.executable, "-m", "swiftslurm", *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.startswith("swiftslurm: error: ") and len(done.stderr.splitlines()) == 1, done.stderr
    assert not (tmp_path / "runs").exists()
