"""Start ms-swift under its keeper in a session of its own, its output in the node's log file; end it only once every
process it started has exited.

Its own session means a signal meant for the trainers never hits this wrapper by accident. The keeper (keeper.py)
is the root of the trainer's process tree for as long as any of it runs: orphaned ranks are given to it, so the
wrapper finds them under it, and the keeper exits only once they are all gone. The wrapper's other children
(`scontrol`, the preflight's commands) are never part of that tree, so they are neither waited for nor killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from swiftslurm.node import keeper
from swiftslurm.secrets import redact_argv
from swiftslurm.signals import descendants, describe, ignore_save_signal, living, send

# How long kill() waits for the trainer's processes to be gone once KILLed: one freeing a large CUDA context takes
# seconds; one whose file system request is in a Lustre/NFS/FUSE server's hands waits for the answer, however long.
TREE_EXIT_S = 60.0
KILL_POLL_S = 0.05  # how often kill() looks again (and KILLs what a fork in flight started meanwhile)


class Trainer:
    """A running training command, under its keeper. ``poll()`` is its exit code (negative: killed by that signal)
    once every process of its tree has exited, or once kill() stopped waiting for those that outlived it
    (``leftovers``)."""

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path, tree_exit_s: float = TREE_EXIT_S
    ) -> None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_path = log_path
        self.tree_exit_s = tree_exit_s  # how long kill() waits for the tree (watch.py shortens it after a stop signal)
        self.leftovers: tuple[str, ...] = ()  # the processes still there when kill() stopped waiting (`describe`d)
        self._forwarded: set[int] = set()  # processes sent the save signal while they had a handler for it
        self._code: int | None = None
        reports, theirs = os.pipe()
        with open(log_path, "ab", buffering=0) as log:
            log.write(f"[swiftslurm] exec: {' '.join(redact_argv(argv))}\n".encode())
            try:
                self.proc = subprocess.Popen(
                    keeper.argv(theirs, list(argv)),
                    env=dict(env),
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    pass_fds=(theirs,),
                    # `swift` and torchrun must survive SLURM's USR2 (it kills by default); the workers
                    # install swiftslurm_stop's handler over the inherited "ignore".
                    preexec_fn=ignore_save_signal,
                )
            finally:
                os.close(theirs)
        self._reports = _Reports(reports)
        self.command_pid = self._started(argv[0])

    @property
    def pid(self) -> int:
        """The keeper's: the root of the trainer's tree, alive (its number not reused) until the tree has ended."""
        return self.proc.pid

    @property
    def command_exit(self) -> int | None:
        """The command's (`swift`'s) own exit code once it has exited, whether or not its processes have."""
        return self._reports.exited()

    def poll(self) -> int | None:
        if self._code is None and (code := self.proc.poll()) is not None:
            self._ended(code)
        return self._code

    def wait(self, timeout: float | None = None) -> int:
        """Wait until every process of the tree has exited."""
        if self._code is None:
            self._ended(self.proc.wait(timeout))
        assert self._code is not None
        return self._code

    def forward(self, sig: int, recipients: Callable[[int], list[int]]) -> list[int]:
        """Send ``sig`` once to each process ``recipients(trainer pid)`` names; return those reached.

        The engine adapter names them (the training ranks, which have a handler for it): `swift` and
        torchrun ignore it, and a process with the default action dies of it. A training worker is such a
        process again once it is exiting (Python's shutdown restores the default action), so a rank that
        saved and is exiting while rank 0 still commits must not get it a second time: torchrun would take
        the dead rank for a failure and stop rank 0 before the commit. Called again, this reaches only
        processes that installed their handler since (a worker still loading).
        """
        targets = [p for p in recipients(self.pid) if p not in self._forwarded]
        send(targets, sig)
        self._forwarded.update(targets)
        return targets

    def kill(self) -> int:
        """KILL every process of the trainer's tree (a hung run cannot be asked politely) and wait until they have
        all exited, at most ``tree_exit_s``: those still there then are named in one log line and in ``leftovers``,
        and the trainer counts as ended (with its command's exit code, or as KILLed). Once it has ended, nothing
        more: its processes' numbers may be others' by now."""
        if (code := self.poll()) is not None:
            return code
        left = kill_until_gone(self._tree, lambda: self.proc.poll() is not None, self.tree_exit_s)
        if self.poll() is None:  # past the bound, the keeper still waits for them (or, with none left, exits just now)
            self.leftovers = tuple(describe(pid) for pid in left or [self.pid])
            print(f"[swiftslurm] {leftovers_line(self.leftovers, self.tree_exit_s)}", flush=True)
            self._ended(-signal.SIGKILL if (exited := self.command_exit) is None else exited)
        code = self.poll()
        assert code is not None
        return code

    def _tree(self) -> list[int]:
        return living(descendants(self.pid))

    def _started(self, command: str) -> int:
        """The command's pid, once the keeper has started it; raises as Popen would when it could not."""
        kind, value = self._reports.first()
        if kind == "started" and value is not None:
            return value
        self.wait()
        self._reports.close()
        if kind == "error" and value is not None:
            raise OSError(value, os.strerror(value), command)
        raise RuntimeError(f"the trainer's keeper did not start {command}: see {self.log_path}")

    def _ended(self, code: int) -> None:
        self._code = code
        self._reports.exited()  # what the keeper said last
        self._reports.close()


def kill_until_gone(
    tree: Callable[[], list[int]],
    ended: Callable[[], bool],
    within_s: float,
    kill: Callable[[list[int]], None] = lambda pids: send(pids, signal.SIGKILL),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[int]:
    """KILL the processes ``tree()`` names, again and again (a fork in flight adds one), until ``ended()`` says
    they are all gone, for at most ``within_s``. Returns those still there then ([]: none)."""
    deadline = clock() + within_s
    while not ended():
        left = tree()
        if clock() >= deadline:
            return left
        kill(left)
        sleep(KILL_POLL_S)
    return []


def leftovers_line(leftovers: tuple[str, ...], within_s: float) -> str:
    """The log line about trainer processes that outlived their KILL: the next attempt may find their GPU memory
    and files in use."""
    return (
        f"{len(leftovers)} of the trainer's processes still there {within_s:.0f} s after they were KILLed (the next "
        f"attempt may find their GPU memory or files in use): {'; '.join(leftovers)}"
    )


class _Reports:
    """What the keeper says on its channel (keeper.py): `started PID` or `error ERRNO`, then `exited CODE`."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd
        self.heard: dict[str, int] = {}
        self.pending = b""

    def first(self) -> tuple[str, int | None]:
        """The keeper's first word, waited for: ("started", pid), ("error", errno), or ("", None) if it said none."""
        while self.fd is not None and not self.heard and self._read(block=True):
            pass
        kind = next(iter(self.heard), "")
        return kind, self.heard.get(kind)

    def exited(self) -> int | None:
        while self.fd is not None and self._read(block=False):
            pass
        return self.heard.get("exited")

    def _read(self, block: bool) -> bool:
        """Read what is there (waiting for it if ``block``); False once nothing more is."""
        assert self.fd is not None
        os.set_blocking(self.fd, block)
        try:
            chunk = os.read(self.fd, 4096)
        except BlockingIOError:
            return False
        if not chunk:  # the keeper has exited
            self.close()
            return False
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        self.heard |= parse_reports(lines)
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def parse_reports(lines: list[bytes]) -> dict[str, int]:
    """The keeper's lines as {word: number}; a line it would never write is dropped."""
    heard = {}
    for line in lines:
        word, _, number = line.decode(errors="replace").partition(" ")
        if word in ("started", "error", "exited") and number.lstrip("-").isdigit():
            heard[word] = int(number)
    return heard
