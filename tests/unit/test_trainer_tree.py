"""The trainer has ended only once every process of its tree has: the pure parts, with the processes and /proc
given (tests/component/test_trainer_tree.py runs the real ones, a rank blocked in a FUSE read among them)."""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path
from unittest.mock import ANY

from swiftslurm.node import keeper
from swiftslurm.node.conclude import _leftovers
from swiftslurm.node.launch import kill_until_gone, leftovers_line, parse_reports
from swiftslurm.node.watch import TREE_EXIT_AFTER_STOP_S, _Watcher, nothing_to_train
from swiftslurm.rundir import records
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.signals import SignalLog, describe, living
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for


class Tree:
    """Processes that exit after a number of KILLs each (None: never); ``forks`` start after the first KILL."""

    def __init__(self, lives: dict[int, int | None], forks: dict[int, int | None] | None = None) -> None:
        self.lives, self.forks = dict(lives), dict(forks or {})
        self.kills: list[list[int]] = []
        self.now = 0.0

    def running(self) -> list[int]:
        return sorted(self.lives)

    def kill(self, pids: list[int]) -> None:
        self.kills.append(list(pids))
        for pid in pids:
            left = self.lives[pid]
            if left is not None and left <= 1:
                del self.lives[pid]
            elif left is not None:
                self.lives[pid] = left - 1
        self.lives |= self.forks
        self.forks = {}

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def until_gone(self, within_s: float) -> list[int]:
        return kill_until_gone(self.running, lambda: not self.lives, within_s, self.kill, lambda: self.now, self.sleep)


def test_kill_waits_until_every_process_is_gone_and_kills_what_a_fork_in_flight_started() -> None:
    tree = Tree({10: 1, 11: 3}, forks={12: 1})
    assert tree.until_gone(60.0) == []
    assert tree.kills == [[10, 11], [11, 12], [11]]


def test_kill_names_what_outlives_the_bound_and_stops_waiting() -> None:
    tree = Tree({10: 1, 11: None})  # 11 waits for a file system server that does not answer
    assert tree.until_gone(1.0) == [11]
    assert tree.now >= 1.0 and tree.kills[0] == [10, 11] and all(k == [11] for k in tree.kills[1:])


def test_kill_of_a_tree_already_gone_kills_nothing() -> None:
    tree = Tree({})
    assert tree.until_gone(60.0) == [] and tree.kills == []


def exited(code: int) -> int:
    return code << 8  # a wait status


def test_the_keeper_reports_its_commands_exit_at_once_and_reaps_orphans_until_none_is_left() -> None:
    heard: list[object] = []
    reaped = iter([(31, exited(0)), (30, signal.SIGKILL), (32, exited(1))])  # an orphan, the command, an orphan

    def wait() -> tuple[int, int]:
        pid, status = next(reaped, (0, 0))
        if pid == 0:
            raise ChildProcessError
        heard.append(("reaped", pid))
        return pid, status

    assert keeper.reap_all(30, lambda code: heard.append(("exited", code)), wait) == -signal.SIGKILL
    assert heard == [("reaped", 31), ("reaped", 30), ("exited", -signal.SIGKILL), ("reaped", 32)]


def test_the_keepers_command_line_runs_the_wrappers_own_swiftslurm() -> None:
    argv = keeper.argv(7, ["swift", "sft", "--model", "m"])
    assert argv[1] == "-c" and "swiftslurm.node.keeper" in argv[2]
    assert Path(argv[3], "swiftslurm", "node", "keeper.py").samefile(keeper.__file__)
    assert argv[4:] == ["7", "swift", "sft", "--model", "m"]


def test_the_keepers_words_are_read_and_anything_else_dropped() -> None:
    lines = [b"started 4242", b"exited -9", b"exited", b"said nothing", b"error 2x"]
    assert parse_reports(lines) == {"started": 4242, "exited": -9}


def fake_proc(
    proc: Path,
    pid: int,
    name: str,
    state: str,
    wchan: str = "0",
    cmdline: str = "",
    threads: dict[int, str] | None = None,
) -> None:
    """/proc/PID as Linux shows it: stat, wchan, cmdline, and task/TID/stat and wchan for each thread."""
    folder = proc / str(pid)
    (folder / "task").mkdir(parents=True)
    for tid, letter in {pid: state, **(threads or {})}.items():
        where = folder if tid == pid else folder / "task" / str(tid)
        where.mkdir(parents=True, exist_ok=True)
        (where / "stat").write_text(f"{tid} ({name}) {letter} 1 {pid} {pid} 0 -1 4194560 0 0 0 0 5 3 0 0 20 0 1 0 812")
        (where / "wchan").write_text(wchan if tid == max({pid, *(threads or {})}) else "0")
    (folder / "cmdline").write_text(cmdline)


def test_living_leaves_out_the_gone_and_the_exited(tmp_path: Path) -> None:
    fake_proc(tmp_path, 40, "python", "D")
    fake_proc(tmp_path, 41, "pt_data_worker", "Z")  # exited, waiting to be reaped
    fake_proc(tmp_path, 42, "python", "S", threads={43: "S"})
    fake_proc(tmp_path, 44, "python", "Z", threads={45: "D", 46: "Z"})  # its first thread is done, not all
    fake_proc(tmp_path, 47, "python", "Z", threads={48: "X"})
    assert living([40, 41, 42, 44, 47, 49], proc=tmp_path) == [40, 42, 44]


def test_a_leftover_is_named_with_its_state_where_it_waits_and_its_command(tmp_path: Path) -> None:
    command = "/usr/bin/python\0train.py\0--rank\0" + "x" * 99
    fake_proc(tmp_path, 40, "python (rank)", "D", "request_wait_answer", command)
    fake_proc(tmp_path, 41, "torchrun", "S")
    described = describe(40, proc=tmp_path)
    assert described.startswith("40 python (rank) (in an uninterruptible wait: a device or a file system call")
    assert ", in request_wait_answer): /usr/bin/python train.py --rank xx" in described and described.endswith("...")
    assert describe(41, proc=tmp_path) == "41 torchrun (sleeping)"
    assert describe(43, proc=tmp_path) == "43 (gone)"
    line = leftovers_line((described,), 60.0)
    assert line.startswith("1 of the trainer's processes still there 60 s after they were KILLed") and described in line


def test_a_process_whose_first_thread_exited_is_named_by_the_thread_that_holds_it(tmp_path: Path) -> None:
    """A rank's checkpoint writer thread blocked in a write: the main thread is done ("Z"), the process is not."""
    fake_proc(tmp_path, 50, "python", "Z", "fuse_simple_request", threads={51: "S", 52: "D"})
    assert describe(50, proc=tmp_path) == (
        "50 python (exited but for its thread 52, in an uninterruptible wait: a device or a file system call that "
        "must be answered first, in fuse_simple_request)"
    )


class CommandExited:
    """A trainer whose command exited with 1 while a process it started runs on; kill() KILLs that."""

    pid = 2**22 + 1
    command_exit: int | None = 1
    tree_exit_s = 60.0

    def __init__(self) -> None:
        self.killed = False

    def poll(self) -> int | None:
        return 1 if self.killed else None

    def kill(self) -> int:
        self.killed = True
        return 1

    def forward(self, sig: int, recipients: object) -> list[int]:
        return []


def watcher(tmp_path: Path, signals: SignalLog) -> _Watcher:
    plan = plan_for(f"run_dir={tmp_path}")
    where = SlurmEnv.from_environ({})
    watch = ProgressWatch(tmp_path / "progress.json", time.time())
    return _Watcher(plan, where, CommandExited(), lambda _pid: [], signals, watch, None, tmp_path)  # type: ignore[arg-type]


def test_what_a_command_that_exited_by_itself_left_running_is_killed_and_its_exit_code_stands(tmp_path: Path) -> None:
    running = watcher(tmp_path, SignalLog())
    running.tick(time.time())
    assert running.trainer.poll() == 1 and running.ended_by is None


def test_after_a_stop_signal_what_the_command_left_may_finish_its_save_within_a_shorter_wait(tmp_path: Path) -> None:
    signals = SignalLog()
    signals.record(signal.SIGUSR2)
    running = watcher(tmp_path, signals)
    running.tick(time.time())
    assert running.trainer.poll() is None  # a rank may still commit the stop checkpoint
    assert running.trainer.tree_exit_s == TREE_EXIT_AFTER_STOP_S < 60.0
    running.end("stop_saved")
    assert running.ended_by is None  # the command ended by itself: its exit code says what happened


def test_the_attempt_record_names_every_nodes_leftovers(tmp_path: Path) -> None:
    stuck = ("77 python (in an uninterruptible wait ...)",)
    records.write_node_result(tmp_path, 1, "n2", -9, time.time(), "peer_failed", stuck)
    records.write_node_result(tmp_path, 2, "n3", -9, time.time(), "peer_failed")
    assert records.read_node_result(tmp_path, 1) == records.TrainerEnd(1, "n2", -9, ANY, "peer_failed", stuck)
    observed = replace(nothing_to_train(), leftovers=("12 python (sleeping)",))
    found = _leftovers(tmp_path, ("n1", "n2", "n3"), observed)
    assert found == ("node0: 12 python (sleeping)", f"node1: {stuck[0]}")
    assert _leftovers(tmp_path, ("n1",), nothing_to_train()) == ()
