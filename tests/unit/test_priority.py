"""Background uploads run at idle CPU priority, in their own threads only (swiftslurm.storage.priority)."""

from __future__ import annotations

import ctypes
import os
import platform
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.errors import StorageError
from swiftslurm.plan import StorageSpec
from swiftslurm.storage.priority import lower_this_thread
from swiftslurm.storage.store import UploadResult
from swiftslurm.storage.uploader import Uploader

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread priority is Linux's")


def this_thread() -> tuple[int, int]:
    """(scheduling policy, nice) of the calling thread: on Linux, pid 0 and the thread id mean this thread."""
    return os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def in_new_thread(work: Callable[[], Any]) -> Any:
    found: list[Any] = []
    thread = threading.Thread(target=lambda: found.append(work()))
    thread.start()
    thread.join()
    return found[0]


def lowered_then(priority: str) -> dict[str, tuple[int, int]]:
    """The lowered thread's own priority, and that of a thread it creates afterwards."""

    def work() -> dict[str, tuple[int, int]]:
        lower_this_thread(priority)
        return {"itself": this_thread(), "its child": in_new_thread(this_thread)}

    return in_new_thread(work)


def test_idle_lowers_the_thread_and_the_threads_it_creates() -> None:
    found = lowered_then("idle")
    assert found["itself"] == (os.SCHED_IDLE, 19)
    assert found["its child"] == (os.SCHED_IDLE, 19)


def test_idle_leaves_the_other_threads_alone() -> None:
    before = this_thread()
    lowered_then("idle")
    assert this_thread() == before
    assert in_new_thread(this_thread) == before


IOPRIO_GET = {"x86_64": 252, "aarch64": 31}


@pytest.mark.skipif(platform.machine() not in IOPRIO_GET, reason="ioprio_get's syscall number unknown here")
def test_idle_lowers_the_threads_io_priority_too() -> None:
    def io_class() -> int:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.syscall(IOPRIO_GET[platform.machine()], 1, threading.get_native_id())) >> 13

    def work() -> int:
        lower_this_thread("idle")
        return io_class()

    assert in_new_thread(work) == 3  # IOPRIO_CLASS_IDLE
    assert io_class() != 3


def test_normal_changes_nothing() -> None:
    assert lowered_then("normal")["itself"] == this_thread()


def test_unknown_priority_is_refused() -> None:
    with pytest.raises(ValueError, match="idle"):
        lower_this_thread("low")


def test_storage_spec_refuses_an_unknown_background_priority() -> None:
    with pytest.raises(StorageError, match="background_priority"):
        StorageSpec(bucket="b", prefix="p", background_priority="low")


class PriorityRecordingStore:
    """Stands in for CheckpointStore: each upload records the priority of the thread that runs it."""

    def __init__(self, priority: str) -> None:
        self.spec = StorageSpec(bucket="b", prefix="p", background_priority=priority)
        self.seen: list[tuple[int, int]] = []

    def upload(self, checkpoint: Path) -> UploadResult:
        self.seen.append(this_thread())
        return UploadResult(step=1, files=0, size=0, seconds=0.0)

    def cancel(self) -> None:
        pass


@pytest.mark.parametrize(("priority", "expected"), [("idle", (os.SCHED_IDLE, 19)), ("normal", None)])
def test_uploader_runs_uploads_at_the_configured_priority(
    tmp_path: Path, priority: str, expected: tuple[int, int] | None
) -> None:
    store = PriorityRecordingStore(priority)
    uploader = Uploader(store)  # type: ignore[arg-type]
    uploader.submit(tmp_path / "checkpoint-1")
    assert uploader.drain(timeout_s=10) == []
    assert store.seen == [expected or this_thread()]
    assert this_thread() != (os.SCHED_IDLE, 19)  # the caller's thread (the wrapper's main loop) is untouched
