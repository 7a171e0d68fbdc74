"""Start ms-swift in a process group of its own, its output in the node's log file; stop it by group.

Its own group (a new session) means a signal meant for the trainers never hits this wrapper by accident,
and stopping the group reaches `swift`, torchrun and anything else they started in that group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path


class Trainer:
    """A running training command. ``wait()`` returns its exit code (negative: killed by that signal)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with open(log_path, "ab", buffering=0) as log:
            log.write(f"[swiftslurm] exec: {' '.join(argv)}\n".encode())
            self.proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the trainer's whole process group; a group already gone is not an error."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def stop(self, grace_s: float = 30.0) -> int:
        """TERM the group, then KILL it if it has not exited within ``grace_s`` seconds."""
        self.signal_group(signal.SIGTERM)
        try:
            return self.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.signal_group(signal.SIGKILL)
            return self.wait()
