"""Where were the ranks stuck: every rank's Python stacks, dumped before a hung trainer is killed.

Each rank registered a stack dump on DUMP_SIGNAL when it imported swiftslurm's plugin (hooks.py:
faulthandler, into logs/ATTEMPT/stacks/rank<R>.txt). When node 0's watchdog finds the run hung it writes
logs/ATTEMPT/hang.json (`ask`); every node's wrapper sees it on its next poll and signals its own ranks
(`dump_ranks`; a wrapper can only signal the processes of its own node), waits (bounded) until they have
written them (`wait_for_stacks`) and kills its trainer; node 0 waits the same way for every rank's, then
kills its own, and the attempt ends as hung (requeued or restarted like any infrastructure failure). The
wait is for the ranks that registered (their file exists): a rank still importing has nothing to write. A
node whose wrapper does not see hang.json in time (a shared file system's attribute cache) leaves its ranks'
files empty; the record names the ranks without stacks.

Why faulthandler rather than py-spy (installable from PyPI): py-spy must ptrace the ranks, which Yama's
default (`kernel.yama.ptrace_scope=1`: only an ancestor may trace) and containers without CAP_SYS_PTRACE
refuse to a helper the wrapper starts; a handler the rank installed itself needs no privilege and no binary.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from swiftslurm.rundir.jsonio import write_json_atomic
from swiftslurm.rundir.layout import hang_file, stack_file, stacks_dir
from swiftslurm.signals import DUMP_SIGNAL, outermost_catchers, send

STACKS_WAIT_S = 30.0  # node 0 waits this long for every rank's stacks before it kills its trainer anyway
SETTLE_S = 0.5  # after the last file got its first bytes: the rest of that dump (faulthandler writes in pieces)
POLL_S = 0.2


def ask(attempt_dir: Path, facts: dict[str, Any]) -> None:
    """Node 0: tell every node's wrapper the run is hung (replaced atomically: a reader sees all or nothing)."""
    write_json_atomic(hang_file(attempt_dir), facts, durable=False)


def asked(attempt_dir: Path) -> bool:
    return hang_file(attempt_dir).is_file()


def dump_ranks(trainer_pid: int) -> list[int]:
    """Signal this node's training ranks to write their stacks; returns their pids. A rank is the outermost
    process that registered the dump (what a rank forks inherits the handler and is not asked)."""
    ranks = outermost_catchers(trainer_pid, DUMP_SIGNAL)
    send(ranks, DUMP_SIGNAL)
    return ranks


def missing_stacks(attempt_dir: Path, ranks: range) -> list[int]:
    """The ranks whose stack file is absent (never registered) or empty (not dumped yet)."""
    folder = stacks_dir(attempt_dir)
    return [rank for rank in ranks if _size(stack_file(folder, rank)) == 0]


def wait_for_stacks(attempt_dir: Path, ranks: range, timeout_s: float = STACKS_WAIT_S) -> list[int]:
    """Wait, at most ``timeout_s``, until every rank of ``ranks`` that registered its dump has written its
    stacks; returns the ranks without stacks."""
    folder, deadline = stacks_dir(attempt_dir), time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(
        stack_file(folder, rank).is_file() for rank in missing_stacks(attempt_dir, ranks)
    ):
        time.sleep(POLL_S)
    time.sleep(SETTLE_S)
    return missing_stacks(attempt_dir, ranks)


def tidy(attempt_dir: Path, ranks: range) -> None:
    """Remove this node's empty stack files (every rank opens its file at start; most attempts never hang),
    and the folder once it is empty. Files with stacks stay."""
    folder = stacks_dir(attempt_dir)
    for rank in ranks:
        path = stack_file(folder, rank)
        if _size(path) == 0:
            path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty (another node's stacks), or gone already
        folder.rmdir()


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0
