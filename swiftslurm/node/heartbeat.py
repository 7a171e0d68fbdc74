"""The wrappers' heartbeats: node 0's while the other nodes wait for its word, and each spare's while it stands by.

Restoring a large checkpoint from object storage takes as long as it takes (~250 GB: well over 15 minutes),
so the other nodes do not wait a fixed time. A small thread on node 0 rewrites logs/<attempt>/leader.json
every BEAT_S with what it is doing and, while it downloads, the bytes so far. The others wait while that
file is fresh and give up once it is STALE_S old (node 0 died, hangs, or lost the run dir), saying what
node 0 was last doing. Staleness is judged from the time node 0 wrote into the file against the reader's
clock: a cluster's clocks agree to well under a second, STALE_S is minutes.

A spare (`resilience.spare_nodes`) beats too while it stands by (`beat_as_spare`, from its wait: outcome.py),
so node 0 calls in only a spare whose wrapper is there to join (conclude.py): SLURM reports a node up whatever
became of the wrapper on it. The lease (rundir/lease.py) asks nothing of the spares: it fences the one job
that changes the run dir, and a spare changes nothing there but its own heartbeat.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from swiftslurm.rundir.beat import BEAT_S, STALE_S, describe_leader_beat, every, read_leader_beat
from swiftslurm.rundir.jsonio import write_json_atomic

log = logging.getLogger("swiftslurm.heartbeat")
GiB = 1 << 30


class LeaderBeat:
    """Node 0's heartbeat file. `started`/`moved` follow a download (store.TransferReport); `doing` names
    any other step. Thread-safe: the download's threads report their bytes concurrently."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._doing = "starting"
        self._bytes = 0
        self._total: int | None = None

    def doing(self, what: str) -> None:
        with self._lock:
            self._doing, self._bytes, self._total = what, 0, None
        self.write()

    def started(self, what: str, total: int) -> None:
        with self._lock:
            self._doing, self._bytes, self._total = what, 0, total
        self.write()

    def moved(self, count: int) -> None:
        with self._lock:
            self._bytes += count

    def write(self) -> None:
        """Rewrite the file now (atomically: a reader sees the old beat or the new one)."""
        with self._lock:
            beat = {"doing": self._doing, "bytes": self._bytes, "total": self._total}
        beat |= {"host": socket.gethostname(), "pid": os.getpid(), "updated": round(time.time(), 3)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, beat)
        except OSError as err:  # a missed beat is tolerated (STALE_S is many beats); the next one tries again
            log.warning(f"[swiftslurm] could not write the heartbeat {self.path}: {err}")

    @contextmanager
    def running(self) -> Iterator[LeaderBeat]:
        """Beat every BEAT_S from a daemon thread while the block runs."""
        self.write()
        with every(BEAT_S, self.write, "swiftslurm-leader-beat"):
            yield self


def leader_silence(path: Path, now: float, waiting_since: float) -> str | None:
    """Why a node should stop waiting for node 0 (its heartbeat at ``path`` is STALE_S old, or has not
    appeared STALE_S after this node began waiting at ``waiting_since``), or None while node 0 is alive."""
    beat = read_leader_beat(path)
    # A beat from before this wait began may be an earlier job's (job ids repeat on a new cluster): like no
    # beat at all, it gives node 0 STALE_S from the start of the wait to beat.
    earlier = beat is not None and float(beat["updated"]) < waiting_since - 2 * BEAT_S
    if (beat is None or earlier) and now - waiting_since <= STALE_S:
        return None
    if beat is None:
        return f"node 0 has written no heartbeat ({path}) in the {now - waiting_since:.0f} s this node has waited"
    age = now - float(beat["updated"])
    if age <= STALE_S:
        return None
    where = f"{beat.get('host', '?')}, pid {beat.get('pid', '?')}"
    return f"node 0 ({where}) stopped its heartbeat {age:.0f} s ago, while {describe_leader_beat(beat)}"


def beat_as_spare(path: Path) -> None:
    """A standing-by spare's heartbeat (rundir/beat.py: spare_silences), rewritten whole and not flushed to disk:
    nothing of it has to survive a crash. A missed beat is tolerated, as node 0's is (STALE_S is many beats)."""
    beat = {"host": socket.gethostname(), "pid": os.getpid(), "updated": round(time.time(), 3)}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, beat, durable=False)
    except OSError as err:
        log.warning(f"[swiftslurm] could not write the spare's heartbeat {path}: {err}")
