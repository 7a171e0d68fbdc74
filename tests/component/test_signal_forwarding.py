"""The save signal reaches each process that handles it once, and never one it would kill."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest

from swiftslurm.engines.registry import ENGINES
from swiftslurm.node.launch import Trainer
from swiftslurm.signals import catches, descendants, parent_pids

# A stand-in for `swift` -> torchrun -> ranks: the parent ignores USR2 (inherited from the wrapper), one child
# counts the USR2s it gets (a training worker with ms-swift's handler), one has USR2's default action again
# (a worker in Python's shutdown), one installs its handler only after a while (a worker still loading).
COUNTING = """
import signal, sys, time
time.sleep(float(sys.argv[2]))
signal.signal(signal.SIGUSR2, lambda *_: open(sys.argv[1], "a").write("x"))
time.sleep(60)
"""
DEFAULT = "import signal, time; signal.signal(signal.SIGUSR2, signal.SIG_DFL); time.sleep(60)"
TREE = f"""
import subprocess, sys, time
out = sys.argv[1]
subprocess.Popen([sys.executable, "-c", {COUNTING!r}, out + "/counting", "0"])
subprocess.Popen([sys.executable, "-c", {DEFAULT!r}])
subprocess.Popen([sys.executable, "-c", {COUNTING!r}, out + "/late", "1.5"])
time.sleep(60)
"""


def wait_for(check, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_save_signal_goes_once_to_each_handler_and_never_to_a_default_action(tmp_path: Path) -> None:
    trainer = Trainer([sys.executable, "-c", TREE, str(tmp_path)], {}, tmp_path / "log", cwd=tmp_path)
    try:
        wait_for(lambda: len(descendants(trainer.command_pid)) == 3)
        counting, default, late = sorted(descendants(trainer.command_pid))
        wait_for(lambda: catches(counting, signal.SIGUSR2))

        recipients = ENGINES["swift"].stop_recipients
        first = trainer.forward(signal.SIGUSR2, recipients)
        assert counting in first and default not in first and trainer.command_pid not in first
        wait_for(lambda: catches(late, signal.SIGUSR2))
        assert trainer.forward(signal.SIGUSR2, recipients) == [late]  # the late one now; the first not a second time
        assert trainer.forward(signal.SIGUSR2, recipients) == []

        wait_for(lambda: (tmp_path / "counting").is_file() and (tmp_path / "late").is_file())
        time.sleep(0.3)
        assert (tmp_path / "counting").read_text() == "x" and (tmp_path / "late").read_text() == "x"
        assert trainer.poll() is None and default in descendants(trainer.command_pid)  # nothing was killed
    finally:
        trainer.kill()


# A training rank under `swift` -> torchrun (both ignore USR2) that starts what GRPO with vLLM colocate starts:
# a forked child (a data loader worker or an engine process made by fork: it inherits the rank's handler) and
# an exec'ed engine process (its own interpreter: USR2 has the default action there, which kills). Each
# writes its pid to its own file when USR2 reaches it.
RANK = """
import os, signal, subprocess, sys, time
out = sys.argv[1]
mark = lambda name: (lambda *_: open(os.path.join(out, name), "a").write(str(os.getpid()) + "\\n"))
signal.signal(signal.SIGUSR2, mark("rank"))
if os.fork() == 0:
    signal.signal(signal.SIGUSR2, mark("forked"))  # still a handler: only the tree decides it is no rank
    open(os.path.join(out, "forked.ready"), "w").close()
    time.sleep(60)
    os._exit(0)
engine = "import signal, time; open(__import__('sys').argv[1], 'w').close(); time.sleep(60)"
subprocess.Popen([sys.executable, "-c", engine, os.path.join(out, "engine.ready")])
time.sleep(60)
"""
LAUNCHER = f"""
import signal, subprocess, sys, time
signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # as torchrun under swiftslurm: it ignores the save signal
for rank in range(2):
    subprocess.Popen([sys.executable, "-c", {RANK!r}, sys.argv[1]], start_new_session=True)
time.sleep(60)
"""


@pytest.mark.parametrize("launcher", sorted(ENGINES))
def test_only_training_ranks_get_the_save_signal_never_what_they_started(tmp_path: Path, launcher: str) -> None:
    trainer = Trainer([sys.executable, "-c", LAUNCHER, str(tmp_path)], {}, tmp_path / "log", cwd=tmp_path)
    try:
        # under the launcher: 2 ranks, and a forked child and an exec'ed engine under each rank
        wait_for(lambda: len(descendants(trainer.command_pid)) == 6)
        wait_for(lambda: (tmp_path / "engine.ready").is_file() and (tmp_path / "forked.ready").is_file())
        tree = descendants(trainer.command_pid)
        ranks = _children_of(trainer.command_pid, tree)
        assert len(ranks) == 2 and all(catches(p, signal.SIGUSR2) for p in ranks)

        reached = trainer.forward(signal.SIGUSR2, ENGINES[launcher].stop_recipients)

        assert sorted(reached) == sorted(ranks)
        wait_for(lambda: len(_lines(tmp_path / "rank")) == 2)
        time.sleep(0.5)  # a stray signal would have landed by now
        assert not (tmp_path / "forked").exists(), "a process forked by a rank got the save signal"
        assert len(descendants(trainer.command_pid)) == 6, "a process was killed by the save signal"
    finally:
        trainer.kill()


def _children_of(pid: int, tree: list[int]) -> list[int]:
    parents = parent_pids()
    return [p for p in tree if parents.get(p) == pid]


def _lines(path: Path) -> list[str]:
    return path.read_text().split() if path.is_file() else []


def test_catches_reads_the_handler_mask(tmp_path: Path) -> None:
    status = tmp_path / "42" / "status"
    status.parent.mkdir()
    # Bit N-1 is signal N: USR2 (12) is 0x800, ignored here; USR1 (10) is 0x200, caught.
    status.write_text("Name:\tpython\nSigIgn:\t0000000000000800\nSigCgt:\t0000000180000200\n")
    assert catches(42, signal.SIGUSR2, proc=tmp_path) is False
    assert catches(42, signal.SIGUSR1, proc=tmp_path) is True
    assert catches(43, signal.SIGUSR2, proc=tmp_path) is False  # gone
