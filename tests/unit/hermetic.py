"""The unit tier's hermetic guard: a unit test may not start a process or open a network socket.

Every way Python starts a process or dials a socket is replaced, for the whole unit session, by a stub that
records what was attempted and where, then raises `HermeticityError`. The record is what fails the test (at its
teardown, see tests/unit/conftest.py), so code that swallows the exception with `except Exception` still fails.

Guarded:
- processes: subprocess.Popen (so run/check_output/asyncio subprocesses), os.fork, os.forkpty (so pty.fork),
  os.posix_spawn, os.posix_spawnp, os.system, os.exec* (os.spawn* and os.popen go through these), and
  multiprocessing's Process.start (so Pool and ProcessPoolExecutor).
- sockets: socket.socket.connect, connect_ex, bind and sendto, and socket.create_connection; that covers TCP,
  UDP and AF_UNIX servers and clients opened from Python.
Allowed:
- urllib3's import-time probe `_has_ipv6` (boto3 and ms-swift import urllib3): it binds ::1 port 0 and closes
  the socket, reaching nothing and listening for nothing.
- socket.socketpair: asyncio's event loop makes one for its self-pipe; it is an anonymous, connected AF_UNIX
  pair inside this process (on Linux made natively, without bind or connect), so it reaches nothing.
Not seen: sockets opened from C++ (torch.distributed's TCPStore, gloo). Tests using them start their ranks as
processes, which the guard does catch.
"""

from __future__ import annotations

import multiprocessing.process
import os
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
_THIS_FILE = str(Path(__file__).resolve())
# (file ending, function): callers whose bind is a probe of what the machine supports, not a server.
BIND_PROBES = {("urllib3/util/connection.py", "_has_ipv6")}
_EXEC_NAMES = ("execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe")
WHERE_TO_MOVE = (
    "Unit tests are hermetic (tests/README.md). Inject the process or the server (a fake runner, a fake "
    "client), or move the test to tests/component/ (real processes, SeaweedFS, DeepSpeed, signals; no SLURM) "
    "or tests/cluster/ (needs SLURM)."
)


class HermeticityError(AssertionError):
    """A unit test tried to start a process or open a socket."""


@dataclass
class Guard:
    """What the unit test running now attempted."""

    violations: list[str] = field(default_factory=list)

    def refuse(self, what: str) -> None:
        message = f"{what} at {_caller()}. {WHERE_TO_MOVE}"
        self.violations.append(message)
        raise HermeticityError(message)

    def take(self) -> list[str]:
        """The violations recorded so far, forgetting them."""
        taken, self.violations = self.violations, []
        return taken


def _caller() -> str:
    """The innermost frame of this repository's code (not the guard's): where the attempt was made."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename.startswith("<"):  # <frozen os>, <string>
            continue
        path = str(Path(frame.filename).resolve())
        if path.startswith(str(REPO)) and path != _THIS_FILE and "/.venv/" not in path:
            return f"{Path(path).relative_to(REPO)}:{frame.lineno}"
    return "<outside the repository>"


def _describe_argv(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    argv = args[0] if args else kwargs.get("args", "")
    return repr(argv)[:200] if argv != "" else ""


def _stub(guard: Guard, what: str, original: Callable[..., Any], describe: bool = False) -> Callable[..., Any]:
    def refusing(*args: Any, **kwargs: Any) -> Any:
        shown = f"{what}({_describe_argv(args, kwargs)})" if describe else what
        guard.refuse(shown)
        return original(*args, **kwargs)

    return refusing


def _method_stub(guard: Guard, what: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def refusing(self: Any, *args: Any, **kwargs: Any) -> Any:
        guard.refuse(f"{what}({', '.join(repr(a) for a in args)[:200]})")
        return original(self, *args, **kwargs)

    return refusing


def _bind(guard: Guard, original: Callable[..., Any]) -> Callable[..., Any]:
    def refusing(self: socket.socket, address: Any) -> None:
        caller = sys._getframe(1).f_code
        if not any(caller.co_filename.endswith(end) and caller.co_name == name for end, name in BIND_PROBES):
            guard.refuse(f"socket.bind({address!r})")
        original(self, address)

    return refusing


def _popen_init(guard: Guard, original: Callable[..., Any]) -> Callable[..., Any]:
    def refusing(self: subprocess.Popen[Any], *args: Any, **kwargs: Any) -> None:
        guard.refuse(f"subprocess.Popen({_describe_argv(args, kwargs)})")
        original(self, *args, **kwargs)

    return refusing


def install(guard: Guard, patch: pytest.MonkeyPatch) -> None:
    """Replace every process- and socket-starting call with one that records and refuses it."""
    patch.setattr(subprocess.Popen, "__init__", _popen_init(guard, subprocess.Popen.__init__))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", *_EXEC_NAMES):
        if hasattr(os, name):
            patch.setattr(os, name, _stub(guard, f"os.{name}", getattr(os, name), describe=True))
    start = multiprocessing.process.BaseProcess.start
    patch.setattr(multiprocessing.process.BaseProcess, "start", _method_stub(guard, "multiprocessing start", start))
    for name in ("connect", "connect_ex", "sendto"):
        original = getattr(socket.socket, name)
        patch.setattr(socket.socket, name, _method_stub(guard, f"socket.{name}", original))
    patch.setattr(socket.socket, "bind", _bind(guard, socket.socket.bind))
    create = socket.create_connection
    patch.setattr(socket, "create_connection", _stub(guard, "socket.create_connection", create, describe=True))
