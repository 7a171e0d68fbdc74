"""After a stop signal each node's wrapper ends its trainer on the manifest of the step every rank agreed to save
(published by global rank 0), and kills a trainer still running at the save's deadline: SLURM's kill time less a
margin, as node 0 read it when the signal came and published it for every node. The trainer, SLURM and the
clock are faked at their seams (the watcher's tick takes the time; node 0's end-time reader is injected)."""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import MANIFEST, checkpoint_dir, commit
from swiftslurm.engines.hooks import STOP_FILE_ENV, publish_stop_step
from swiftslurm.node.deadline import LEAD, SLURM_END, SaveDeadline
from swiftslurm.node.watch import POLL_S, STOP_POLL_S, _Watcher
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.jsonio import read_json, write_json_atomic
from swiftslurm.rundir.layout import output_dir, save_deadline_file, stop_step_file
from swiftslurm.signals import SignalLog
from swiftslurm.slurm import JobTimes
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

SIGNALLED = 1_000_000.0  # when the stop signal came (seconds since the epoch, on the node that got it)
LEAD_S = 120  # the plan's cluster.signal_lead_s (the default)
NODE_0 = SlurmEnv(job_id="7", hosts=("a", "b"), node_id=0, num_nodes=2, proc_id=0, num_tasks=2)
NODE_1 = SlurmEnv(job_id="7", hosts=("a", "b"), node_id=1, num_nodes=2, proc_id=1, num_tasks=2)


class FakeTrainer:
    """The running trainer as the watcher sees it: it runs until killed."""

    pid = 4242
    command_exit: int | None = None  # its command runs until killed
    tree_exit_s = 60.0
    leftovers: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.killed = False

    def poll(self) -> int | None:
        return -signal.SIGKILL if self.killed else None

    def kill(self) -> int:
        self.killed = True
        return -signal.SIGKILL

    def forward(self, sig: int, recipients: Callable[[int], list[int]]) -> list[int]:
        return []


def watching(
    run_dir: Path,
    where: SlurmEnv = NODE_0,
    end_times: Callable[[], tuple[JobTimes | None, str | None]] = lambda: (None, None),
) -> _Watcher:
    plan = plan_for(f"run_dir={run_dir}")
    assert plan.resilience.signal_lead_s == LEAD_S
    signals = SignalLog([(int(signal.SIGUSR2), SIGNALLED)])
    watch = ProgressWatch(run_dir / "progress.json", SIGNALLED - 60)
    watcher = _Watcher(plan, where, FakeTrainer(), lambda _pid: [], signals, watch, None, run_dir)  # type: ignore[arg-type]
    watcher.end_times = end_times
    return watcher


def killed(watcher: _Watcher) -> bool:
    return watcher.trainer.poll() is not None


def agreed(run_dir: Path, step: int) -> None:
    """What global rank 0 does once every rank agreed to stop at ``step``."""
    publish_stop_step(step, {STOP_FILE_ENV: str(stop_step_file(run_dir))})


def committed(run_dir: Path, step: int, node_0_behind_s: float = 0.0) -> None:
    """Global rank 0 commits checkpoint-``step`` 2 s after the signal, by a clock ``node_0_behind_s`` behind
    this node's (the manifest's committed_at is node 0's time)."""
    folder = checkpoint_dir(output_dir(run_dir), step)
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    manifest = commit(folder, world_size=2, swift_version="test")
    write_json_atomic(folder / MANIFEST, {**manifest, "committed_at": SIGNALLED + 2 - node_0_behind_s})


# --- the stop checkpoint ---------------------------------------------------------------------------------------


def test_an_earlier_saves_commit_landing_after_the_signal_does_not_end_the_trainer(tmp_path: Path) -> None:
    watcher = watching(tmp_path)
    agreed(tmp_path, 12)
    committed(tmp_path, 10)  # the periodic save of step 10, its background commit done after the signal
    watcher.tick(SIGNALLED + 5)
    assert not killed(watcher)  # step 12 is still being written
    committed(tmp_path, 12)
    watcher.tick(SIGNALLED + 6)
    assert killed(watcher) and watcher.stop_record() == {"step": 12, "deadline": watcher.deadline.as_dict()}  # type: ignore[union-attr]


def test_before_the_ranks_agree_on_a_step_no_commit_ends_the_trainer(tmp_path: Path) -> None:
    watcher = watching(tmp_path)
    committed(tmp_path, 10)
    watcher.tick(SIGNALLED + 1)
    assert not killed(watcher)


def test_a_follower_ends_on_the_stop_checkpoint_whatever_node_0s_clock_says(tmp_path: Path) -> None:
    watcher = watching(tmp_path, NODE_1)
    agreed(tmp_path, 12)
    committed(tmp_path, 12, node_0_behind_s=3600)
    watcher.tick(SIGNALLED + 5)
    assert killed(watcher)


# --- the deadline ----------------------------------------------------------------------------------------------


def ends_in(kill_in_s: float, limit_in_s: float | None = None) -> Callable[[], tuple[JobTimes | None, str | None]]:
    """scontrol's answer: SLURM kills the job ``kill_in_s`` after the signal; its time limit ends ``limit_in_s``
    after it (the same when not preempted)."""
    limit = kill_in_s if limit_in_s is None else limit_in_s
    return lambda: (JobTimes(limit_ends=SIGNALLED + limit, kill_at=SIGNALLED + kill_in_s), None)


def test_a_time_limit_warning_sent_early_leaves_the_save_until_slurms_kill_less_the_margin(tmp_path: Path) -> None:
    watcher = watching(tmp_path, end_times=ends_in(170))  # SLURM sent USR2@120 50 s early
    watcher.tick(SIGNALLED + 130)  # past signal_lead_s: still SLURM's time
    assert not killed(watcher)
    watcher.tick(SIGNALLED + 141)
    assert killed(watcher) and watcher.deadline == SaveDeadline(SIGNALLED + 140, SLURM_END, SIGNALLED + 170, "scontrol")


def test_a_preemption_leaves_the_save_its_grace_time_less_the_margin(tmp_path: Path) -> None:
    watcher = watching(tmp_path, end_times=ends_in(600, limit_in_s=36_000))  # GraceTime=600 moved EndTime
    watcher.tick(SIGNALLED + 300)
    assert not killed(watcher)
    watcher.tick(SIGNALLED + 571)
    assert killed(watcher)


def test_a_grace_time_shorter_than_the_lead_time_ends_the_trainer_before_slurm_does(tmp_path: Path) -> None:
    watcher = watching(tmp_path, end_times=ends_in(40, limit_in_s=36_000))  # GraceTime=40
    watcher.tick(SIGNALLED + 19)
    assert not killed(watcher)
    watcher.tick(SIGNALLED + 21)  # half of the 40 s is node 0's, to record and requeue
    assert killed(watcher)


def test_when_slurm_cannot_say_the_lead_time_is_the_deadline_and_the_record_says_so(tmp_path: Path) -> None:
    watcher = watching(tmp_path, end_times=lambda: (None, "the time limit could not be read after 3 tries: busy"))
    watcher.tick(SIGNALLED + 119)
    assert not killed(watcher)
    watcher.tick(SIGNALLED + 121)
    assert killed(watcher)
    assert watcher.stop_record() == {
        "step": None,
        "deadline": {"at": SIGNALLED + LEAD_S, "basis": LEAD, "kill_at": None, "source": None},
    }


def test_without_scontrol_slurm_job_end_time_still_bounds_the_save(tmp_path: Path) -> None:
    where = SlurmEnv.from_environ(
        {
            "SLURM_JOB_ID": "7",
            "SLURM_PROCID": "0",
            "SLURM_JOB_NODELIST": "a",
            "SLURM_JOB_END_TIME": f"{SIGNALLED + 90:.0f}",
        }
    )
    watcher = watching(tmp_path, where, end_times=lambda: (None, "the time limit could not be read after 3 tries"))
    watcher.tick(SIGNALLED + 61)
    assert killed(watcher) and watcher.deadline == SaveDeadline(
        SIGNALLED + 60, SLURM_END, SIGNALLED + 90, "SLURM_JOB_END_TIME"
    )


def test_slurms_end_time_is_read_again_when_another_signal_comes(tmp_path: Path) -> None:
    answers = [ends_in(36_000)(), ends_in(50, limit_in_s=36_000)()]  # a USR2 by hand, then a preemption
    asked: list[int] = []

    def end_times() -> tuple[JobTimes | None, str | None]:
        asked.append(1)
        return answers[len(asked) - 1]

    watcher = watching(tmp_path, end_times=end_times)
    watcher.tick(SIGNALLED + 5)
    assert watcher.deadline is not None and watcher.deadline.at == SIGNALLED + LEAD_S  # by hand: the lead time
    watcher.signals.received.append((int(signal.SIGUSR2), SIGNALLED + 10))
    watcher.tick(SIGNALLED + 11)
    assert (
        len(asked) == 2 and watcher.deadline.at == SIGNALLED + 30
    )  # SLURM kills at +50: of its 40 s, half are node 0's
    assert not killed(watcher)


def test_node_0_publishes_its_deadline_and_a_follower_keeps_it(tmp_path: Path) -> None:
    leader = watching(tmp_path, end_times=ends_in(600, limit_in_s=36_000))
    leader.tick(SIGNALLED + 1)
    assert read_json(save_deadline_file(tmp_path)) == leader.deadline.as_dict()  # type: ignore[union-attr]
    follower = watching(tmp_path, NODE_1)  # asks no SLURM: its own guess would be signal_lead_s
    follower.tick(SIGNALLED + 300)
    assert not killed(follower)
    follower.tick(SIGNALLED + 571)
    assert killed(follower)


@pytest.mark.parametrize("where", [NODE_0, NODE_1])
def test_only_node_0_asks_slurm(tmp_path: Path, where: SlurmEnv) -> None:
    asked: list[int] = []
    watcher = watching(tmp_path, where, end_times=lambda: (asked.append(1), (None, None))[1])  # type: ignore[func-returns-value]
    watcher.tick(SIGNALLED + 1)
    watcher.tick(SIGNALLED + 2)
    assert len(asked) == (1 if where.node_id == 0 else 0)


# --- how soon the commit is seen -------------------------------------------------------------------------------


def sleeps_until_tick(watcher: _Watcher, on_sleep: Callable[[int], None] = lambda n: None) -> list[float]:
    """The sleeps of one wait_for_tick; ``on_sleep(n)`` runs after the n-th (1-based), as the world moves on."""
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        on_sleep(len(slept))

    watcher.wait_for_tick(sleep)
    return slept


def test_without_a_stop_signal_a_tick_comes_every_poll(tmp_path: Path) -> None:
    watcher = watching(tmp_path)
    watcher.signals = SignalLog()
    assert sleeps_until_tick(watcher) == [POLL_S]


def test_after_a_stop_signal_the_commit_is_seen_within_a_short_look_not_a_whole_poll(tmp_path: Path) -> None:
    watcher = watching(tmp_path, NODE_1)
    agreed(tmp_path, 12)
    slept = sleeps_until_tick(watcher, lambda n: committed(tmp_path, 12) if n == 2 else None)
    assert slept == [STOP_POLL_S, STOP_POLL_S]  # the tick comes right after the look that saw the manifest
    watcher.tick(SIGNALLED + 3)
    assert killed(watcher)


def test_after_a_stop_signal_without_a_commit_the_ticks_keep_their_pace(tmp_path: Path) -> None:
    watcher = watching(tmp_path, NODE_1)
    agreed(tmp_path, 12)
    committed(tmp_path, 10)  # an earlier save's commit is not the one that ends the trainer
    slept = sleeps_until_tick(watcher)
    assert slept == [STOP_POLL_S] * round(POLL_S / STOP_POLL_S) and sum(slept) == pytest.approx(POLL_S)


def test_after_a_stop_signal_a_trainer_that_ended_by_itself_is_seen_within_a_short_look(tmp_path: Path) -> None:
    watcher = watching(tmp_path, NODE_1)

    def ends(n: int) -> None:
        if n == 1:
            watcher.trainer.kill()  # its tree has exited: poll() answers

    assert sleeps_until_tick(watcher, ends) == [STOP_POLL_S]
