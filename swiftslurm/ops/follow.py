"""Feedback while a command reads a run or waits for it: `swiftslurm logs` (the current attempt's node logs and
its job's wrapper output, ms-swift's multi-line dumps folded to one line, `-f` naming each attempt as it starts
and the run's end state)
and `wait=true` sweeps (a line whenever a point changes state, instead of silence until the final table).

What to wait with (`pause`) and where the state comes from (`state_of`, `collect`) are passed in: the
commands pass a sleep and SLURM's view; tests pass steps that change a fixture run dir in a fixed order.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from swiftslurm.ops.runs import FINAL_STATES, RunFacts, RunState, SlurmView, submission
from swiftslurm.rundir.layout import NODE_LOG, logs_dir, node_logs, slurm_log, submitit_dir, submitit_logs
from swiftslurm.rundir.records import SUBMITIT_DIR, AttemptRecord, read_attempts, read_status

FOLLOW_POLL_S = 1.0
# An ms-swift record whose value is a repr spanning many lines: `[INFO:swift] args: SftArguments(` is ~330
# lines of every argument's default, `model_info: ModelInfo(... {` another ~40. They bury the progress lines.
_DUMP_START = re.compile(r"^\[[A-Z]+:swift\] .*[(\[{]$")
FOLD_MIN_LINES = 6  # a shorter block is printed as it is
# States that waiting does not change (only a person submitting or resuming does): a run in one of them that
# has no node logs will never have any, and a sweep waited for whose points are all in them is over.
SETTLED = ("planned", *FINAL_STATES)


class Folder:
    """Folds one log's multi-line dumps into their first line and a count. Lines come in pieces as the log
    grows, so a block can span reads: it is held until the next log record (a line starting with `[`) or a
    progress dict (`{'loss': ...`) ends it, or until `flush` at the end."""

    def __init__(self, verbose: bool) -> None:
        self.verbose = verbose
        self.block: list[str] = []

    def feed(self, lines: list[str]) -> list[str]:
        out: list[str] = []
        for line in lines:
            if self.block and line.startswith(("[", "{'")):
                out += self.flush()
            if self.block:
                self.block.append(line)
            elif not self.verbose and _DUMP_START.match(line):
                self.block = [line]
            else:
                out.append(line)
        return out

    def flush(self) -> list[str]:
        block, self.block = self.block, []
        if len(block) < FOLD_MIN_LINES:
            return block
        end = next((line.strip() for line in reversed(block[1:]) if line.strip()), "")
        return [f"{block[0]} … {end}  [{len(block) - 1} lines folded; `logs --verbose` shows them]"]


@dataclass
class LogReader:
    """One log, read on from where the last read stopped: each byte is read once. Only whole lines until
    ``final``. Opened at every poll rather than stat-ed first: on NFS an open revalidates the file's size
    (close-to-open), while a stat may answer from an attribute cache up to a minute old."""

    path: Path
    prefix: str
    folder: Folder
    offset: int = 0
    partial: bytes = b""  # the start of a line still being written: printed once its end comes

    def read(self, final: bool) -> list[str]:
        data, self.partial = self.partial + self._appended(), b""
        if not final:  # a line still being written waits for its end
            end = data.rfind(b"\n") + 1
            data, self.partial = data[:end], data[end:]
        lines = self.folder.feed(data.decode(errors="replace").splitlines())
        return [self.prefix + line for line in lines + (self.folder.flush() if final else [])]

    def _appended(self) -> bytes:
        with open(self.path, "rb") as stream:
            stream.seek(self.offset)
            data = stream.read()
        self.offset += len(data)
        return data


def current_attempt(run_dir: Path) -> Path | None:
    """The attempt whose logs are the run's current ones: one that has node logs and no record in
    attempts.jsonl yet (still going; the one status.json names if several are, as after a node died without a
    record), else the last one recorded. Decided from the records, not from which folder changed last."""
    with_logs = {d.name: d for d in logs_dir(run_dir).glob("*") if d.is_dir() and node_logs(d)}
    ended = [r.attempt for r in read_attempts(run_dir)]
    going = [d for name, d in with_logs.items() if name not in ended]
    named = str((read_status(run_dir) or {}).get("attempt"))
    if going:
        return with_logs[named] if named in with_logs and with_logs[named] in going else _newest(going)
    return next((with_logs[name] for name in reversed(ended) if name in with_logs), None)


def _newest(attempts: list[Path]) -> Path:
    return max(attempts, key=lambda d: d.stat().st_mtime)


def wrapper_logs(run_dir: Path) -> list[tuple[int | None, str, Path]]:
    """What the wrappers of the run's current job printed (restores, uploads, decisions, a crash before any
    attempt began), as (node, label, file): submitit's stdout and stderr of each node (in the run dir's
    submitit/, or the sweep dir's one job.json names for a job array's task), and SLURM's output of a job
    submitted by hand, where every node's lines are in one file (node None)."""
    job = submission(run_dir)
    job_id = str(job.get("job_id") or "")
    if not job_id:
        return []
    folder = Path(job.get(SUBMITIT_DIR) or submitit_dir(run_dir))
    found: list[tuple[int | None, str, Path]] = [
        (task, f"wrapper/node{task}" + ("/stderr" if stream == "err" else ""), path)
        for task, stream, path in submitit_logs(folder, job_id)
    ]
    by_hand = slurm_log(logs_dir(run_dir), job_id)
    return found + ([(None, "wrapper", by_hand)] if by_hand.is_file() else [])


@dataclass
class LogView:
    """What `logs` has shown of a run so far: the attempt being shown and how far each log was read (the
    attempt's node logs, and its job's wrapper output, which spans the job's attempts)."""

    run_dir: Path
    node: int | None
    verbose: bool
    out: TextIO
    shown: Path | None = None
    readers: dict[Path, LogReader] = field(default_factory=dict)

    def step(self, final: bool, announce: bool) -> None:
        """Print what is new, the wrappers' lines before the node logs'; a newer attempt is switched to after
        the old one's last lines."""
        newest = current_attempt(self.run_dir)
        if newest != self.shown:
            if self.shown is not None:
                self.emit(self.read(self.shown, final=True))
            if newest is not None and announce:
                self.say(announcement(newest.name, read_attempts(self.run_dir)))
            self.shown = newest
        self.emit(self.read_wrappers(final))
        if self.shown is not None:
            self.emit(self.read(self.shown, final))

    def read_wrappers(self, final: bool) -> list[str]:
        lines = []
        for node, label, path in wrapper_logs(self.run_dir):
            if self.node is None or node in (None, self.node):
                lines += self.reader(path, f"[{label}] ").read(final)
        return lines

    def read(self, attempt: Path, final: bool) -> list[str]:
        lines = []
        for log in node_logs(attempt):
            if self.node is None or log.name == NODE_LOG.format(node=self.node):
                lines += self.reader(log, f"[{attempt.name}/{log.stem}] ").read(final)
        return lines

    def reader(self, path: Path, prefix: str) -> LogReader:
        return self.readers.setdefault(path, LogReader(path, prefix, Folder(self.verbose)))

    def emit(self, lines: list[str]) -> None:
        for line in lines:
            print(line, file=self.out, flush=True)

    def say(self, text: str) -> None:
        print(f"[swiftslurm logs] {text}", file=self.out, flush=True)


def announcement(attempt: str, recorded: list[AttemptRecord]) -> str:
    """`attempt X started (the one before: reason → decision)` as an attempt comes into view. The one before is
    the record that precedes X's own in attempts.jsonl, or the last record while X has none; the first attempt
    has none. X already recorded (it ended before `logs -f` saw it) reads `attempt X (ended: ...; the one
    before: ...)`."""
    ids = [r.attempt for r in recorded]
    own = recorded[ids.index(attempt)] if attempt in ids else None
    before = recorded[: ids.index(attempt)] if own else recorded
    said = [f"ended: {_outcome(own)}"] if own else []
    said += [f"the one before: {_outcome(before[-1])}"] if before else []
    return f"attempt {attempt}" + ("" if own else " started") + (f" ({'; '.join(said)})" if said else "")


def _outcome(record: AttemptRecord) -> str:
    return f"{record.reason} → {record.decision}"


def show_logs(
    run_dir: Path,
    state_of: Callable[[Path], RunState | RunFacts],
    node: int | None = None,
    follow: bool = False,
    verbose: bool = False,
    out: TextIO | None = None,
    pause: Callable[[], None] = lambda: time.sleep(FOLLOW_POLL_S),
) -> int:
    """Print the newest attempt's node logs; with ``follow``, go on (into each new attempt, announced) until
    the run reaches a final state, then say which (exit 0 only if it finished). A run without node logs
    says why; exit 1 when it will never have any (planned, or ended before an attempt began)."""
    view = LogView(run_dir, node, verbose, out or sys.stdout)  # sys.stdout as it is now, not at import
    if not follow:
        view.step(final=True, announce=False)
        return 0 if view.shown is not None else nothing_yet(run_dir, state_of(run_dir), follow)
    waiting = False
    while True:
        facts = state_of(run_dir)  # asked before reading: every line written before a final state is read
        ended = facts.state in FINAL_STATES
        view.step(final=ended, announce=True)
        if view.shown is None and facts.state in SETTLED:
            return nothing_yet(run_dir, facts, follow)
        if ended:
            view.say(f"run {facts.state}" + (f": {facts.why}" if facts.why else ""))
            return 0 if facts.state == "finished" else 1
        if view.shown is None and not waiting:
            view.say(f"no attempt has started yet (state: {facts.state}); waiting for the first one")
            waiting = True
        pause()


def nothing_yet(run_dir: Path, facts: RunState | RunFacts, follow: bool) -> int:
    """No node logs: say why on stderr. Exit 1 when none will come, 0 when the job is still to start."""
    why = f": {facts.why}" if facts.why else ""
    hint = "" if follow or facts.state in SETTLED else " HINT: `logs -f` waits for it."
    ended = read_attempts(run_dir)
    if ended:  # attempts that ended without starting a trainer (nothing left to train, a refusal, the store)
        last = ended[-1]
        said = f"none of its {len(ended)} attempt(s) started a trainer (the last, {last.attempt}: "
        said += f"{last.reason} → {last.decision})"
    else:
        said = "no attempt has started yet"
    print(f"swiftslurm logs: {run_dir}: {said} (state: {facts.state}{why}).{hint}", file=sys.stderr)
    return 1 if facts.state in SETTLED else 0


def watch_points(
    path: Path,
    collect: Callable[[Path], tuple[list[RunFacts], SlurmView | None]],
    pause: Callable[[], None],
    out: TextIO | None = None,
) -> tuple[list[RunFacts], SlurmView | None]:
    """Until every point of a sweep has ended: a line each time a point's state changes (wait=true sweeps)."""
    seen: dict[str, str] = {}
    while True:
        facts, slurm = collect(path)
        for f in facts:
            if seen.get(f.run_dir) != f.state:
                print(change_line(f, seen.get(f.run_dir)), file=out or sys.stdout, flush=True)
                seen[f.run_dir] = f.state
        if all(f.state in SETTLED for f in facts):  # a point never submitted would be waited for forever
            return facts, slurm
        pause()


def change_line(facts: RunFacts, was: str | None) -> str:
    """`12:01:07  <run>: pending → running`, with the reason of any state but running or finished."""
    why = f" ({facts.why})" if facts.why and facts.state not in ("running", "finished") else ""
    change = f"{was} → {facts.state}" if was else facts.state
    return f"{time.strftime('%H:%M:%S')}  {facts.run_name}: {change}{why}"
