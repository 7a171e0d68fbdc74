"""Each node's own pace: how long its ranks' training forwards take, published by the node's local rank 0.

logs/<attempt>/pace/node<N>.json (the wrapper passes the path in PACE_ENV) holds one small object:

    {"node": 1, "rank": 3, "forward_s": 0.0412, "steps": 15, "step": 230, "t": 1767000000.5, "data_s": 0.0021}

Each rank's pace is the median, over its last RECENT_STEPS training steps, of the time it spent in the model's
forward during each step (every micro-batch's); every rank writes its own in a node-local folder
(LOCAL_PACE_ENV: never the shared run dir), and the node's local rank 0 publishes the slowest of them
(``rank``: which local rank that is) with its own newest ``step``: one slow GPU of eight names its node.

In a synchronous job every rank's step wall time is the same (each waits for the others in the collectives),
so it cannot name a slow node; a forward of the unwrapped model (DDP, LoRA) holds no collective, so its duration
is the rank's own compute, measured on its node's own clock: a slow GPU or CPU lengthens it, nothing else does.
Evaluations do not count (only forwards while the model trains); saves hold no forward; one slow step is one
sample of RECENT_STEPS and moves no median. Node 0's wrapper compares the nodes (node/stragglers.py).

``data_s`` (absent where the engine's fetches are not timed: engines/forward_clock.py, FetchClock): the median,
over the same recent steps, of the seconds a rank waited for its data loader before each step; the node's is its
slowest rank's. It is shown (`status`), never judged: the forwards alone name a straggler.

Written at most every PUBLISH_S (not every step: at 128 nodes the run dir's traffic matters), replaced whole
(temp file, rename, no fsync). Only the standard library and rundir's own modules here: every rank imports it.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from swiftslurm.rundir.jsonio import peek_json, write_json_atomic

PACE_ENV = "SWIFTSLURM_PACE"  # set by each node's wrapper (watch.py): where its local rank 0 writes its pace
LOCAL_PACE_ENV = "SWIFTSLURM_LOCAL_PACE"  # set by each node's wrapper: the node-local folder of its ranks' paces
LOCAL_PACE_FILE = "rank{rank}.json"  # in that folder, by local rank
RECENT_STEPS = 15  # the median of this many steps: one slow step (a stall, a GC pause) moves nothing
# A trainer's first steps are not its pace (lazy allocation, caches warming up, unevenly across ranks: on the
# local cluster node 0's first steps took 1.5 times node 1's): they are left out, and a rank writes nothing
# until RECENT_STEPS steps after them are timed.
WARMUP_STEPS = 5
PUBLISH_S = 5.0  # a node writes its pace at most this often


@dataclass(frozen=True)
class Pace:
    """One node's pace, as its local rank 0 last published it (in the node-local folder: one rank's own)."""

    node: int
    forward_s: float  # median forward seconds per training step, over ``steps`` recent steps
    steps: int  # how many steps that median is of
    step: int  # the newest step it includes
    t: float  # when it was written, on that node's clock (never compared with another node's)
    rank: int = 0  # the local rank it is of: in the run dir, the node's slowest
    data_s: float | None = None  # median seconds waited for the data loader per step (None: not timed)

    def as_dict(self) -> dict[str, object]:
        data = {} if self.data_s is None else {"data_s": round(self.data_s, 6)}
        return {
            "node": self.node,
            "rank": self.rank,
            "forward_s": round(self.forward_s, 6),
            "steps": self.steps,
            "step": self.step,
            "t": round(self.t, 3),
            **data,
        }


def read_pace(path: Path) -> Pace | None:
    """The pace in ``path``; None without one, or while it cannot be read just now (being replaced)."""
    data = peek_json(path) or {}
    node, forward, steps, step, t = (data.get(k) for k in ("node", "forward_s", "steps", "step", "t"))
    if not all(isinstance(v, int) for v in (node, steps, step)) or not isinstance(forward, (int, float)):
        return None
    if not isinstance(t, (int, float)) or forward <= 0:
        return None
    rank = data.get("rank") if isinstance(data.get("rank"), int) else 0
    waited = data.get("data_s")
    waited = float(waited) if isinstance(waited, (int, float)) and waited >= 0 else None
    return Pace(int(node), float(forward), int(steps), int(step), float(t), int(rank), waited)  # type: ignore[arg-type]


def read_paces(folder: Path) -> dict[int, Pace]:
    """Every node's pace in ``folder`` (one listing, one read per node), by node."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return {}
    paces = (read_pace(folder / name) for name in names if name.endswith(".json"))
    return {pace.node: pace for pace in paces if pace is not None}


def local_pace_dir(attempt: str, node: int) -> Path:
    """The node-local folder every local rank of ``node`` writes its own pace in, for its local rank 0 to read
    (never the run dir: at 128 nodes of 8 GPUs that would be 1024 files)."""
    return Path(tempfile.gettempdir()) / f"swiftslurm-pace-{attempt}-node{node}"


def local_paces(folder: Path | None) -> list[Pace]:
    """Every local rank's own pace in the node-local ``folder``."""
    try:
        names = os.listdir(folder) if folder is not None else []
    except FileNotFoundError:
        return []
    return [pace for name in names if folder is not None and (pace := read_pace(folder / name)) is not None]


def slowest(own: Pace, folder: Path | None) -> Pace:
    """``own`` (local rank 0's), or the slowest local rank's pace in ``folder`` with ``own``'s step and time: one
    slow GPU of eight names its node. Its data wait is the longest of any local rank's."""
    paces = [own, *local_paces(folder)]
    worst = max(paces, key=lambda pace: pace.forward_s)
    waits = [pace.data_s for pace in paces if pace.data_s is not None]
    return replace(own, forward_s=worst.forward_s, rank=worst.rank, data_s=max(waits) if waits else None)


@dataclass
class PaceWriter:
    """Every rank under the wrapper times its training forwards (``step_ended`` at every step's end with the
    forward seconds that step took); every PUBLISH_S it writes its own pace in the node-local folder ``local``,
    and the node's local rank 0 writes the node's, the slowest of them, to ``path`` in the run dir. Without the
    wrapper both are None and nothing is written."""

    path: Path | None  # the node's pace in the run dir: local rank 0's only
    local: Path | None = None  # the node-local folder of every local rank's own pace
    node: int = 0
    local_rank: int = 0
    clock: Callable[[], float] = time.time
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    recent_data: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))  # data waits, per step
    published_at: float = float("-inf")
    timed: int = 0  # steps timed by this trainer, its warm-up included
    _warned: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> PaceWriter:
        local_rank = int(environ.get("LOCAL_RANK") or "0")
        path, local = environ.get(PACE_ENV) if local_rank == 0 else None, environ.get(LOCAL_PACE_ENV)
        node = int(environ.get("NODE_RANK") or "0")
        return cls(Path(path) if path else None, Path(local) if local else None, node, local_rank)

    @property
    def active(self) -> bool:
        return self.path is not None or self.local is not None

    def data_waited(self, seconds: float) -> None:
        """A step's wait for its data (FetchClock), past the warm-up as the forwards are: published beside them."""
        if self.active and self.timed >= WARMUP_STEPS:
            self.recent_data.append(seconds)

    def step_ended(self, step: int, forward_s: float) -> None:
        if not self.active or forward_s <= 0:
            return
        self.timed += 1
        if self.timed <= WARMUP_STEPS:
            return
        self.recent.append(forward_s)
        if len(self.recent) < RECENT_STEPS or (now := self.clock()) - self.published_at < PUBLISH_S:
            return
        self.published_at = now
        waited = statistics.median(self.recent_data) if self.recent_data else None
        own = Pace(self.node, statistics.median(self.recent), len(self.recent), step, now, self.local_rank, waited)
        if self.local is not None:
            self.write(self.local / LOCAL_PACE_FILE.format(rank=self.local_rank), own)
        if self.path is not None:
            self.write(self.path, slowest(own, self.local))

    def write(self, path: Path, pace: Pace) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, pace.as_dict(), durable=False)
        except OSError as err:
            if not self._warned:
                print(f"[swiftslurm] the pace {path} cannot be written ({err}); tried again", flush=True)
                self._warned = True
