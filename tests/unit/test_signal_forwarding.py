"""The save signal reaches each process that handles it once, and never one it would kill."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

from swiftslurm.node.launch import Trainer
from swiftslurm.node.signals import catches, descendants

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
        wait_for(lambda: len(descendants(trainer.pid)) == 3)
        counting, default, late = sorted(descendants(trainer.pid))
        wait_for(lambda: catches(counting, signal.SIGUSR2))

        first = trainer.forward(signal.SIGUSR2)
        assert counting in first and default not in first and trainer.pid not in first
        wait_for(lambda: catches(late, signal.SIGUSR2))
        assert trainer.forward(signal.SIGUSR2) == [late]  # the late one now; the first not a second time
        assert trainer.forward(signal.SIGUSR2) == []

        wait_for(lambda: (tmp_path / "counting").is_file() and (tmp_path / "late").is_file())
        time.sleep(0.3)
        assert (tmp_path / "counting").read_text() == "x" and (tmp_path / "late").read_text() == "x"
        assert trainer.poll() is None and default in descendants(trainer.pid)  # nothing was killed
    finally:
        trainer.kill()


def test_catches_reads_the_handler_mask(tmp_path: Path) -> None:
    status = tmp_path / "42" / "status"
    status.parent.mkdir()
    # Bit N-1 is signal N: USR2 (12) is 0x800, ignored here; USR1 (10) is 0x200, caught.
    status.write_text("Name:\tpython\nSigIgn:\t0000000000000800\nSigCgt:\t0000000180000200\n")
    assert catches(42, signal.SIGUSR2, proc=tmp_path) is False
    assert catches(42, signal.SIGUSR1, proc=tmp_path) is True
    assert catches(43, signal.SIGUSR2, proc=tmp_path) is False  # gone
