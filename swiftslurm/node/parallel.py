"""The worker pool that fetch.py (restores) and send.py (uploads) share: items handed out in order to a fixed
number of threads, and the first failure stopping the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import TypeVar

from swiftslurm.storage_spec import StorageError

Item = TypeVar("Item")


class Cancelled(StorageError):
    """The transfer's `cancel` was called, or another worker failed first: it stopped early."""


def each_in_parallel(
    items: Sequence[Item],
    make_worker: Callable[[], Callable[[Item], None]],
    threads: int,
    stop: threading.Event,
    thread_name: str,
) -> None:
    """Do every item with at most ``threads`` threads, each taking the next item in order as it frees up, with
    a worker of its own from ``make_worker`` (so it can keep per-thread state, e.g. a buffer). ``stop`` ends
    the work: set by the caller (a cancel) or here by the first failure, and checked before each item. The
    first real failure is raised, not the `Cancelled` of the threads it stopped."""
    queue = iter(items)
    lock = threading.Lock()

    def thread() -> None:
        work = make_worker()
        while not stop.is_set():
            with lock:
                item = next(queue, None)
            if item is None:
                return
            work(item)
        raise Cancelled("the transfer was stopped")

    with ThreadPoolExecutor(threads, thread_name_prefix=thread_name) as pool:
        futures = [pool.submit(thread) for _ in range(min(threads, len(items)))]
        wait(futures, return_when=FIRST_EXCEPTION)
        stop.set()  # all done, or one failed: either way nothing more to start
    errors = [err for future in futures if (err := future.exception()) is not None]
    causes = [err for err in errors if not isinstance(err, Cancelled)]  # the others stopped because of these
    if errors:
        raise (causes or errors)[0]
