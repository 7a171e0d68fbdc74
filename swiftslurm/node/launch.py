"""Start ms-swift in a process group of its own, its output in the node's log file; stop it by group.

Its own group (a new session) means a signal meant for the trainers never hits this wrapper by accident,
and stopping the group reaches `swift`, torchrun and anything else they started in that group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from swiftslurm.secrets import redact_argv
from swiftslurm.signals import descendants, ignore_save_signal, send


class Trainer:
    """A running training command. ``wait()`` returns its exit code (negative: killed by that signal)."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        with open(log_path, "ab", buffering=0) as log:
            log.write(f"[swiftslurm] exec: {' '.join(redact_argv(argv))}\n".encode())
            self.proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # `swift` and torchrun must survive SLURM's USR2 (it kills by default); the workers
                # install swiftslurm_stop's handler over the inherited "ignore".
                preexec_fn=ignore_save_signal,
            )
        self._forwarded: set[int] = set()  # processes sent the save signal while they had a handler for it

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

    def signal_all(self, sig: int) -> None:
        """Send ``sig`` to the trainer and every descendant, torchrun's workers in their own sessions too."""
        send([self.proc.pid, *descendants(self.proc.pid)], sig)

    def forward(self, sig: int, recipients: Callable[[int], list[int]]) -> list[int]:
        """Send ``sig`` once to each process ``recipients(trainer pid)`` names; return those reached.

        The engine adapter names them (the training ranks, which have a handler for it): `swift` and
        torchrun ignore it, and a process with the default action dies of it. A training worker is such a
        process again once it is exiting (Python's shutdown restores the default action), so a rank that
        saved and is exiting while rank 0 still commits must not get it a second time: torchrun would take
        the dead rank for a failure and stop rank 0 before the commit. Called again, this reaches only
        processes that installed their handler since (a worker still loading).
        """
        targets = [p for p in recipients(self.proc.pid) if p not in self._forwarded]
        send(targets, sig)
        self._forwarded.update(targets)
        return targets

    def kill(self) -> int:
        """KILL everything the trainer started (a hung run cannot be asked politely); once it has ended, nothing
        more: its PID may be another process's by now."""
        if (code := self.proc.poll()) is not None:
            return code
        self.signal_all(signal.SIGKILL)
        return self.wait()
