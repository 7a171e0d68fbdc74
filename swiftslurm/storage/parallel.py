"""What fetch.py (restores) and send.py (uploads) share: the transfer's state, and the worker pool that hands
items out in order to a fixed number of threads, the first failure stopping the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from typing import Any, Generic, TypeVar

from swiftslurm.errors import StorageError

Item = TypeVar("Item")
File = TypeVar("File")
Options = TypeVar("Options")


class Cancelled(StorageError):
    """The transfer's `cancel` was called, or another worker failed first: it stopped early."""


class Transfer(Generic[File, Options]):
    """Many files between this node and ``bucket`` through ``client`` (a botocore S3 client). A subclass's
    `run` does it; `cancel` (from another thread) stops it; ``progress(n)`` is called with each count of bytes
    moved."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        files: list[File],
        options: Options,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        self.client = client
        self.bucket = bucket
        self.files = files
        self.options = options
        self.progress = progress
        self._stop = threading.Event()  # set by `cancel`, or by the first failure: the other workers stop

    def run(self) -> None:
        raise NotImplementedError

    def cancel(self) -> None:
        self._stop.set()


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
