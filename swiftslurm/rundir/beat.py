"""The trainer's heartbeat: what global rank 0 is doing, rewritten at every step's end and every pause's edge.

logs/<attempt>/progress.json (the wrapper passes the path in PROGRESS_ENV) holds one small object:

    {"step": 26, "max_steps": 40, "phase": "save", "t": 1767000000.5}

``phase`` is what rank 0 does from ``t`` on: ``step`` (training the next step), or a pause the watchdog must not
take for a slow step: ``save``, ``eval``, ``epoch`` (the data loader starts over). At a step's end the Trainer's
flow has decided what follows it, so a save begins with the beat of the step it saves and ends with the next
beat. Node 0's wrapper (node/watch.py, node/hang.py) follows it; global rank 0 runs on node 0, so the writer's
and the reader's clocks are one.

One file replaced whole (temp file, rename, no fsync: nothing has to survive a crash); a reader sees the old beat
or the new one. Under the wrapper (`StepBeat.from_environ`) that write is off the training loop: a step's end only
stamps the beat and hands it to a daemon thread (`BeatWriter`), which writes the newest beat it has. A beat
replaced before it was written is never written, and beats are never written out of order, so the file only ever
moves forward. The stamp ``t`` is the hand-over, not the write: a slow file system delays a beat but does not
make rank 0 look slower. The thread writes only what the loop hands over, so a hung loop still falls silent for
the watchdog; ``flush`` waits for the newest beat to be on disk (the Committer: before a commit, at the end).
Only the standard library and rundir's own modules here: every training rank imports it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from swiftslurm.rundir.jsonio import peek_json, write_json_atomic
from swiftslurm.rundir.layout import spare_beat_file

PROGRESS_ENV = "SWIFTSLURM_PROGRESS"  # set by the wrapper (watch.py): where global rank 0 writes its beat

STEP = "step"  # training steps
SAVE = "save"  # writing a checkpoint, up to the end of the save hook (every rank has written its part)
EVAL = "eval"  # an evaluation
EPOCH = "epoch"  # an epoch ended: the data loader starts over; ends with the next step
PAUSES = (SAVE, EVAL, EPOCH)


@dataclass(frozen=True)
class Beat:
    step: int  # the newest step done
    max_steps: int | None  # the planned last step
    phase: str  # what rank 0 does since ``t``: STEP or one of PAUSES
    t: float  # when this beat was written (seconds since the epoch)


def read_beat(path: Path) -> Beat | None:
    """The beat in ``path``; None without one, or while it cannot be read just now (being replaced)."""
    data = peek_json(path) or {}
    step, total, phase, t = data.get("step"), data.get("max_steps"), data.get("phase"), data.get("t")
    if not isinstance(step, int) or not isinstance(t, (int, float)) or phase not in (STEP, *PAUSES):
        return None
    return Beat(step, total if isinstance(total, int) else None, str(phase), float(t))


BeatFile = Callable[[Path, dict[str, Any]], None]  # writes one beat to its file


def write_beat_file(path: Path, beat: dict[str, Any]) -> None:
    write_json_atomic(path, beat, durable=False)


class BeatWriter:
    """Writes the newest beat handed over from one daemon thread, started here (at the train's begin, not in a
    step). `hand` never waits for the file system: the thread holds the lock only to take the newest beat or to
    mark it written, never while writing. ``write`` reports its own failures; anything it raises is reported
    here, once, and the thread goes on with the next beat (a dead writer would make every `flush` wait for
    ever)."""

    def __init__(self, path: Path, write: Callable[[dict[str, Any]], None]) -> None:
        self._path, self._write = path, write
        self._changed = threading.Condition()
        self._newest: dict[str, Any] | None = None  # handed over, not yet taken by the thread
        self._handed = 0  # how many beats were handed over
        self._done = 0  # the hand-over count of the newest beat written (or failed)
        self._warned = False
        threading.Thread(target=self._run, name="swiftslurm-beat", daemon=True).start()

    def hand(self, beat: dict[str, Any]) -> None:
        """``beat`` replaces any beat not yet taken by the thread."""
        with self._changed:
            self._newest, self._handed = beat, self._handed + 1
            self._changed.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the newest beat handed over is written (or its write failed); False when ``timeout`` ran
        out first."""
        with self._changed:
            return self._changed.wait_for(lambda: self._done >= self._handed, timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._newest is not None)
                beat, number, self._newest = self._newest, self._handed, None
            try:
                self._write(beat)  # type: ignore[arg-type]  # not None: waited for
            except Exception as err:
                if not self._warned:
                    print(f"[swiftslurm] the heartbeat {self._path} cannot be written ({err!r})", flush=True)
                    self._warned = True
            finally:
                with self._changed:
                    self._done = number
                    self._changed.notify_all()


@dataclass
class StepBeat:
    """Global rank 0's writer (``path`` None on every other rank, or without the wrapper: it writes nothing).
    The pauses that follow a step are kept in the order the training loop runs them; each one's end starts the
    next, and the last one's the next step. A failed write is reported once and never stops training (the next
    beat tries again). ``background``: the writes run on a `BeatWriter` thread (what the plugins use); without,
    each call returns once its beat is on disk. ``write_file`` is the one write (a test holds it up)."""

    path: Path | None
    clock: Callable[[], float] = time.time
    step: int = 0
    max_steps: int | None = None
    pending: list[str] = field(default_factory=list)  # the pauses still ahead of the next step, in order
    background: bool = False
    write_file: BeatFile = write_beat_file
    _warned: bool = field(default=False, init=False, repr=False)
    _writer: BeatWriter | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.background and self.path is not None:
            self._writer = BeatWriter(self.path, self._write_now)

    @classmethod
    def from_environ(cls, rank_zero: bool) -> StepBeat:
        path = os.environ.get(PROGRESS_ENV) if rank_zero else None
        return cls(Path(path) if path else None, background=True)

    def step_ended(self, step: int, max_steps: int | None, follows: Sequence[str] = ()) -> None:
        """Every step's end: ``follows``, the pauses the loop runs before the next step (in its order)."""
        self.step, self.max_steps, self.pending = step, max_steps, list(follows)
        self.write()

    def pausing(self, *kinds: str) -> None:
        """Pauses begin now (an epoch's end; an evaluation the step's end did not foresee), ahead of any
        still pending. Nothing is written when they were foreseen: the pause began with the last beat."""
        pending = [*kinds, *(kind for kind in self.pending if kind not in kinds)]
        if pending != self.pending:
            self.pending = pending
            self.write()

    def pause_ended(self, kind: str) -> None:
        """A pause of ``kind`` is over: the next pending one begins, or the next step."""
        if kind in self.pending:
            self.pending.remove(kind)
            self.write()

    @property
    def phase(self) -> str:
        return self.pending[0] if self.pending else STEP

    def write(self) -> None:
        """The beat as of now: handed to the writer thread, or (without one) written before returning."""
        if self.path is None:
            return
        beat = {"step": self.step, "max_steps": self.max_steps, "phase": self.phase, "t": round(self.clock(), 3)}
        if self._writer is not None:
            self._writer.hand(beat)
        else:
            self._write_now(beat)

    def flush(self, timeout: float | None = None) -> bool:
        """Return once the newest beat is on disk (or its write failed); False when ``timeout`` ran out first."""
        return self._writer.flush(timeout) if self._writer is not None else True

    def _write_now(self, beat: dict[str, Any]) -> None:
        assert self.path is not None  # only rank 0's writes
        try:
            self.write_file(self.path, beat)
        except OSError as err:
            if not self._warned:
                print(f"[swiftslurm] the heartbeat {self.path} cannot be written ({err}); tried again", flush=True)
                self._warned = True


@dataclass
class ProgressWatch:
    """The wrapper's view of one trainer run's heartbeat: the newest beat, and the step facts the attempt's
    record keeps. A beat from before ``started`` is an earlier trainer's (a job id reused) and is ignored."""

    path: Path
    started: float
    beat: Beat | None = None
    first_step_at: float | None = None  # when the first step of this run ended
    last_change_at: float | None = None  # when the newest step ended

    def poll(self) -> Beat | None:
        """The beat, when it is new since the last poll; else None."""
        beat = read_beat(self.path)
        if beat is None or beat.t < self.started or beat == self.beat:
            return None
        if self.beat is None or beat.step != self.beat.step:
            self.last_change_at = beat.t
            self.first_step_at = self.first_step_at or beat.t
        self.beat = beat
        return beat

    @property
    def step(self) -> int | None:
        return self.beat.step if self.beat else None

    @property
    def max_steps(self) -> int | None:
        return self.beat.max_steps if self.beat else None

    def stalled_for(self, now: float) -> float:
        """Seconds since rank 0's last beat (since the start while there was none)."""
        return now - (self.beat.t if self.beat else self.started)


# The wrappers' own heartbeats (written by node/heartbeat.py): node 0's while the others wait for its word, and
# each spare's while it stands by. Their ages are judged against the reader's clock: a cluster's clocks agree to
# well under a second, STALE_S is minutes.
BEAT_S = 5.0  # how often a wrapper rewrites its heartbeat
STALE_S = 180.0  # a heartbeat this old means its wrapper is gone; far above NFS attribute caching (~60 s at most)

# Node 0's heartbeat while it chooses the resume point (logs/<attempt>/leader.json, written by
# node/heartbeat.py's LeaderBeat): `doing`, and `bytes` of `total` during a download. Read here, by the other
# nodes waiting for it and by `wait=true` saying what the run waits for.
GiB = 1 << 30


def read_leader_beat(path: Path) -> dict[str, Any] | None:
    """Node 0's heartbeat, or None when there is none (yet) or it cannot be read just now (being replaced)."""
    beat = peek_json(path)
    return beat if beat is not None and isinstance(beat.get("updated"), int | float) else None


def describe_leader_beat(beat: dict[str, Any]) -> str:
    """'downloading checkpoint-40 from s3://b/p/ (12.0 of 250.0 GiB)'."""
    doing = str(beat.get("doing", "?"))
    if beat.get("total"):
        return f"{doing} ({beat.get('bytes', 0) / GiB:.1f} of {beat['total'] / GiB:.1f} GiB)"
    return doing


# A spare's heartbeat while it stands by (logs/<attempt>/spares/<host>.json, written by node/heartbeat.py's
# beat_as_spare about every BEAT_S): its wrapper is there to join the next attempt. Read by node 0 before it
# calls a spare in (node/conclude.py) and by `status`.


def spare_silences(attempt_dir: Path, spares: Iterable[str], now: float, since: float) -> dict[str, float]:
    """Seconds each spare's wrapper has been silent at ``now``: since its last beat in ``attempt_dir``, or since
    ``since`` (when the attempt began) for one without a beat from then on (none yet, or an earlier job's)."""
    return {host: now - max(_spare_beat_at(spare_beat_file(attempt_dir, host)), since) for host in spares}


def _spare_beat_at(path: Path) -> float:
    """When the spare's wrapper last beat (0: never, or its beat cannot be read just now: being replaced)."""
    updated = (peek_json(path) or {}).get("updated")
    return float(updated) if isinstance(updated, int | float) else 0.0


@contextmanager
def every(interval_s: float, action: Callable[[], None], name: str) -> Iterator[None]:
    """Call ``action`` every ``interval_s`` from a daemon thread (named ``name``) while the block runs."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            action()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
