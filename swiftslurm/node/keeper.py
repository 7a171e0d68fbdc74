"""The trainer's first process: it starts the training command (`swift sft ...`) and outlives every process of its tree.

The wrapper starts it in a session of its own (launch.py). It makes itself a child subreaper, so a process whose
parent dies (a training rank once torchrun is gone) is given to it rather than to init: the whole tree stays under
one living process, which the wrapper walks (signals.descendants) to signal or KILL, whatever became of `swift`
and torchrun. It reaps them all and exits once the last one is gone, as the command ended (its exit status, or the
signal it died of). So the trainer has ended only when nothing it started runs any more: a KILLed rank still
freeing a large CUDA context, or waiting for a Lustre/NFS/FUSE server to answer a request it already holds, keeps
it alive.

It tells the wrapper, one line each on the channel it is given: `started PID`, or `error ERRNO` when the command
could not be started (it then exits 127); then `exited CODE` once the command itself ended (-N: killed by signal N).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from swiftslurm.signals import PYTHON_IGNORES, become_subreaper, end_like, outlive_stop_signals

# Runs this module with the wrapper's own swiftslurm, whatever the trainer's environment says (PYTHONPATH, or none).
_BOOT = "import sys; sys.path.insert(0, sys.argv.pop(1)); from swiftslurm.node.keeper import main; main(sys.argv[1:])"
_ROOT = str(Path(__file__).resolve().parents[2])


def argv(channel: int, command: list[str]) -> list[str]:
    """The keeper's command line: it runs ``command`` and reports on the file descriptor ``channel``."""
    return [sys.executable, "-c", _BOOT, _ROOT, str(channel), *command]


def main(args: list[str]) -> NoReturn:
    channel, command = int(args[0]), args[1:]
    os.set_inheritable(channel, False)  # the command gets the node log, not this
    outlive_stop_signals()
    if not become_subreaper():
        print("[swiftslurm] keeper: no child subreaper here; orphaned ranks go to init", file=sys.stderr, flush=True)
    try:
        # Nothing blocked, whatever mask this process was started with (a parent that blocks the stop signals in
        # what it starts, as a rank's plugin does): the command must see TERM and die of it like any process.
        child = os.posix_spawnp(command[0], command, os.environ, setsigdef=PYTHON_IGNORES, setsigmask=())
    except OSError as err:
        _tell(channel, f"error {err.errno}")
        end_like(127)
    _tell(channel, f"started {child}")
    end_like(reap_all(child, lambda code: _tell(channel, f"exited {code}")))


def reap_all(child: int, command_ended: Callable[[int], None], wait: Callable[[], tuple[int, int]] = os.wait) -> int:
    """Reap every child, the orphans given to this process among them, until none is left; ``command_ended`` hears
    the command's (``child``'s) exit code as soon as it is known. Returns that code."""
    code: int | None = None
    while True:
        try:
            pid, status = wait()
        except ChildProcessError:  # none left
            break
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            command_ended(code)
    assert code is not None, "the command was never reaped"
    return code


def _tell(channel: int, line: str) -> None:
    with contextlib.suppress(OSError):  # the wrapper stopped listening (it gave up on the tree): reap on regardless
        os.write(channel, f"{line}\n".encode())
