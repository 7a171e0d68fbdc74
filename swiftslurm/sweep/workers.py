"""A large sweep's per-point work (compose, plan, write the run dir: CPU-bound, ~10 ms a point) spread over
forked worker processes, one per usable CPU; a small sweep runs it in this process.

Workers are forked once the sweep's compositions exist, so each inherits them (and the parsed overrides) instead
of receiving them pickled; only a chunk's results travel back. A chunk that fails in a worker is run again here:
its error is raised in this process exactly as a serial sweep raises it (exceptions from Hydra and OmegaConf do
not all survive pickling), and the work is deterministic and writes nothing until every point is planned.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")
PARALLEL_FROM = 64  # points; below this, forking costs more than it saves
MAX_WORKERS = 8
_INHERITED: Any = None  # what the forked workers inherit (set before they are forked)


def inherited() -> Any:
    """In a worker (or this process): the state given to Workers."""
    return _INHERITED


class Workers:
    """`with Workers(state, n_points) as workers: workers.map(chunk_fn, items)`; chunk_fn must be a module-level
    function (it is sent by name) that takes a list of items and returns a list of results."""

    def __init__(self, state: Any, points: int) -> None:
        self.state = state
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        self.count = min(usable, MAX_WORKERS) if points >= PARALLEL_FROM else 1
        self.pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> Workers:
        global _INHERITED
        _INHERITED = self.state
        if self.count > 1:
            sys.stdout.flush()
            sys.stderr.flush()  # a forked worker must not inherit (and print again) unwritten output
            try:
                self.pool = ProcessPoolExecutor(self.count, mp_context=multiprocessing.get_context("fork"))
            except OSError:  # no POSIX semaphores here (e.g. no /dev/shm): the same work, in this process
                self.pool = None
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None) -> None:
        global _INHERITED
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
        _INHERITED = None

    def map(self, chunk_fn: Callable[[list[T]], list[R]], items: Sequence[T]) -> list[R]:
        """chunk_fn over the items, in chunks, results in order. A chunk that failed in a worker runs again here."""
        if self.pool is None:
            return chunk_fn(list(items))
        size = max(1, -(-len(items) // (self.count * 4)))  # 4 chunks a worker: an even finish
        chunks = [list(items[i : i + size]) for i in range(0, len(items), size)]
        results: list[R] = []
        for chunk, done in zip(chunks, self.pool.map(_guarded, [chunk_fn] * len(chunks), chunks), strict=True):
            results += chunk_fn(chunk) if done is None else done
        return results


def _guarded(chunk_fn: Callable[[list[T]], list[R]], chunk: list[T]) -> list[R] | None:
    """In a worker: the chunk's results, or None when it failed (this process runs it again to raise the error)."""
    try:
        return chunk_fn(chunk)
    except Exception:
        return None
