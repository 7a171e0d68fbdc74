"""ms-swift plugin for tests/cluster/test_last_step.py: ends an attempt right after it committed its run's
last step, the moment issue 18 was about. Global rank 0 acts in `on_train_end`, once the manifest of
`checkpoint-<max_steps>` exists (the commit runs in a background thread; waiting for its file, not for time,
is what makes the window certain), and only once per run: in the first attempt that reaches its last step (an
attempt preempted earlier by another job does not use it up). A marker file in the run dir says it acted.

- `last_step_kill`: SIGKILL this node's wrapper (the step's task) first, then everything it
  started (swift, torchrun, this rank). The wrapper goes first so it cannot see its trainer die and write a
  record: the attempt ends as a lost node or an OOM kill of the whole step ends it, with nothing written.
- `last_step_usr2`: `scancel --signal=USR2` the job (what SLURM sends ahead of a preemption), then stay busy,
  as a slow end of training would (e.g. the last commit's checksums of a large model), until the wrapper
  kills the trainer once the signal's lead time has passed.

Before acting it writes MARKER into the run dir: what it did, at which step, in which attempt.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

from swiftslurm.ckpt.checkpoint import MANIFEST
from swiftslurm.signals import descendants, send

MARKER = "last_step_plugin.json"  # test_last_step.py reads it (named there too: importing this imports ms-swift)
COMMIT_WAIT_S = 120.0


def attempt_id() -> str:
    """As swiftslurm names attempts: '<job id>', then '<job id>.r<N>' after the N-th requeue."""
    restarts = os.environ.get("SLURM_RESTART_COUNT", "0")
    return os.environ["SLURM_JOB_ID"] + (f".r{restarts}" if restarts != "0" else "")


def wait_for_commit(checkpoint: Path) -> None:
    deadline = time.monotonic() + COMMIT_WAIT_S
    while not (checkpoint / MANIFEST).is_file():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{checkpoint} was not committed within {COMMIT_WAIT_S:.0f} s")
        time.sleep(0.05)


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])


def node_wrapper() -> int:
    """This node's wrapper: the ancestor that slurmstepd started as the step's task (`python -m swiftslurm.node`,
    or submitit's `_submit` running it)."""
    pid = os.getpid()
    while (parent := parent_of(pid)) > 1:
        if Path(f"/proc/{parent}/comm").read_text().strip() == "slurmstepd":
            return pid
        pid = parent
    raise RuntimeError("no slurmstepd among this rank's ancestors: not running as a SLURM step")


class AfterLastCommit(TrainerCallback):
    """Acts once per run, on global rank 0, after the commit of the last step."""

    action = ""

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        run_dir = Path(os.environ["SWIFTSLURM_RUN_DIR"])
        if state.is_world_process_zero and state.global_step == state.max_steps and not (run_dir / MARKER).exists():
            checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            wait_for_commit(checkpoint)
            facts = {"action": self.action, "step": state.global_step, "attempt": attempt_id(), "at": time.time()}
            (run_dir / MARKER).write_text(json.dumps(facts))
            print(f"[last_step_plugin] {checkpoint.name} committed: {self.action}", flush=True)
            self.act()
        return control

    def act(self) -> None:
        raise NotImplementedError


class KillAfterLastCommit(AfterLastCommit):
    action = "kill"

    def act(self) -> None:
        wrapper = node_wrapper()
        started = [pid for pid in descendants(wrapper) if pid != os.getpid()]
        os.kill(wrapper, signal.SIGKILL)
        send(started, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class Usr2AfterLastCommit(AfterLastCommit):
    action = "usr2"

    def act(self) -> None:
        subprocess.run(["scancel", "--signal=USR2", os.environ["SLURM_JOB_ID"]], check=True)
        while True:  # a slow end of training: the wrapper kills it once the signal's lead time is over
            time.sleep(1)


callbacks_map["last_step_kill"] = KillAfterLastCommit
callbacks_map["last_step_usr2"] = Usr2AfterLastCommit
