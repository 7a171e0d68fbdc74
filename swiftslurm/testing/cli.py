"""Run the command line as a user would: `python -m swiftslurm ARGS`, in a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from swiftslurm.testing.node_group import with_partition


def command(*args: str) -> list[str]:
    """The argv of `python -m swiftslurm ARGS` with this interpreter (for Popen); a run on the local cluster
    goes to this test process's nodes (`node_group`)."""
    return [sys.executable, "-m", "swiftslurm", *with_partition(args)]


def swiftslurm(
    *args: str, cwd: Path, timeout: float = 600, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m swiftslurm ARGS` in ``cwd``, output captured; ``env`` adds to (or overrides) this environment."""
    return subprocess.run(
        command(*args), cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}
    )
