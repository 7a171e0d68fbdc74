"""`resilience.straggler_action=swap` (issue 30 part 2, docs/resilience.md "Stragglers"): node 0 names a straggler
and, with a spare left, asks every node to stop at a checkpoint (swap.json); each wrapper then stops its trainer as
a stop signal does; node 0 concludes STRAGGLER and restarts in place with the spare at the straggler's node rank.
The trainer and the clock are faked at their seams; the decision is pure."""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import MANIFEST, checkpoint_dir, commit
from swiftslurm.engines.hooks import STOP_FILE_ENV, publish_stop_step
from swiftslurm.errors import ConfigError
from swiftslurm.node import decide, swap
from swiftslurm.node.stragglers import Straggler
from swiftslurm.node.watch import STOP_SAVED, STRAGGLER_READ_S, _Watcher
from swiftslurm.ops.runs import spares_left
from swiftslurm.ops.status import spares_line, straggler_line
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.jsonio import write_json_atomic
from swiftslurm.rundir.layout import node_log, output_dir, pace_file, stop_step_file, swap_file
from swiftslurm.rundir.pace import RECENT_STEPS, Pace, PaceWriter
from swiftslurm.rundir.records import AttemptRecord
from swiftslurm.signals import SAVE_SIGNAL, SignalLog
from swiftslurm.slurm_env import SlurmEnv
from swiftslurm.submit.report import spares_line as plan_spares_line
from tests.conftest import plan_for

HOSTS = ("n0", "n1")
SWAP = (
    "+cluster=local-slurm",
    "resilience.straggler_action=swap",
    "resilience.spare_nodes=1",
    "resilience.straggler_s=20",
)


def straggler(node: int, ratio: float = 1.5) -> Straggler:
    return Straggler(node, f"n{node}", ratio, since=100.0, since_step=10, step=40)


# ---------------------------------------------------------------- which stragglers are swapped (pure)


def test_a_named_node_is_swapped_while_a_spare_and_a_restart_are_left() -> None:
    assert swap.choose([straggler(1)], spares_left=1, restarts_left=1) == ([straggler(1)], None)


@pytest.mark.parametrize(
    ("spares", "restarts", "why"),
    [(0, 5, "no spare left to take its place: reported only"), (1, 0, "restarts in place of this allocation")],
)
def test_without_a_spare_or_a_restart_left_a_straggler_is_only_reported(spares: int, restarts: int, why: str) -> None:
    taken, why_not = swap.choose([straggler(1)], spares, restarts)
    assert taken == [] and why_not is not None and why in why_not


def test_node_zero_leads_and_is_never_swapped() -> None:
    taken, why_not = swap.choose([straggler(0)], spares_left=1, restarts_left=1)
    assert taken == [] and why_not == "node 0 leads and is never swapped: reported only"


def test_fewer_spares_than_stragglers_swap_the_slowest() -> None:
    taken, why_not = swap.choose([straggler(1, 1.3), straggler(2, 1.9)], spares_left=1, restarts_left=3)
    assert taken == [straggler(2, 1.9)] and why_not is not None and "1 spare(s) for 2 stragglers" in why_not


def test_the_request_is_read_back_as_written(tmp_path: Path) -> None:
    assert swap.requested(tmp_path) is None
    asked = swap.request(tmp_path, [straggler(1)], now=1234.5)
    assert swap.requested(tmp_path) == asked and swap.hosts(asked) == ("n1",)
    assert (
        swap.line(asked) == "a straggler swapped for a spare: node 1 (n1), 1.50× the other nodes' median since step 10"
    )


# ---------------------------------------------------------------- the wrappers


class FakeTrainer:
    """The running trainer as the watcher sees it: it runs until killed; the stop signals forwarded to it."""

    pid = 4242
    command_exit: int | None = None
    tree_exit_s = 60.0
    leftovers: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.killed = False
        self.forwarded: list[int] = []

    def poll(self) -> int | None:
        return -signal.SIGKILL if self.killed else None

    def kill(self) -> int:
        self.killed = True
        return -signal.SIGKILL

    def forward(self, sig: int, recipients: Callable[[int], list[int]]) -> list[int]:
        self.forwarded.append(sig)
        return []


def watcher_for(tmp_path: Path, node: int, *overrides: str, room: tuple[int, int] = (1, 5)) -> _Watcher:
    plan = replace(plan_for(f"run_dir={tmp_path}", *SWAP, *overrides), tiny_cache=None)
    where = SlurmEnv(job_id="7", hosts=HOSTS, node_id=node, num_nodes=2, proc_id=node, num_tasks=2)
    watch = ProgressWatch(tmp_path / "progress.json", started=1000.0)
    trainer = FakeTrainer()
    watcher = _Watcher(plan, where, trainer, lambda _pid: [], SignalLog(), watch, None, tmp_path)  # type: ignore[arg-type]
    watcher.spares_left, watcher.restarts_left = room
    return watcher


def name_node_1(watcher: _Watcher, attempt: Path) -> None:
    """Node 1 twice as slow as node 0 for longer than the window (20 s), read every STRAGGLER_READ_S."""
    for i in range(6):
        for node, seconds in {0: 0.1, 1: 0.2}.items():
            PaceWriter(pace_file(attempt, node), node=node).write(
                pace_file(attempt, node), Pace(node, seconds, RECENT_STEPS, 10 + i, 0.0)
            )
        watcher.tick(1000.0 + i * STRAGGLER_READ_S)


def stop_checkpoint(run_dir: Path, step: int) -> None:
    """What global rank 0 does: publish the agreed stop step, then commit that checkpoint."""
    publish_stop_step(step, {STOP_FILE_ENV: str(stop_step_file(run_dir))})
    folder = checkpoint_dir(output_dir(run_dir), step)
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    write_json_atomic(folder / MANIFEST, commit(folder, world_size=2, swift_version="test"))


def test_node_zero_asks_every_node_to_stop_once_it_names_a_straggler_and_stops_its_own(tmp_path: Path) -> None:
    watcher = watcher_for(tmp_path, 0)
    name_node_1(watcher, tmp_path)
    asked = swap.requested(tmp_path)
    assert asked is not None and swap.hosts(asked) == ("n1",) and watcher.swap == asked
    trainer: FakeTrainer = watcher.trainer  # type: ignore[assignment]
    assert trainer.forwarded == [SAVE_SIGNAL] and not trainer.killed  # saving, not killed
    assert "a straggler swapped for a spare: node 1 (n1)" in node_log(tmp_path, 0).read_text()
    (named,) = watcher.straggler_record()
    assert named["swap"] is True and straggler_line(named).endswith("; swapped for a spare")
    stop_checkpoint(tmp_path, 16)
    watcher.tick(1100.0)
    assert trainer.killed and watcher.ended_by == STOP_SAVED and watcher.stop_record()["step"] == 16  # type: ignore[index]


def test_another_node_stops_on_node_zeros_request(tmp_path: Path) -> None:
    watcher = watcher_for(tmp_path, 1)
    trainer: FakeTrainer = watcher.trainer  # type: ignore[assignment]
    watcher.tick(1000.0)
    assert trainer.forwarded == [] and not watcher.stopping
    swap.request(tmp_path, [straggler(1)], now=1000.5)
    watcher.tick(1001.0)
    assert trainer.forwarded == [SAVE_SIGNAL] and watcher.stopping
    # the save has the lead a stop signal's has, from node 0's request: every node kills at the same moment
    assert watcher.deadline is not None and watcher.deadline.at == 1000.5 + watcher.plan.resilience.signal_lead_s
    stop_checkpoint(tmp_path, 16)
    watcher.tick(1002.0)
    assert trainer.killed and watcher.ended_by == STOP_SAVED


def test_without_a_spare_left_the_straggler_is_reported_and_nothing_stops(tmp_path: Path) -> None:
    watcher = watcher_for(tmp_path, 0, room=(0, 5))
    name_node_1(watcher, tmp_path)
    trainer: FakeTrainer = watcher.trainer  # type: ignore[assignment]
    assert swap.requested(tmp_path) is None and not swap_file(tmp_path).exists() and trainer.forwarded == []
    (named,) = watcher.straggler_record()
    assert "swap" not in named and "no spare left" in straggler_line(named)
    assert node_log(tmp_path, 0).read_text().count("is not swapped: no spare left") == 1  # said once


def test_runs_that_do_not_swap_never_look_for_the_request(tmp_path: Path) -> None:
    watcher = watcher_for(tmp_path, 1, "resilience.straggler_action=report")
    swap.request(tmp_path, [straggler(1)], now=1000.5)
    watcher.tick(1001.0)
    assert not watcher.stopping


# ---------------------------------------------------------------- node 0's decision


def facts(straggler_line: str | None, signal_reason: decide.Reason | None = None) -> decide.AttemptFacts:
    return decide.AttemptFacts(
        exit_code=-9,
        signal_reason=signal_reason,
        steps_done=16,
        reached_last_step=False,
        hung=False,
        log_tail="",
        elapsed_s=100.0,
        failed_host=None,
        straggler=straggler_line,
    )


def test_an_attempt_stopped_for_a_swap_is_a_straggler_not_a_kill() -> None:
    reason, why = decide.classify(facts("a straggler swapped for a spare: node 1 (n1)"))
    assert reason is decide.Reason.STRAGGLER and why.startswith("a straggler swapped for a spare: node 1 (n1); stopped")
    # a preemption meanwhile wins: SLURM wants the nodes back
    assert decide.classify(facts("x", decide.Reason.PREEMPTED))[0] is decide.Reason.PREEMPTED


def straggler_decision(spares: tuple[str, ...], restarts: int = 0) -> decide.Decision:
    history = decide.history_after(None, decide.Reason.STRAGGLER, True, None, at=10.0, slow_hosts=["n1"])
    allocation = decide.Allocation(True, restarts, ("n0", "n1"), spares, lost=("n1",))
    return decide.decide(decide.Reason.STRAGGLER, "slow", history, decide.Budget(), 20.0, 1, allocation)


def test_node_zero_restarts_in_place_with_the_spare_at_the_stragglers_node_rank() -> None:
    decision = straggler_decision(spares=("n2",))
    assert (decision.action, decision.reason) == (decide.Action.RESTART, decide.Reason.STRAGGLER)
    assert decision.roster == ("n0", "n2") and decision.spares == ()  # n1 neither trains nor stands by
    assert "restarted in place on a spare (n1 -> n2; 0 spare(s) left; 1 of 5)" in decision.why


def test_with_no_spare_up_or_no_restart_left_the_run_is_requeued_without_the_straggler() -> None:
    for decision in (straggler_decision(spares=()), straggler_decision(spares=("n2",), restarts=5)):
        assert (decision.action, decision.exclude_hosts, decision.delay_s) == (decide.Action.REQUEUE, ("n1",), 0)


def test_a_swapped_host_is_avoided_by_a_later_requeue_and_status_says_why_it_left() -> None:
    swapped = {"node": 1, "host": "n1", "ratio": 1.5, "swap": True}
    record = AttemptRecord(
        "7", "7", hosts=HOSTS, reason="straggler", decision="restart", end=50.0, spares=("n2",),
        swaps=(("n1", "n2"),), swap_why="straggler", stragglers=(swapped,),
    )  # fmt: skip
    history = decide.history_of([record])
    assert history is not None and history.failed_hosts == (("n1", 50.0),)
    assert AttemptRecord.from_dict(record.as_dict()) == record
    assert spares_left([record]) == 0


def test_status_names_each_swap_with_why() -> None:
    from swiftslurm.ops.runs import RunFacts

    facts = RunFacts(
        "/r", "r", "running", "", "7", None, 2, (), 16, 100, None, None, None, None,
        spares_left=0, swaps=(("n1", "n2", "straggler"),),
    )  # fmt: skip
    assert spares_line(facts) == "spares: 0 standing by; nodes replaced by a spare: n1 -> n2 (straggler)"


# ---------------------------------------------------------------- the plan


def test_swap_without_a_spare_is_refused_with_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"no spare to swap .* HINT: add resilience.spare_nodes=1"):
        plan_for("resilience.straggler_action=swap")


def test_swap_where_stragglers_are_not_timed_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"stragglers are not detected in this run .*HINT"):
        plan_for(*SWAP, "strategy=zero3")


def test_the_dry_run_says_a_spare_also_replaces_a_straggler() -> None:
    line = plan_spares_line(plan_for(*SWAP))
    assert line is not None and "or one is a straggler (1.2× slower for 20 s: stopped at a checkpoint)" in line
