"""`resilience.straggler_action=swap`: node 0 asks every node to stop at a checkpoint, so that a spare takes the
straggler's place.

Node 0's wrapper names a straggler (node/stragglers.py); when a spare is left and the allocation has restarts in
place to spend (`choose`, pure), it writes swap.json in the attempt dir (`request`). Every node's wrapper looks
for that file at its poll (`requested`) and then stops its trainer as a stop signal does (watch.py): the ranks
save at the step they agree on, and each wrapper ends its trainer once that checkpoint is committed. Node 0
concludes the attempt as STRAGGLER and restarts it in place, the spare at the straggler's node rank, from that
checkpoint (decide.swap_in_spares); the straggler's wrapper ends (attempt._follow: off the roster, not a spare).

A file, not a signal: a wrapper on another node is reachable only through SLURM (`scancel --signal`), whose
signal reaches every task of the job as a stop signal, which each node takes for a preemption or a time limit
(and a spare for the end of the job); the shared run dir is already how node 0 gives the others its word
(hang.json, save_deadline.json, outcome.json), and the check costs one stat per poll, only on runs that swap.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from swiftslurm.node.stragglers import Straggler
from swiftslurm.rundir.jsonio import peek_json, write_json_atomic
from swiftslurm.rundir.layout import swap_file


def choose(named: Sequence[Straggler], spares_left: int, restarts_left: int) -> tuple[list[Straggler], str | None]:
    """The named stragglers to swap out now (at most one per spare left; never node 0, which leads: without it the
    job is gone), and why the others are only reported (None: every one is swapped)."""
    leader = any(s.node == 0 for s in named)
    others = slowest_first([s for s in named if s.node != 0])
    if others and restarts_left <= 0:
        return [], "the restarts in place of this allocation are spent (`resilience.max_restarts`): reported only"
    if others and spares_left <= 0:
        return [], "no spare left to take its place: reported only (the next requeue brings fresh spares)"
    taken = others[:spares_left]
    notes = ["node 0 leads and is never swapped: reported only"] if leader else []
    if len(others) > len(taken):
        notes.append(f"{spares_left} spare(s) for {len(others)} stragglers: the slowest first, the rest reported")
    return taken, "; ".join(notes) or None


def slowest_first(named: Sequence[Straggler]) -> list[Straggler]:
    """Which stragglers a short supply of spares replaces first: the slowest."""
    return sorted(named, key=lambda s: (-s.ratio, s.node))


def request(attempt_dir: Path, stragglers: Sequence[Straggler], now: float) -> dict[str, Any]:
    """Node 0: ask every node to stop at a checkpoint for a swap (replaced atomically: a reader sees all or
    nothing). ``now`` (node 0's clock) is when the save's time (its deadline) starts on every node."""
    asked = {"at": round(now, 3), "stragglers": [s.as_dict() for s in stragglers]}
    write_json_atomic(swap_file(attempt_dir), asked, durable=False)
    return asked


def requested(attempt_dir: Path) -> dict[str, Any] | None:
    """Node 0's swap request in this attempt, if it made one."""
    asked = peek_json(swap_file(attempt_dir))
    return asked if isinstance(asked, dict) and "at" in asked else None


def hosts(asked: dict[str, Any]) -> tuple[str, ...]:
    """The hosts a swap request takes off the roster."""
    return tuple(str(s["host"]) for s in asked.get("stragglers", ()) if isinstance(s, dict) and s.get("host"))


def line(asked: dict[str, Any]) -> str:
    """For people: who is swapped out, how slow it was, since which step."""
    named = [
        f"node {s.get('node')} ({s.get('host')}), {float(s.get('ratio', 0)):.2f}× the other nodes' median since "
        f"step {s.get('since_step')}"
        for s in asked.get("stragglers", ())
        if isinstance(s, dict)
    ]
    return "a straggler swapped for a spare: " + "; ".join(named)
