"""Writing to a pipe whose reader went away (`swiftslurm logs RUN | head`): stop quietly, as Unix tools do.

Python turns SIGPIPE into BrokenPipeError, which would end the command with a traceback, and then complains
again when it flushes stdout at exit. (Python's documentation, "Note on SIGPIPE", recommends the same cure.)
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

CLOSED_PIPE_EXIT = 128 + 13  # what a shell reports for a tool ended by SIGPIPE


def quiet_on_closed_pipe(command: Callable[[list[str]], int], argv: list[str]) -> int:
    """``command(argv)``; if its reader closed stdout, point stdout at /dev/null (nothing left to flush into
    the closed pipe) and return CLOSED_PIPE_EXIT without a traceback."""
    try:
        return command(argv)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return CLOSED_PIPE_EXIT
