"""Stop signals: the handler only records; the wrapper's main loop forwards them and decides.

SLURM sends USR2 ahead of a preemption or the time limit (`--signal=USR2@N`; USR2 because NCCL may catch
USR1) to every process of the step. `swift` and torchrun must not die of it (they are started with USR2
ignored, see launch.py) while the training workers save on it (swiftslurm's `swiftslurm_stop` callback). The
workers run in sessions of their own under torchrun, so the wrapper forwards to each of them itself
rather than to a process group.

The wrapper records them from its start to its end on the node (supervise.py installs one SignalLog; under
submitit it replaces submitit's own handlers, which would requeue the job by themselves): the attempt's
phases read that one log (attempt.py), whatever they are doing when a signal comes.

This module is the one owner of signal dispositions in swiftslurm: which signals mean stop (the wrapper's
STOP_SIGNALS, a training rank's RANK_STOP_SIGNALS), save (SAVE_SIGNAL) and dump stacks (DUMP_SIGNAL), and the
only code that installs, restores or ignores a handler or blocks a signal (`install`, `restore`, `ignore_from_now_on`,
`ignore_save_signal`, `dump_stacks_on_signal`, `children_never_see_stop_signals`, `outlive_stop_signals`,
`end_like`); the wrapper, the launcher, the trainer's keeper and the ranks' plugins call these. It also owns what
is known of process trees (`parent_pids`, `descendants`, `living`, `describe`, `become_subreaper`): whom a
signal reaches, and whether a trainer's processes are gone.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import functools
import os
import resource
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, NoReturn

SAVE_SIGNAL = signal.SIGUSR2
# Asks a training rank to write its Python stacks (hooks.register_stack_dump). URG: ignored by default, so a
# process that registered nothing is unharmed; nothing in a training process sends or expects it (USR1 is a
# stop signal to the ranks, and NCCL may catch it).
DUMP_SIGNAL = signal.SIGURG
# What stops the wrapper: SLURM's warning (USR2), scancel's TERM, and INT (Ctrl-C on a run started by hand). Not
# USR1: NCCL may catch it, and SLURM is asked for USR2.
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)
# What stops a training rank: the wrapper's stop signals and USR1, the set ms-swift's own ShutdownManager stops on
# (behind the graceful_exit callback that swiftslurm_stop replaces); a rank only records it (hooks.StopRequest).
RANK_STOP_SIGNALS = (*STOP_SIGNALS, signal.SIGUSR1)
Handler = Callable[[int, FrameType | None], Any] | int | None  # what signal.signal takes and returns


@dataclass
class SignalLog:
    """Signals received, in order, with their arrival time (seconds since the epoch)."""

    received: list[tuple[int, float]] = field(default_factory=list)

    def record(self, signum: int, _frame: FrameType | None = None) -> None:
        self.received.append((signum, time.time()))

    def first(self, signum: int) -> float | None:
        return next((t for s, t in self.received if s == signum), None)

    def forget(self, count: int) -> None:
        """Drop the first ``count`` signals: an attempt has acted on them, the next one starts without them."""
        del self.received[:count]

    def install(self, signals: tuple[int, ...] = STOP_SIGNALS) -> dict[int, Handler]:
        """Make this log the handler of ``signals``; returns the handlers it replaced."""
        return install(self.record, signals)

    @contextlib.contextmanager
    def installed(self, signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[SignalLog]:
        previous = self.install(signals)
        try:
            yield self
        finally:
            restore(previous)


def install(handler: Handler, signals: tuple[int, ...] = STOP_SIGNALS) -> dict[int, Handler]:
    """Make ``handler`` the handler of each of ``signals``; returns the handlers it replaced (for `restore`)."""
    return {sig: signal.signal(sig, handler) for sig in signals}


def restore(previous: dict[int, Handler]) -> None:
    """Put back the handlers `install` replaced."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def ignore_from_now_on(signals: tuple[int, ...] = STOP_SIGNALS) -> None:
    """The process's work is done (the node's result is written, the job requeued, training over): a stop
    signal now has nothing left to stop, so the kernel ignores it for the rest of the process. A Python handler
    does not last that long: interpreter shutdown puts SIG_DFL back for every signal that has one (CPython's
    _PySignal_Fini; SIG_IGN is left alone), and a signal's default action kills the process. Under srun a task
    killed by a signal fails the step (--kill-on-bad-exit), whatever the run's result."""
    for sig in signals:
        signal.signal(sig, signal.SIG_IGN)


def ignore_save_signal() -> None:
    """For a child about to exec `swift` (Popen's preexec_fn): it and torchrun must survive SLURM's USR2,
    whose default action kills; the training ranks install their own handler over the inherited "ignore"."""
    signal.signal(SAVE_SIGNAL, signal.SIG_IGN)


# What Python ignores in every process it starts in, and subprocess puts back to the default action for a child
# it starts (restore_signals): a child started by other means is given the same.
PYTHON_IGNORES = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ") if hasattr(signal, name))


def outlive_stop_signals() -> None:
    """For the trainer's keeper (node/keeper.py), which must live as long as any process of the trainer's tree: the
    stop signals SLURM sends every process of the step (TERM, INT, USR1) do nothing to it. A handler, not SIG_IGN:
    exec gives the command the default action back, so `swift` behaves as if started directly. USR2 stays ignored,
    as inherited from the wrapper (ignore_save_signal): `swift` needs that."""
    install(_do_nothing, tuple(sig for sig in RANK_STOP_SIGNALS if sig != SAVE_SIGNAL))


def _do_nothing(_signum: int, _frame: FrameType | None) -> None:
    pass


def end_like(code: int) -> NoReturn:
    """End this process as its child ended, ``code`` in Popen's convention (-N: killed by signal N): with that exit
    status, or killed by that signal, its default action put back first and no core dumped (the child's crash is
    not this process's)."""
    if code >= 0:
        os._exit(code)
    signum = -code
    if signum != signal.SIGKILL:
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signum,))
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # a signal whose default action does not end a process (it ended the child, though)


_children_blocked = False  # children_never_see_stop_signals has hooked this process


def children_never_see_stop_signals(signals: tuple[int, ...] = RANK_STOP_SIGNALS) -> bool:
    """For a training rank: every process it starts from now on has ``signals`` blocked, for its whole life.

    SLURM signals every process of the job step, not only the ranks: `--signal=USR2@N`, `scancel --signal`, and
    TERM at a cancel, a preemption or the time limit. A data loader worker or an inference engine that a rank
    started would die of it (exec'ed or spawned, it has the default action; a forked torch worker dies of a TERM
    not from its parent), and the rank's next batch would fail before it could save. A blocked mask is inherited across
    fork and exec (CPython's _posixsubprocess keeps it), so the child never acts on them, while the rank's own
    mask is blocked only while it starts a child (`blocked_in_this_thread`: a signal then is delayed, not lost).
    Its children still end with it: a torch worker watches its parent, the wrapper KILLs the trainer's tree, and
    at exit `_kill_daemon_children` stands in for the TERM multiprocessing sends. Idempotent (False when already
    installed); it cannot be undone.

    It hooks the calls that every way of starting a process in Python ends in, whatever the start method: fork
    (`os.register_at_fork`), `_posixsubprocess.fork_exec` (subprocess; multiprocessing's spawn, forkserver and
    resource tracker) and `os.posix_spawn[p]`. Each blocks in the thread that starts the child, whose mask the
    child gets. Not around `Process.start`: the resource tracker unblocks INT and TERM once it has started."""
    global _children_blocked
    if _children_blocked:
        return False
    import _posixsubprocess
    import multiprocessing.util  # noqa: F401  registers its exit function now: atexit runs the later one first
    import subprocess

    # subprocess (3.11+) holds its own reference to fork_exec; multiprocessing looks it up at each call.
    for owner, name in (
        (_posixsubprocess, "fork_exec"),
        (subprocess, "_fork_exec"),
        (os, "posix_spawn"),
        (os, "posix_spawnp"),
    ):
        if callable(getattr(owner, name, None)):
            setattr(owner, name, _with_blocked(getattr(owner, name), signals))
    os.register_at_fork(before=lambda: _fork_masks.block(signals), after_in_parent=_fork_masks.restore)
    atexit.register(_kill_daemon_children)
    _children_blocked = True
    return True


@contextlib.contextmanager
def blocked_in_this_thread(signals: tuple[int, ...]) -> Iterator[None]:
    """Block ``signals`` in the calling thread while the block runs. One that arrives meanwhile stays pending
    and is delivered (its handler runs) when the previous mask is put back: delayed, not lost."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _with_blocked(start: Callable[..., Any], signals: tuple[int, ...]) -> Callable[..., Any]:
    @functools.wraps(start)
    def blocked(*args: Any, **kwargs: Any) -> Any:
        with blocked_in_this_thread(signals):
            return start(*args, **kwargs)

    return blocked


class _ForkMasks(threading.local):
    """The masks that the forks in progress in this thread replaced (register_at_fork's before and after are
    two calls, so the block cannot be one `with`)."""

    def __init__(self) -> None:
        self.stack: list[set[int]] = []

    def block(self, signals: tuple[int, ...]) -> None:
        self.stack.append(set(signal.pthread_sigmask(signal.SIG_BLOCK, signals)))

    def restore(self) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self.stack.pop())


_fork_masks = _ForkMasks()


def _kill_daemon_children() -> None:
    """At exit multiprocessing TERMs a process's daemon children and waits for them (its exit function, which runs
    after this one); torch relies on it for persistent data loader workers. They never see TERM, so they are
    KILLed here, SIGCHLD's default put back first: torch's handler would report each as "killed by signal",
    where TERM from their parent makes them exit 0."""
    import multiprocessing

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()


def dump_stacks_on_signal(file: IO[str]) -> None:
    """Make DUMP_SIGNAL write every thread's Python stacks to ``file``. faulthandler writes from a C handler, so
    a process blocked inside a collective (in C++, with or without the GIL) still writes them."""
    faulthandler.register(DUMP_SIGNAL, file=file, all_threads=True)


def parent_pids(proc: Path = Path("/proc")) -> dict[int, int]:
    """pid -> parent pid of every live process (one pass over /proc)."""
    found = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name), proc)) is not None:
            found[int(entry.name)] = int(stat[1][1])
    return found


def _stat(pid: int, proc: Path = Path("/proc")) -> tuple[str, list[str]] | None:
    """A process's name and the fields of /proc/PID/stat after it (state, parent, ...); None once it is gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:  # exited while we looked
        return None
    head, _, tail = stat.rpartition(")")  # the name may hold spaces and parentheses itself
    return head.partition("(")[2], tail.split()


def descendants(root: int, proc: Path = Path("/proc"), parents: dict[int, int] | None = None) -> list[int]:
    """Every live descendant of ``root``, whatever session or group it moved to (torchrun's workers)."""
    children: dict[int, list[int]] = {}
    for pid, ppid in (parent_pids(proc) if parents is None else parents).items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def catches(pid: int, signum: int, proc: Path = Path("/proc")) -> bool:
    """Whether ``pid`` has a handler installed for ``signum`` (the SigCgt mask of /proc/PID/status)."""
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:  # exited while we looked
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def outermost_catchers(root: int, signum: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes under ``root`` (itself included) that catch ``signum`` while their parent does not.

    A process that catches it and was forked by another that does only inherited the handler (a data
    loader worker, an inference engine started by a training rank): it is not one of the processes the
    signal is meant for."""
    parents = parent_pids(proc)
    catching = {pid for pid in [root, *descendants(root, proc, parents)] if catches(pid, signum, proc)}
    return [pid for pid in catching if parents.get(pid) not in catching]


def send(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def living(pids: list[int], proc: Path = Path("/proc")) -> list[int]:
    """Those of ``pids`` that have not exited. A process has once all its threads have: its first thread shows "Z"
    (a zombie) as soon as it is done, while others may still be exiting, the one that frees a CUDA context, or one
    blocked in a file system call (on an H200: "Z" 1 ms after a KILL, 110 GiB free and reaped only 0.46 s later)."""
    return [pid for pid in pids if _holding_thread(pid, proc) is not None]


_EXITED = ("Z", "X")  # /proc's state letters of a thread that is done: a zombie, dead


def _holding_thread(pid: int, proc: Path = Path("/proc")) -> tuple[int, str] | None:
    """(thread id, state letter) of the thread that keeps ``pid`` from having exited: its first thread unless that
    one is done, else another (one in an uninterruptible wait first); None once every thread is done, or it is gone."""
    stat = _stat(pid, proc)
    if stat is None:
        return None
    if stat[1][0] not in _EXITED:
        return pid, stat[1][0]
    tasks = proc / str(pid) / "task"
    try:
        tids = sorted(int(tid) for tid in os.listdir(tasks) if tid.isdigit() and int(tid) != pid)
    except OSError:
        return None
    others = [(tid, thread[1][0]) for tid in tids if (thread := _stat(tid, tasks)) is not None]
    exiting = [(tid, state) for tid, state in others if state not in _EXITED]
    return min(exiting, key=lambda found: found[1] != "D") if exiting else None


# /proc/PID/stat's state letters, as a log line names them.
STATES = {
    "R": "running",
    "S": "sleeping",
    "D": "in an uninterruptible wait: a device or a file system call that must be answered first",
    "T": "stopped",
    "t": "stopped by a debugger",
    "Z": "exited, not yet reaped",
}


def describe(pid: int, proc: Path = Path("/proc")) -> str:
    """One process for people: its number, name and state (of the thread that keeps it from having exited), where in
    the kernel that thread waits, and its command line."""
    stat = _stat(pid, proc)
    if stat is None:
        return f"{pid} (gone)"
    tid, letter = _holding_thread(pid, proc) or (pid, stat[1][0])
    state = STATES.get(letter, f"state {letter}")
    thread = "" if tid == pid else f"exited but for its thread {tid}, "
    wchan = _text(proc / str(pid) / ("wchan" if tid == pid else f"task/{tid}/wchan"))
    where = f", in {wchan}" if wchan not in ("", "0") else ""
    command = _text(proc / str(pid) / "cmdline").replace("\0", " ").strip()
    shown = command if len(command) <= 80 else command[:77] + "..."
    return f"{pid} {stat[0]} ({thread}{state}{where})" + (f": {shown}" if shown else "")


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper() -> bool:
    """Make this process the one its orphaned descendants are given to, instead of init (Linux's child subreaper): a
    training rank whose torchrun died stays under it, found by `descendants`, reaped by it. False where the kernel
    refuses or has no such call."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return False
    return bool(prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
