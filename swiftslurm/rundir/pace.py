"""Each node's own pace: how long its ranks' training forwards take, published by the node's local rank 0.

logs/<attempt>/pace/node<N>.json (the wrapper passes the path in PACE_ENV) holds one small object:

    {"node": 1, "forward_s": 0.0412, "steps": 15, "step": 230, "t": 1767000000.5}

``forward_s`` is the median, over the node's last RECENT_STEPS training steps, of the time its local rank 0
spent in the model's forward during each step (every micro-batch's); ``step`` its newest step. In a synchronous
job every rank's step wall time is the same (each waits for the others in the collectives), so it cannot name a
slow node; a forward of the unwrapped model (DDP, LoRA) holds no collective, so its duration is this node's own
compute, measured on this node's own clock: a slow GPU or CPU lengthens it, and nothing else does. Evaluations
do not count (only forwards while the model trains); saves hold no forward; one slow step is one sample of
RECENT_STEPS and moves no median. Node 0's wrapper compares the nodes (node/stragglers.py).

Written at most every PUBLISH_S (not every step: at 128 nodes the run dir's traffic matters), replaced whole
(temp file, rename, no fsync). Only the standard library and rundir's own modules here: every rank imports it.
"""

from __future__ import annotations

import os
import statistics
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from swiftslurm.rundir.jsonio import peek_json, write_json_atomic

PACE_ENV = "SWIFTSLURM_PACE"  # set by each node's wrapper (watch.py): where its local rank 0 writes its pace
RECENT_STEPS = 15  # the median of this many steps: one slow step (a stall, a GC pause) moves nothing
PUBLISH_S = 5.0  # a node writes its pace at most this often


@dataclass(frozen=True)
class Pace:
    """One node's pace, as its local rank 0 last published it."""

    node: int
    forward_s: float  # median forward seconds per training step, over ``steps`` recent steps
    steps: int  # how many steps that median is of
    step: int  # the newest step it includes
    t: float  # when it was written, on that node's clock (never compared with another node's)

    def as_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "forward_s": round(self.forward_s, 6),
            "steps": self.steps,
            "step": self.step,
            "t": round(self.t, 3),
        }


def read_pace(path: Path) -> Pace | None:
    """The pace in ``path``; None without one, or while it cannot be read just now (being replaced)."""
    data = peek_json(path) or {}
    node, forward, steps, step, t = (data.get(k) for k in ("node", "forward_s", "steps", "step", "t"))
    if not all(isinstance(v, int) for v in (node, steps, step)) or not isinstance(forward, (int, float)):
        return None
    if not isinstance(t, (int, float)) or forward <= 0:
        return None
    return Pace(int(node), float(forward), int(steps), int(step), float(t))  # type: ignore[arg-type]


def read_paces(folder: Path) -> dict[int, Pace]:
    """Every node's pace in ``folder`` (one listing, one read per node), by node."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return {}
    paces = (read_pace(folder / name) for name in names if name.endswith(".json"))
    return {pace.node: pace for pace in paces if pace is not None}


@dataclass
class PaceWriter:
    """A node's local rank 0 (``path`` None on every other rank, or without the wrapper: it writes nothing).
    ``step_ended`` at every training step's end with the forward seconds that step took."""

    path: Path | None
    node: int = 0
    clock: Callable[[], float] = time.time
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    published_at: float = float("-inf")
    _warned: bool = False

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] = os.environ) -> PaceWriter:
        path = environ.get(PACE_ENV) if environ.get("LOCAL_RANK", "0") == "0" else None
        return cls(Path(path) if path else None, int(environ.get("NODE_RANK") or "0"))

    def step_ended(self, step: int, forward_s: float) -> None:
        if self.path is None or forward_s <= 0:
            return
        self.recent.append(forward_s)
        now = self.clock()
        if now - self.published_at >= PUBLISH_S:
            self.published_at = now
            self.write(Pace(self.node, statistics.median(self.recent), len(self.recent), step, now))

    def write(self, pace: Pace) -> None:
        assert self.path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, pace.as_dict(), durable=False)
        except OSError as err:
            if not self._warned:
                print(f"[swiftslurm] the node's pace {self.path} cannot be written ({err}); tried again", flush=True)
                self._warned = True
