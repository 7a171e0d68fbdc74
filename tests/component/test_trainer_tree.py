"""A trainer has ended only once every process it started has exited: a KILLed rank whose file system request is in
the server's hands (Lustre, NFS, FUSE) exits only after the answer, and the next attempt must not start beside it;
a rank orphaned by torchrun's death is still found, and KILLed.

The file system is real: a FUSE mount whose server holds a read until the test answers it (swiftslurm/testing/
stallfs.py); skipped where no FUSE mount can be made (no /dev/fuse, fusermount3 or libfuse)."""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from swiftslurm.node.launch import Trainer
from swiftslurm.signals import descendants, living
from swiftslurm.testing import stallfs

# A stand-in for `swift` -> torchrun -> a rank in a session of its own; each writes its pid to OUT/NAME.pid. The
# rank reads the stalled file, in its main thread ("read") or in another one ("read-in-a-thread": a checkpoint
# writer thread), or sleeps; torchrun and swift exit at once with "exit".
SPAWN = """
import os, subprocess, sys, threading, time
out, name, then = sys.argv[1], sys.argv[2], sys.argv[3:]
open(os.path.join(out, name + ".pid"), "w").write(str(os.getpid()))
"""
RANK = f"""{SPAWN}
def read():
    open(then[1], "rb").read()
    open(os.path.join(out, "rank.answered"), "w").close()
if then[0] == "read":
    read()
elif then[0] == "read-in-a-thread":
    threading.Thread(target=read).start()
time.sleep(600)
"""
TORCHRUN = f"""{SPAWN}
subprocess.Popen([sys.executable, "-c", {RANK!r}, out, "rank", *then[1:]], start_new_session=True)
sys.exit(3) if then[0] == "exit" else time.sleep(600)
"""
SWIFT = f"""{SPAWN}
torchrun = subprocess.Popen([sys.executable, "-c", {TORCHRUN!r}, out, "torchrun", *then])
sys.exit(torchrun.wait()) if then[0] == "exit" else time.sleep(600)
"""


def wait_for(check: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def pid_of(out: Path, name: str) -> int:
    wait_for(lambda: (out / f"{name}.pid").is_file() and (out / f"{name}.pid").read_text() != "", f"{name}'s pid")
    return int((out / f"{name}.pid").read_text())


@pytest.fixture
def stalled(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(the stalled file, the control folder) of a mounted stallfs."""
    if (why := stallfs.unavailable()) is not None:
        pytest.skip(f"a FUSE mount is needed: {why}")
    control = tmp_path / "control"
    with stallfs.stalled_mount(tmp_path / "mnt", control) as stalled_file:
        yield stalled_file, control


def start(out: Path, *then: str, tree_exit_s: float = 600.0) -> Trainer:
    argv = [sys.executable, "-c", SWIFT, str(out), "swift", *then]
    return Trainer(argv, {}, out / "node0.log", cwd=out, tree_exit_s=tree_exit_s)


@pytest.mark.parametrize("reading", ["read", "read-in-a-thread"])
def test_kill_returns_only_once_a_rank_blocked_in_a_file_system_call_has_exited(
    tmp_path: Path, stalled: tuple[Path, Path], reading: str
) -> None:
    stalled_file, control = stalled
    trainer = start(tmp_path, "run", reading, str(stalled_file))
    try:
        wait_for(lambda: stallfs.reading(control), "the rank's read to reach the server")
        swift, torchrun, rank = (pid_of(tmp_path, name) for name in ("swift", "torchrun", "rank"))
        order: list[object] = []

        def kill() -> None:
            trainer.kill()
            order.append(("kill returned", "rank alive" if living([rank]) else "rank gone"))

        killer = threading.Thread(target=kill)
        killer.start()
        # swift and torchrun die of the KILL at once; the rank cannot until its read is answered. Before the fix,
        # kill() returned here: it waited for swift only.
        wait_for(lambda: not living([swift, torchrun]), "swift and torchrun to be gone")
        assert living([rank]) == [rank] and not (tmp_path / "rank.answered").exists()
        order.append("released")
        stallfs.release(control)
        killer.join(timeout=120)
        assert not killer.is_alive(), "kill() did not return after the read was answered"
        assert order == ["released", ("kill returned", "rank gone")]
        assert trainer.poll() == -signal.SIGKILL and trainer.leftovers == ()
        assert not (tmp_path / "rank.answered").exists()  # KILLed in its read: it never went on
    finally:
        stallfs.release(control)
        trainer.kill()


@pytest.mark.parametrize("reading", ["read", "read-in-a-thread"])
def test_a_rank_that_outlives_the_bound_is_named_and_the_trainer_counts_as_ended(
    tmp_path: Path, stalled: tuple[Path, Path], capsys: pytest.CaptureFixture[str], reading: str
) -> None:
    stalled_file, control = stalled
    trainer = start(tmp_path, "run", reading, str(stalled_file), tree_exit_s=0.5)
    try:
        wait_for(lambda: stallfs.reading(control), "the rank's read to reach the server")
        rank = pid_of(tmp_path, "rank")

        assert trainer.kill() == -signal.SIGKILL
        assert living([rank]) == [rank]  # still in its read: the bound, not the rank, ended the wait
        [left] = trainer.leftovers
        assert left.startswith(f"{rank} ") and "uninterruptible" in left, left
        assert ("exited but for its thread" in left) is (reading == "read-in-a-thread"), left
        logged = capsys.readouterr().out
        assert "[swiftslurm] 1 of the trainer's processes still there" in logged and left in logged, logged
    finally:
        stallfs.release(control)
        trainer.proc.wait(timeout=60)  # the keeper, once the rank has gone


def test_a_rank_orphaned_by_the_launchers_exit_is_found_and_killed_and_the_exit_code_stands(tmp_path: Path) -> None:
    """swift and torchrun exit (3) while a rank in its own session runs on: it is given to the keeper, not init."""
    trainer = start(tmp_path, "exit", "sleep")
    try:
        rank = pid_of(tmp_path, "rank")
        wait_for(lambda: trainer.command_exit is not None, "swift to exit")
        assert trainer.command_exit == 3
        assert trainer.poll() is None and descendants(trainer.pid) == [rank]  # under the keeper, not init
        assert trainer.kill() == 3  # swift's own exit code, not the KILL of what it left
        assert not living([rank])
    finally:
        trainer.kill()


def test_the_trainer_exits_as_its_command_did(tmp_path: Path) -> None:
    def ended(code: str) -> int:
        trainer = Trainer([sys.executable, "-c", code], {}, tmp_path / "node0.log", cwd=tmp_path)
        return trainer.wait(60)

    assert ended("import sys; sys.exit(7)") == 7
    assert ended("import os, signal; os.kill(os.getpid(), signal.SIGTERM)") == -signal.SIGTERM
    with pytest.raises(FileNotFoundError):
        Trainer(["no-such-swift-here"], {"PATH": "/usr/bin"}, tmp_path / "node0.log", cwd=tmp_path)
