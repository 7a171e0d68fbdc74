"""What follows an attempt, the same on every node: node 0 decides (conclude.py) and publishes its word in
logs/<attempt>/outcome.json; the other nodes, once their trainer has ended, wait for it, as they wait for
the resume point (resume.py): while node 0's heartbeat is fresh, taking only a file with their own job
run's nonce. "restart" names the next attempt, which every node then starts inside the same allocation;
"end" (done, requeue, stop) lets them exit: node 0 alone requeues or stops the run."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from swiftslurm.node.heartbeat import leader_silence
from swiftslurm.node.watch import wait_pause
from swiftslurm.rundir.jsonio import peek_json, write_json_atomic
from swiftslurm.rundir.layout import LEADER_BEAT, OUTCOME

END = "end"


@dataclass(frozen=True)
class Outcome:
    action: str  # "restart" or END
    next_attempt: str | None = None  # with "restart": the id every node gives the next attempt


def publish(attempt_dir: Path, outcome: Outcome, nonce: str | None) -> None:
    attempt_dir.mkdir(parents=True, exist_ok=True)
    record = {"action": outcome.action, "next_attempt": outcome.next_attempt, "nonce": nonce}
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
    return Outcome(str(record["action"]), record.get("next_attempt"))
