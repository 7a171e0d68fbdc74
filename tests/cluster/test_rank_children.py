"""Issue 25 item 13: SLURM's stop signals reach every process of the step, and only the ranks act on them.

`scancel --signal=USR2 JOB` (like `--signal=USR2@N`) signals every process of the job step, the ranks' data loader
workers too. A spawned worker died of USR2 (a forked one of any TERM not from its parent), and the rank's next
batch failed ("DataLoader worker (pid X) is killed by signal") before the stop vote could save. The ranks'
plugin blocks the stop signals in everything a rank starts (signals.children_never_see_stop_signals): the run
must save at the step it was at, requeue and finish, with no worker lost on the way.
(tests/component/test_rank_children.py checks the mechanism without SLURM.)
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import is_committed
from swiftslurm.signals import descendants
from swiftslurm.testing.cluster import (
    attempt_ids,
    attempts,
    cancel_if_active,
    current_step,
    exec_line,
    preempt,
    run_over,
    status,
    submit,
    wait_for_job,
    wait_until,
    workers_of,
)
from tests.cluster.conftest import LONG

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]
WORKERS = 2
STOP_AT = 30
LOST_WORKER = re.compile(r"DataLoader worker \(pid.*(?:killed by signal|exited unexpectedly)")


def masked(pid: int, signum: int, field: str = "SigBlk") -> bool:
    """Whether ``pid`` has ``signum`` in a signal mask of /proc/PID/status (SigBlk: blocked, SigIgn: ignored);
    False once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    mask = next(line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


def never_acts_on(pid: int, signum: int) -> bool:
    """Blocked (what a rank starts), or ignored: multiprocessing's resource tracker, started with the signals
    blocked, unblocks INT and TERM once it ignores them."""
    return masked(pid, signum) or masked(pid, signum, "SigIgn")


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:300]
    except OSError:
        return f"{pid} (gone)"


# spawn: USR2 killed the workers before the fix; fork: they inherit the rank's handler, and must still work blocked.
@pytest.mark.parametrize("context", ["spawn", "fork"])
def test_a_preempted_run_with_data_loader_workers_saves_at_its_step_and_loses_none(
    tmp_path: Path, context: str
) -> None:
    run_dir = tmp_path / "run"
    loader = (f"swift.dataloader_num_workers={WORKERS}", f"swift.dataloader_multiprocessing_context={context}")
    job = submit(run_dir, *LONG, *loader)
    try:
        wait_until(lambda: current_step(run_dir) >= STOP_AT, 300, f"step {STOP_AT}", over=run_over(run_dir, job))
        [attempt] = attempt_ids(run_dir)
        assert f"--dataloader_num_workers {WORKERS}" in (exec_line(run_dir, attempt, 0) or "")

        # Everything each rank started (its data loader workers among them) blocks the stop signals SLURM sends.
        ranks = workers_of(run_dir, attempt)
        started = {rank: descendants(rank) for rank in ranks}
        assert ranks and all(len(children) >= WORKERS for children in started.values()), started
        unblocked = [
            command_of(child)
            for children in started.values()
            for child in children
            if not all(never_acts_on(child, signum) for signum in (signal.SIGUSR2, signal.SIGTERM))
        ]
        assert unblocked == [], (started, unblocked)
        assert not any(masked(rank, signal.SIGUSR2) for rank in ranks)  # the ranks themselves see it

        preempt(job)  # scancel --signal=USR2 JOB: every process of the step
        assert wait_for_job(job, timeout_s=900) == "COMPLETED"
    finally:
        cancel_if_active(job)  # a failed check must not leave the job running

    first = attempts(run_dir)[0]
    assert (first["reason"], first["decision"]) == ("preempted", "requeue"), first
    assert first["committed_step"] == first["last_step"] >= STOP_AT  # saved at the step it was at
    assert is_committed(run_dir / "output" / f"checkpoint-{first['committed_step']}")
    assert status(run_dir)["state"] == "finished"
    for log in sorted((run_dir / "logs" / attempt).glob("node*.log")):
        lost = LOST_WORKER.findall(log.read_text(errors="replace"))
        assert not lost, f"{log.name} of {attempt} lost a data loader worker: {lost}"
