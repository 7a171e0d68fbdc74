"""Run background work (checkpoint uploads) on CPU and disk time that training leaves idle.

On Linux the scheduling policy, the nice value and the I/O priority belong to each thread, not to the
process, and a thread passes them on to the threads it creates. So the uploader lowers its own thread
when it starts, and every thread it creates afterwards (swiftslurm.storage.send's) runs as low as it does,
while the wrapper's main thread (signals, the supervise loop) keeps its normal priority among the
wrapper's threads.

Thread priorities only compete within one scheduling group, though. Where the kernel groups processes by
session ("autogroup", on when /proc/sys/kernel/sched_autogroup_enabled is 1 and the processes are in the
root cpu cgroup, e.g. SLURM without the cpu controller), it first divides the CPU between sessions and only
then between their threads; ms-swift (launch.py) and torchrun's workers each run in a session of their own,
so an idle thread of the wrapper's session would still get that session's full share (measured: 38% of a
busy 2-core machine against 0.4% in one group). So "idle" also sets the wrapper's session to nice 19
against the other sessions (/proc/self/autogroup), when the wrapper leads its session: under srun it does
(one session per task, the wrapper alone, whose main loop mostly sleeps and still runs whenever the trainers
leave a moment of CPU); started from a shell or a test it does not, and the shell's session is left alone.

Everything here is best-effort: a kernel or a container that refuses a setting leaves the thread as it
was, and the upload goes on (logged once, at debug level).
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from swiftslurm.plan import BACKGROUND_PRIORITIES

log = logging.getLogger("swiftslurm.priority")

_LOWEST_NICE = 19
_IOPRIO_SET = {"x86_64": 251, "aarch64": 30}  # syscall numbers; Python's os module has no ioprio_set
_IOPRIO_WHO_PROCESS = 1  # "process" here is a thread id: the call affects that one thread
_IOPRIO_CLASS_IDLE = 3  # disk time only when no one else wants it (honoured by the bfq scheduler)
_IOPRIO_CLASS_SHIFT = 13


def lower_this_thread(priority: str) -> None:
    """Give the calling thread, and the threads it creates from now on, `priority`: "idle" (the lowest CPU
    and I/O priority; the process's session too, against other sessions) or "normal" (unchanged). Not
    Linux: nothing changes."""
    if priority not in BACKGROUND_PRIORITIES:
        raise ValueError(f"priority {priority!r} is not one of {BACKGROUND_PRIORITIES}")
    if priority == "normal" or not sys.platform.startswith("linux"):
        return
    thread_id = threading.get_native_id()
    _best_effort("nice 19", lambda: os.setpriority(os.PRIO_PROCESS, thread_id, _LOWEST_NICE))
    # SCHED_IDLE: the thread runs only when no normal thread wants the core, and a normal thread waking up
    # takes the core from it at once (nice 19 alone still takes ~1.5% of a busy core and waits for the tick).
    _best_effort("SCHED_IDLE", lambda: os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0)))
    _best_effort("idle I/O priority", lambda: _set_idle_io_priority(thread_id))
    if os.getsid(0) == os.getpid():  # a session of our own (srun makes one per task), not a shell's or a test's
        _best_effort("session nice 19", lambda: Path("/proc/self/autogroup").write_text(str(_LOWEST_NICE)))


def _set_idle_io_priority(thread_id: int) -> None:
    number = _IOPRIO_SET.get(platform.machine())
    if number is None:
        raise OSError(f"no ioprio_set syscall number known for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    value = _IOPRIO_CLASS_IDLE << _IOPRIO_CLASS_SHIFT
    if libc.syscall(number, _IOPRIO_WHO_PROCESS, thread_id, value) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _best_effort(what: str, change: Callable[[], object]) -> None:
    try:
        change()
    except (OSError, AttributeError) as err:  # AttributeError: an os module without SCHED_IDLE
        log.debug(f"[swiftslurm] background uploads keep their priority: {what} refused ({err})")
