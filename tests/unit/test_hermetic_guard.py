"""The unit tier's guard catches every way of starting a process or opening a socket (tests/unit/hermetic.py).

Each call is made so that, were the guard off, it would fail some other way or do no harm: a missing program
for spawn and exec (an unguarded exec would replace pytest itself), a child that exits at once for fork.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import socket
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.hermetic import WHERE_TO_MOVE, Guard, HermeticityError

MISSING = "/nonexistent/swiftslurm-hermetic-probe"


def _fork_then_exit_child(fork: Callable[[], Any]) -> None:
    """Fork; should the guard let it through, the child leaves at once and the parent reaps it."""
    result = fork()
    pid = result[0] if isinstance(result, tuple) else result
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _mp_start() -> None:
    multiprocessing.get_context("spawn").Process(target=os.getpid).start()


async def _asyncio_subprocess() -> None:
    await asyncio.create_subprocess_exec(MISSING)


ATTEMPTS: dict[str, Callable[[], Any]] = {
    "subprocess.Popen": lambda: subprocess.Popen([MISSING]),
    "subprocess.run": lambda: subprocess.run([MISSING], check=False),
    "asyncio subprocess": lambda: asyncio.run(_asyncio_subprocess()),
    "os.system": lambda: os.system("exit 0"),
    "os.fork": lambda: _fork_then_exit_child(os.fork),
    "os.forkpty": lambda: _fork_then_exit_child(os.forkpty),
    "os.posix_spawn": lambda: os.posix_spawn(MISSING, [MISSING], {}),
    "os.posix_spawnp": lambda: os.posix_spawnp(MISSING, [MISSING], {}),
    "os.execv": lambda: os.execv(MISSING, [MISSING]),
    "os.execve": lambda: os.execve(MISSING, [MISSING], {}),
    "os.execvp": lambda: os.execvp(MISSING, [MISSING]),
    "os.execl": lambda: os.execl(MISSING, MISSING),
    "os.spawnv": lambda: os.spawnv(os.P_WAIT, MISSING, [MISSING]),
    "multiprocessing start": _mp_start,
    "socket.connect": lambda: socket.socket().connect(("127.0.0.1", 1)),
    "socket.connect_ex": lambda: socket.socket().connect_ex(("127.0.0.1", 1)),
    "socket.bind": lambda: socket.socket().bind(("127.0.0.1", 0)),
    "socket.bind AF_UNIX": lambda: socket.socket(socket.AF_UNIX).bind("\0swiftslurm-hermetic-probe"),
    "socket.sendto": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", 9)),
    "socket.create_connection": lambda: socket.create_connection(("127.0.0.1", 1), timeout=1),
}


@pytest.mark.parametrize("attempt", ATTEMPTS.values(), ids=ATTEMPTS.keys())
def test_the_guard_refuses(attempt: Callable[[], Any], hermetic_guard: Guard) -> None:
    with pytest.raises(HermeticityError, match="tests/component/"):
        attempt()
    recorded = hermetic_guard.take()  # taken, so this test itself is not failed for what it provoked
    assert recorded, "the attempt was refused but not recorded: a test that swallows the error would pass"
    assert "tests/unit/test_hermetic_guard.py:" in recorded[0], "the message names where the attempt was made"


def test_a_swallowed_refusal_is_still_recorded(hermetic_guard: Guard) -> None:
    """What the fixture _hermetic fails the test for at its teardown, whatever the code under test caught."""
    with contextlib.suppress(Exception):
        subprocess.run([MISSING], check=False)
    recorded = hermetic_guard.take()
    assert len(recorded) == 1
    assert recorded[0].startswith(f"subprocess.Popen(['{MISSING}']) at tests/unit/test_hermetic_guard.py:")
    assert recorded[0].endswith(WHERE_TO_MOVE)


def test_asyncio_event_loops_are_allowed() -> None:
    """asyncio's self-pipe is a socketpair inside this process: unit tests may run event loops."""
    assert asyncio.run(asyncio.sleep(0, result=7)) == 7
    left, right = socket.socketpair()
    with left, right:
        left.sendall(b"x")
        assert right.recv(1) == b"x"


def test_urllib3s_ipv6_probe_is_allowed() -> None:
    """boto3 and ms-swift import urllib3, whose import binds ::1 port 0 once to learn whether IPv6 works."""
    from urllib3.util.connection import _has_ipv6

    assert _has_ipv6("::1") in (True, False)
