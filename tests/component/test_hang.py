"""Issue 15, item 2: the hang window learned from the run's own step times (pure), and the stacks of every rank
dumped before a hung trainer is killed (real processes, real signals; no SLURM, no ms-swift)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

from swiftslurm.engines.hooks import STACKS_ENV
from swiftslurm.node import stacks
from swiftslurm.node.launch import Trainer
from swiftslurm.node.watch import _Watcher
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.beat import PROGRESS_ENV, STEP, ProgressWatch, StepBeat, read_beat
from swiftslurm.rundir.layout import hang_file, progress_file, stack_file, stacks_dir
from swiftslurm.signals import DUMP_SIGNAL, SignalLog, catches
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import REPO, plan_for

RANK = textwrap.dedent(
    """
    import sys, threading
    from swiftslurm.engines.hooks import register_stack_dump
    register_stack_dump()
    def blocked_in_a_collective():
        threading.Event().wait()
    blocked_in_a_collective()
    """
)


def a_rank(tmp_path: Path, attempt: Path, rank: int) -> Trainer:
    """A process that registers its stack dump as a training rank does (hooks.py), then blocks."""
    env = {"PYTHONPATH": str(REPO), STACKS_ENV: str(stacks_dir(attempt)), "RANK": str(rank), "PATH": "/usr/bin"}
    return Trainer([sys.executable, "-c", RANK], env, attempt / f"node{rank}.log", cwd=tmp_path)


def test_every_rank_writes_its_stacks_and_the_empty_files_are_tidied(tmp_path: Path) -> None:
    attempt = tmp_path / "logs" / "7"
    ranks = [a_rank(tmp_path, attempt, rank) for rank in range(2)]
    try:
        _wait_until_registered(ranks)
        stacks.dump_ranks(ranks[1].pid)
        assert stacks.wait_for_stacks(attempt, range(1, 2), timeout_s=60) == []
        assert stacks.missing_stacks(attempt, range(2)) == [0]  # rank 0 was not asked
        dumped = stack_file(stacks_dir(attempt), 1).read_text()
        assert "blocked_in_a_collective" in dumped, dumped
        assert ranks[1].poll() is None  # a dump, not a kill
        stacks.tidy(attempt, range(2))
        assert not stack_file(stacks_dir(attempt), 0).exists() and stack_file(stacks_dir(attempt), 1).exists()
    finally:
        for rank in ranks:
            rank.kill()


def test_a_hung_trainer_is_killed_after_its_window_with_its_stacks(tmp_path: Path) -> None:
    """The watcher's whole path with a real process: steps every 2 s, then none; the clock is given."""
    plan = _plan(tmp_path)
    attempt = tmp_path / "logs" / "7"
    trainer = a_rank(tmp_path, attempt, 0)
    _wait_until_registered([trainer])
    watcher = _watcher(plan, trainer, attempt)
    try:
        for step in range(5, 45, 5):
            at = 1000.0 + step * 0.4  # every 5 steps in 2 s
            StepBeat(progress_file(attempt), lambda at=at: at).step_ended(step, 100)
            watcher.tick(at)
        watcher.tick(1016.0 + 59.0)  # 59 s after step 40: inside the 60 s floor (5 × 2 s = 10 s)
        assert not watcher.hung
        watcher.tick(1016.0 + 61.0)
        assert watcher.hung and trainer.poll() is not None
        assert watcher.hang is not None and watcher.hang["window_s"] == 60.0 and watcher.hang["step"] == 40
        assert json.loads(hang_file(attempt).read_text())["stalled_s"] == 61.0
        assert "blocked_in_a_collective" in stack_file(stacks_dir(attempt), 0).read_text()
    finally:
        trainer.kill()


def test_another_node_dumps_its_ranks_and_ends_its_trainer_once_node_0_finds_the_run_hung(tmp_path: Path) -> None:
    attempt = tmp_path / "logs" / "7"
    trainer = a_rank(tmp_path, attempt, 1)
    _wait_until_registered([trainer])
    plan = replace(_plan(tmp_path), topology=replace(_plan(tmp_path).topology, nodes=2))
    watcher = _watcher(plan, trainer, attempt, node=1)
    try:
        watcher.tick(1000.0)
        assert trainer.poll() is None  # nobody asked
        stacks.ask(attempt, {"step": 26})
        watcher.tick(1000.5)
        assert trainer.poll() is not None and not watcher.hung  # killed; only node 0 classifies the attempt
        assert "blocked_in_a_collective" in stack_file(stacks_dir(attempt), 1).read_text()
    finally:
        trainer.kill()


def _plan(tmp_path: Path) -> JobPlan:
    plan = replace(plan_for(f"run_dir={tmp_path / 'run'}"), tiny_cache=None)
    return replace(plan, resilience=replace(plan.resilience, hang_window_floor_s=60.0))


def _watcher(plan: JobPlan, trainer: Trainer, attempt: Path, node: int = 0) -> _Watcher:
    watch = ProgressWatch(progress_file(attempt), 1000.0)
    nodes = plan.topology.nodes
    where = SlurmEnv(job_id=None, hosts=(), node_id=node, num_nodes=nodes, proc_id=node, num_tasks=nodes)
    return _Watcher(plan, where, trainer, lambda pid: [], SignalLog(), watch, None, attempt)


def _wait_until_registered(ranks: list[Trainer]) -> None:
    """A rank is one once its handler is installed (what the wrapper looks for): until then it is loading."""
    deadline = time.monotonic() + 60
    while not all(catches(r.command_pid, DUMP_SIGNAL) for r in ranks):
        assert time.monotonic() < deadline, "the ranks never registered their stack dump"
        time.sleep(0.1)


TRAINER_END = textwrap.dedent(
    """
    from swiftslurm.engines.hooks import Committer
    committer = Committer("swift")
    committer.train_begun(0)
    for step in range(1, 501):
        committer.step_ended(step, 500, ())
    committer.finish()
    """
)


def test_a_trainer_that_ends_leaves_its_last_beat_and_is_not_kept_alive_by_the_writer(tmp_path: Path) -> None:
    """The plugins' heartbeat is written by a daemon thread (rundir/beat.py): a real process that ends its
    training exits at once, with the last step's beat on disk (the train's end flushes it)."""
    path = tmp_path / "progress.json"
    env = {"PYTHONPATH": str(REPO), PROGRESS_ENV: str(path), "PATH": "/usr/bin"}
    done = subprocess.run([sys.executable, "-c", TRAINER_END], env=env, cwd=tmp_path, timeout=120, check=False)
    assert done.returncode == 0
    beat = read_beat(path)
    assert beat is not None and (beat.step, beat.max_steps, beat.phase) == (500, 500, STEP)
