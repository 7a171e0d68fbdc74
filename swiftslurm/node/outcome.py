"""What follows an attempt, the same on every node: node 0 decides (conclude.py) and publishes its word in
logs/<attempt>/outcome.json; the other nodes, once their trainer has ended, wait for it, as they wait for
the resume point (resume.py): while node 0's heartbeat is fresh, taking only a file with their own job
run's nonce. "restart" names the next attempt, which every node then starts inside the same allocation;
"end" (done, requeue, stop) lets them exit: node 0 alone requeues or stops the run.

With spares (`resilience.spare_nodes`) a restart also names its roster (the training hosts in node-rank order)
and the spares left: a node on the roster trains in the next attempt, a spare stands by for it (`wait_as_spare`),
any other node (a lost one whose wrapper lives on) exits. A spare beats while it stands by (heartbeat.py): node 0
calls in only a spare whose beat is fresh."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from swiftslurm.node.heartbeat import beat_as_spare, leader_silence
from swiftslurm.node.watch import wait_pause
from swiftslurm.rundir.beat import BEAT_S
from swiftslurm.rundir.jsonio import peek_json, write_json_atomic
from swiftslurm.rundir.layout import LEADER_BEAT, OUTCOME, spare_beat_file

END = "end"


@dataclass(frozen=True)
class Outcome:
    action: str  # "restart" or END
    next_attempt: str | None = None  # with "restart": the id every node gives the next attempt
    roster: tuple[str, ...] = ()  # with "restart" onto spares: the next attempt's training hosts; (): the same
    spares: tuple[str, ...] = ()  # with a roster: the hosts that stand by for the next attempt


def publish(attempt_dir: Path, outcome: Outcome, nonce: str | None) -> None:
    attempt_dir.mkdir(parents=True, exist_ok=True)
    record: dict[str, object] = {"action": outcome.action, "next_attempt": outcome.next_attempt, "nonce": nonce}
    if outcome.roster:
        record |= {"roster": list(outcome.roster), "spares": list(outcome.spares)}
    write_json_atomic(attempt_dir / OUTCOME, record)


def wait_for(attempt_dir: Path, nonce: str | None) -> Outcome:
    """Node 0's word on this attempt. Once node 0's heartbeat says it is gone, END: this node exits (with 0,
    like every follower: a failing one would make srun kill node 0) and the next attempt, whoever starts
    it, resumes from the newest commit."""
    path, waiting_since = attempt_dir / OUTCOME, time.time()
    while (found := _ours(path, nonce)) is None:
        if (silence := leader_silence(attempt_dir / LEADER_BEAT, time.time(), waiting_since)) is not None:
            print(f"[swiftslurm] {silence}; it has not published {path}: this node ends its attempt", flush=True)
            return Outcome(END)
        time.sleep(wait_pause(time.time() - waiting_since))
    return found


def _ours(path: Path, nonce: str | None) -> Outcome | None:
    record = peek_json(path)
    if record is None:  # not there yet (or being replaced)
        return None
    if record.get("nonce") != nonce:  # an earlier job with the same id left it
        return None
    roster, spares = record.get("roster") or (), record.get("spares") or ()
    return Outcome(str(record["action"]), record.get("next_attempt"), tuple(roster), tuple(spares))


SPARE_POLL_S = 2.0  # a spare looks for the attempt's outcome this often: one small read, for hours on end


def wait_as_spare(attempt_dir: Path, nonce: str | None, stopped: Callable[[], bool], host: str) -> Outcome:
    """A spare's wait through a whole attempt it does not train in: node 0's word on it, or END once a stop
    signal came (SLURM's signals reach every task, spares too) or node 0 has gone silent (its heartbeat,
    written through the attempt while the run has spares: attempt.py). Meanwhile it beats as ``host`` (the
    name node 0 knows it by) about every BEAT_S, from this loop: a wrapper stuck elsewhere beats no more."""
    path, waiting_since, beat_at = attempt_dir / OUTCOME, time.time(), 0.0
    while (found := _ours(path, nonce)) is None:
        if stopped():
            return Outcome(END)
        if (silence := leader_silence(attempt_dir / LEADER_BEAT, time.time(), waiting_since)) is not None:
            print(f"[swiftslurm] {silence}; it has not published {path}: this spare ends", flush=True)
            return Outcome(END)
        if time.time() - beat_at >= BEAT_S:
            beat_at = time.time()
            beat_as_spare(spare_beat_file(attempt_dir, host))
        time.sleep(SPARE_POLL_S)
    return found
