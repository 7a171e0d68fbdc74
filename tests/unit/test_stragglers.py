"""Issue 30, part 2: a node that stays slower than the others is named (pure judgement, the pace each node's
local rank 0 publishes, and the records that carry the report to `status` and to the next requeue's exclusions)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm.engines import forward_clock
from swiftslurm.errors import ConfigError
from swiftslurm.node import decide
from swiftslurm.node.stragglers import StragglerLimits, StragglerWatch, peer_median
from swiftslurm.node.watch import STRAGGLER_READ_S, _Watcher
from swiftslurm.ops.runs import newest_stragglers
from swiftslurm.ops.status import straggler_line
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.layout import node_log, pace_file, progress_file, stragglers_file
from swiftslurm.rundir.pace import (
    PUBLISH_S,
    RECENT_STEPS,
    WARMUP_STEPS,
    Pace,
    PaceWriter,
    local_pace_dir,
    read_pace,
    read_paces,
    slowest,
)
from swiftslurm.rundir.records import AttemptRecord
from swiftslurm.signals import SignalLog
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

LIMITS = StragglerLimits(ratio=1.2, sustain_s=60.0)
HOSTS = ("n0", "n1", "n2", "n3")


def paces(step: int, forward: dict[int, float]) -> dict[int, Pace]:
    return {node: Pace(node, seconds, RECENT_STEPS, step, 0.0) for node, seconds in forward.items()}


def run(watch: StragglerWatch, rounds: list[dict[int, float]], every_s: float = 10.0, start_step: int = 1) -> list[str]:
    """Feed one read of the paces every ``every_s`` seconds, each of a newer step; the lines logged."""
    lines: list[str] = []
    for i, forward in enumerate(rounds):
        lines += watch.observe(paces(start_step + i, forward), now=i * every_s)
    return lines


def test_peer_median_leaves_the_node_itself_out() -> None:
    two = paces(1, {0: 1.0, 1: 1.5})
    assert peer_median(1, two) == 1.0  # with all nodes the median would be 1.25: 1.5× would read as 1.2×
    assert peer_median(0, paces(1, {0: 1.0})) is None


def test_a_node_slow_for_the_whole_window_is_named_with_its_ratio_and_since() -> None:
    watch = StragglerWatch(LIMITS, HOSTS)
    lines = run(watch, [{0: 1.0, 1: 1.5}] * 8)  # 0 s .. 70 s
    assert lines == [
        "node 1 (n1) is a straggler: its training forwards take 1.50× the other nodes' median, since step 1 "
        "(00:00:00 UTC)"
    ]
    (named,) = watch.stragglers()
    assert (named.node, named.host, named.since, named.since_step, named.step) == (1, "n1", 0.0, 1, 8)
    assert named.as_dict()["ratio"] == 1.5


def test_slow_for_less_than_the_window_is_not_named() -> None:
    watch = StragglerWatch(LIMITS, HOSTS)
    assert run(watch, [{0: 1.0, 1: 1.5}] * 6 + [{0: 1.0, 1: 1.0}] * 10) == []  # 50 s slow, then at pace
    assert watch.stragglers() == []


def test_one_slow_reading_never_counts() -> None:
    """A single slow step does not move a node's median; even a whole slow reading (a data loader stall that
    lasted several steps) starts a window that the next reading at pace ends."""
    rounds = [{0: 1.0, 1: 1.0}] * 3 + [{0: 1.0, 1: 3.0}] + [{0: 1.0, 1: 1.0}] * 20
    watch = StragglerWatch(LIMITS, HOSTS)
    assert run(watch, rounds) == []
    assert watch.slow == {}


def test_saves_and_evals_hold_no_new_evidence() -> None:
    """During a save or an evaluation no node trains: the paces stay at their last step, and however long the
    pause, a node at pace is never judged slow, and a node not yet named is not named for the pause's time."""
    watch = StragglerWatch(LIMITS, HOSTS)
    watch.observe(paces(1, {0: 1.0, 1: 1.0}), now=0.0)
    for now in range(10, 600, 10):  # a 10-minute save: the same step's paces read again and again
        assert watch.observe(paces(1, {0: 1.0, 1: 1.0}), now=float(now)) == []
    assert watch.stragglers() == [] and watch.slow == {}


def test_a_pause_between_two_slow_readings_of_a_slow_node_counts_as_slow() -> None:
    """Slow before a save and slow after it: the node was slow throughout (nothing said otherwise)."""
    watch = StragglerWatch(LIMITS, HOSTS)
    watch.observe(paces(1, {0: 1.0, 1: 1.5}), now=0.0)
    assert watch.observe(paces(1, {0: 1.0, 1: 1.5}), now=300.0) == []  # no new step: not judged
    assert watch.observe(paces(2, {0: 1.0, 1: 1.5}), now=310.0) != []


def test_a_named_node_back_at_pace_for_the_window_is_no_longer_named() -> None:
    watch = StragglerWatch(LIMITS, HOSTS)
    run(watch, [{0: 1.0, 1: 1.5}] * 8)
    assert watch.observe(paces(100, {0: 1.0, 1: 1.05}), now=1000.0) == []  # at pace since 1000 s
    lines = watch.observe(paces(101, {0: 1.0, 1: 1.05}), now=1060.0)
    assert lines == ["node 1 (n1) is at pace again (1.05× the others) at step 101"]
    assert watch.stragglers() == []


def test_one_reading_at_pace_does_not_clear_a_named_node() -> None:
    """A noisy reading (a neighbour's commit on the shared cores) neither names a node nor clears one."""
    watch = StragglerWatch(LIMITS, HOSTS)
    run(watch, [{0: 1.0, 1: 1.5}] * 8)
    rounds = [{0: 1.0, 1: 0.9}] + [{0: 1.0, 1: 1.6}] * 10
    assert run(watch, rounds, start_step=100) == []
    (named,) = watch.stragglers()
    assert (named.ratio, named.since_step, named.step) == (1.6, 1, 110)


def test_only_the_slow_node_is_named_never_the_fast_ones() -> None:
    watch = StragglerWatch(LIMITS, HOSTS)
    run(watch, [{0: 1.0, 1: 1.02, 2: 1.6, 3: 0.97}] * 20)
    assert [s.node for s in watch.stragglers()] == [2]


def test_two_slow_nodes_of_four_are_both_named() -> None:
    watch = StragglerWatch(LIMITS, HOSTS)
    lines = run(watch, [{0: 1.0, 1: 1.5, 2: 1.0, 3: 1.8}] * 8)
    assert [s.node for s in watch.stragglers()] == [1, 3]
    assert len(lines) == 2


def test_named_once_not_at_every_reading() -> None:
    watch = StragglerWatch(LIMITS, HOSTS)
    assert len(run(watch, [{0: 1.0, 1: 1.5}] * 50)) == 1
    assert watch.stragglers()[0].ratio == 1.5


def test_below_the_ratio_is_never_named() -> None:
    watch = StragglerWatch(LIMITS, HOSTS)
    assert run(watch, [{0: 1.0, 1: 1.19}] * 50) == []


def test_a_node_with_no_new_pace_is_judged_by_nothing_older() -> None:
    """A node whose local rank 0 has published nothing new keeps its state; the others go on being judged."""
    watch = StragglerWatch(LIMITS, HOSTS)
    watch.observe(paces(1, {0: 1.0, 1: 1.0, 2: 1.6}), now=0.0)
    for i, now in enumerate(range(10, 100, 10)):
        fresh = paces(2 + i, {0: 1.0, 1: 1.0}) | paces(1, {2: 1.6})
        watch.observe(fresh, now=float(now))
    assert watch.stragglers() == []  # node 2's one reading at 0 s is all there is: 1.6× for 0 s


def test_one_node_alone_is_never_a_straggler() -> None:
    watch = StragglerWatch(LIMITS, HOSTS)
    assert run(watch, [{0: 5.0}] * 20) == []


# ---------------------------------------------------------------- the pace a node publishes


def test_the_pace_is_the_median_of_recent_steps_published_at_most_every_few_seconds(tmp_path: Path) -> None:
    clock = itertools.count(0.0, 1.0)
    writer = PaceWriter(tmp_path / "pace" / "node1.json", node=1, clock=lambda: float(next(clock)))
    for step in range(1, WARMUP_STEPS + RECENT_STEPS):  # the warm-up, then one step short of a full window
        writer.step_ended(step, 5.0 if step <= WARMUP_STEPS else 0.2)
    assert not (tmp_path / "pace").exists()  # nothing before a full window after the warm-up
    writer.step_ended(WARMUP_STEPS + RECENT_STEPS, 0.2)  # t=0: published
    assert read_pace(tmp_path / "pace" / "node1.json") == Pace(1, 0.2, RECENT_STEPS, WARMUP_STEPS + RECENT_STEPS, 0.0)
    for step in range(WARMUP_STEPS + RECENT_STEPS + 1, 60):
        writer.step_ended(step, 9.0 if step == 40 else 0.2)  # one slow step
    pace = read_pace(tmp_path / "pace" / "node1.json")
    assert pace is not None and pace.forward_s == 0.2 and pace.steps == RECENT_STEPS
    assert pace.t % PUBLISH_S == 0 and pace.step == WARMUP_STEPS + RECENT_STEPS + int(pace.t)  # every PUBLISH_S
    assert read_paces(tmp_path / "pace") == {1: pace}


def test_only_a_nodes_local_rank_zero_publishes_every_rank_times(tmp_path: Path) -> None:
    env = {"SWIFTSLURM_PACE": str(tmp_path / "node2.json"), "SWIFTSLURM_LOCAL_PACE": str(tmp_path), "NODE_RANK": "2"}
    zero, one = PaceWriter.from_environ(env | {"LOCAL_RANK": "0"}), PaceWriter.from_environ(env | {"LOCAL_RANK": "1"})
    assert (zero.path, zero.node, zero.local_rank) == (tmp_path / "node2.json", 2, 0)
    assert (one.path, one.local, one.local_rank, one.active) == (None, tmp_path, 1, True)
    assert not PaceWriter.from_environ({}).active  # not under the wrapper: nothing timed, nothing written


def test_one_slow_gpu_of_a_node_names_its_node(tmp_path: Path) -> None:
    """Every local rank writes its own pace in the node-local folder; local rank 0 publishes the slowest."""
    published, local = tmp_path / "run" / "pace" / "node1.json", tmp_path / "local"
    ranks = [
        PaceWriter(published if r == 0 else None, local, node=1, local_rank=r, clock=lambda: 0.0) for r in range(4)
    ]
    for step in range(1, WARMUP_STEPS + RECENT_STEPS + 1):
        for rank in (3, 1, 2, 0):  # local rank 0 last here: it reads what the others wrote
            ranks[rank].step_ended(step, 0.3 if rank == 2 else 0.2)
    pace = read_pace(published)
    assert pace is not None and (pace.forward_s, pace.rank, pace.step) == (0.3, 2, WARMUP_STEPS + RECENT_STEPS)
    assert sorted(p.name for p in local.iterdir()) == ["rank0.json", "rank1.json", "rank2.json", "rank3.json"]
    assert slowest(Pace(1, 0.2, 3, 7, 0.0), tmp_path / "missing") == Pace(1, 0.2, 3, 7, 0.0)
    assert local_pace_dir("12.r1", 3).name == "swiftslurm-pace-12.r1-node3"


def test_unreadable_paces_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "node0.json").write_text('{"node": 0, "forward_s": 0.1, "steps": 3, "step": 9, "t": 1.0}')
    (tmp_path / "node1.json").write_text('{"node": 1, "forward_s"')  # torn: being replaced
    (tmp_path / "node2.json").write_text('{"node": 2, "forward_s": 0, "steps": 3, "step": 9, "t": 1.0}')
    assert list(read_paces(tmp_path)) == [0]
    assert read_paces(tmp_path / "missing") == {}


# ---------------------------------------------------------------- node 0's wrapper, the records, `status`


def watcher_for(tmp_path: Path, *overrides: str) -> tuple[_Watcher, Path]:
    plan = replace(plan_for(f"run_dir={tmp_path / 'run'}", "resilience.straggler_s=20", *overrides), tiny_cache=None)
    attempt = tmp_path / "run" / "logs" / "7"
    attempt.mkdir(parents=True)
    where = SlurmEnv(job_id="7", hosts=("n0", "n1"), node_id=0, num_nodes=2, proc_id=0, num_tasks=2)
    watch = ProgressWatch(progress_file(attempt), started=1000.0)
    watcher = _Watcher(plan, where, None, lambda _pid: [], SignalLog(), watch, None, attempt)  # type: ignore[arg-type]
    return watcher, attempt


def publish(attempt: Path, step: int, forward: dict[int, float]) -> None:
    for node, seconds in forward.items():
        PaceWriter(pace_file(attempt, node), node=node).write(
            pace_file(attempt, node), Pace(node, seconds, RECENT_STEPS, step, 0.0)
        )


def test_node_zero_names_the_slow_node_in_its_log_and_for_status(tmp_path: Path) -> None:
    watcher, attempt = watcher_for(tmp_path)
    for i in range(6):  # a reading every STRAGGLER_READ_S: 0 .. 25 s
        publish(attempt, 10 + i, {0: 0.1, 1: 0.15})
        watcher.follow_stragglers(1000.0 + i * STRAGGLER_READ_S)
    report = json.loads(stragglers_file(attempt).read_text())
    (named,) = report["stragglers"]
    assert (named["node"], named["host"], named["ratio"], named["since_step"]) == (1, "n1", 1.5, 10)
    assert "exclude" not in named and report["action"] == "report"
    assert "node 1 (n1) is a straggler" in node_log(attempt, 0).read_text()
    assert watcher.straggler_record() == (named,)
    facts = newest_stragglers(tmp_path / "run", [AttemptRecord(attempt="7")])
    assert facts == (named,)
    assert straggler_line(named).startswith("straggler: node 1 (n1), its training forwards 1.50× the other nodes'")


def test_the_paces_are_read_no_more_often_than_they_are_written(tmp_path: Path) -> None:
    watcher, attempt = watcher_for(tmp_path)
    publish(attempt, 1, {0: 0.1, 1: 0.15})
    watcher.follow_stragglers(1000.0)
    publish(attempt, 2, {0: 0.1, 1: 0.15})
    watcher.follow_stragglers(1000.0 + STRAGGLER_READ_S / 2)  # too soon: not read
    assert watcher.stragglers is not None and watcher.stragglers.judged_step == {0: 1, 1: 1}


def test_other_nodes_judge_nothing(tmp_path: Path) -> None:
    watcher, attempt = watcher_for(tmp_path)
    watcher.where = replace(watcher.where, node_id=1)
    publish(attempt, 1, {0: 0.1, 1: 0.15})
    watcher.follow_stragglers(1000.0)
    assert watcher.stragglers is None


def test_with_exclude_the_named_host_is_avoided_at_the_next_requeue(tmp_path: Path) -> None:
    watcher, attempt = watcher_for(tmp_path, "resilience.straggler_action=exclude")
    for i in range(6):
        publish(attempt, 10 + i, {0: 0.1, 1: 0.15})
        watcher.follow_stragglers(1000.0 + i * STRAGGLER_READ_S)
    (named,) = watcher.straggler_record()
    assert named["exclude"] is True
    assert "excluded from the next requeue" in straggler_line(named)
    # conclude.py records it; the next decision's exclusions include its host, as a failed host's
    record = AttemptRecord(attempt="7", reason="preempted", decision="requeue", end=5000.0, stragglers=(named,))
    history = decide.history_of([record])
    assert history is not None and history.failed_hosts == (("n1", 5000.0),)
    assert decide.exclusions(history, decide.Budget(), now=5100.0, spare_nodes=1) == ("n1",)
    reported = replace(record, stragglers=({k: v for k, v in named.items() if k != "exclude"},))
    assert decide.history_of([reported]).failed_hosts == ()  # type: ignore[union-attr]  # report only


def test_a_straggler_and_a_failed_host_are_both_avoided() -> None:
    history = decide.history_after(None, decide.Reason.INFRA, False, "n3", at=10.0, slow_hosts=["n1"])
    assert history.failed_hosts == (("n1", 10.0), ("n3", 10.0))
    # the most recent first, bounded by the spares: the failed host (recorded after the straggler)
    assert decide.exclusions(history, decide.Budget(), now=20.0, spare_nodes=1) == ("n3",)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("resilience.straggler_ratio=1.0", "must be above 1"),
        ("resilience.straggler_s=-1", "resilience.straggler_s"),
        ("resilience.straggler_action=bogus", "is not one of report, exclude, swap"),
    ],
)
def test_straggler_settings_are_checked(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_for(override)


# ---------------------------------------------------------------- the rank's clock


class SlowModule:
    """A stand-in for a model: hooks as torch.nn.Module runs them, a forward that takes ``seconds`` (on a fake
    clock), and ``training`` as model.train()/eval() set it."""

    def __init__(self, clock: list[float], seconds: float) -> None:
        self.clock, self.seconds, self.training = clock, seconds, True
        self.pre: list[Callable[..., None]] = []
        self.post: list[Callable[..., None]] = []

    def parameters(self) -> Iterator[object]:
        return iter(())

    def register_forward_pre_hook(self, hook: Callable[..., None]) -> None:
        self.pre.append(hook)

    def register_forward_hook(self, hook: Callable[..., None]) -> None:
        self.post.append(hook)

    def __call__(self) -> None:
        for hook in self.pre:
            hook(self, ())
        self.clock[0] += self.seconds
        for hook in self.post:
            hook(self, (), None)


def test_the_clock_times_training_forwards_only(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(forward_clock.time, "perf_counter", lambda: now[0])
    model = SlowModule(now, 0.25)
    clock = forward_clock.ForwardClock(model)
    model(), model()  # two micro-batches of step 1
    clock.step_ended(1)
    assert clock.done_steps() == [(1, 0.5)] and clock.done_steps() == []
    model.training = False  # an evaluation
    model()
    clock.step_ended(2)
    assert clock.done_steps() == []


class FakeEvent:
    """A CUDA event as the clock uses it: done once the GPU got there, then how far apart two are (ms)."""

    def __init__(self, at_ms: float) -> None:
        self.at_ms, self.finished = at_ms, False

    def query(self) -> bool:
        return self.finished

    def elapsed_time(self, end: FakeEvent) -> float:
        return end.at_ms - self.at_ms


def test_on_a_gpu_each_forward_counts_in_its_own_step_once_its_kernels_are_done() -> None:
    """The CPU runs ahead of the GPU: step 1's forward is not done at step 1's end. It is read at a later step's
    end, as step 1's (never added to step 2's, which would make step 2 look twice as slow)."""
    clock = forward_clock.ForwardClock(SlowModule([0.0], 0.0))
    clock.cuda = True
    events = iter(FakeEvent(ms) for ms in (0.0, 40.0, 100.0, 140.0))
    clock.mark = lambda: next(events)  # type: ignore[method-assign]
    model = SlowModule([0.0], 0.0)
    clock.begin(model, ()), clock.end(model, (), None)
    clock.step_ended(1)
    assert clock.done_steps() == []  # the kernels still run
    clock.begin(model, ()), clock.end(model, (), None)
    clock.step_ended(2)
    clock.closed[0][1][0][1].finished = True  # step 1's end event is done, step 2's not yet
    assert clock.done_steps() == [(1, 0.04)]
    clock.closed[0][1][0][1].finished = True
    assert clock.done_steps() == [(2, 0.04)]


@pytest.mark.parametrize(
    ("engine", "deepspeed", "fsdp", "says"),
    [
        ("ddp", None, None, None),
        ("deepspeed", "zero2", None, None),
        ("deepspeed", "zero3", None, "ZeRO-3 gathers parameters"),
        ("deepspeed", "zero3_offload", None, "ZeRO-3 gathers parameters"),
        ("fsdp", None, "fsdp2", "FSDP gathers parameters"),
        ("megatron", None, None, "the Megatron plugin times no forward"),
    ],
)
def test_the_dry_run_says_where_slow_nodes_go_undetected(
    engine: str, deepspeed: str | None, fsdp: str | None, says: str | None
) -> None:
    line = forward_clock.planned_coverage(engine, deepspeed, fsdp)
    assert (line is None) if says is None else (line is not None and says in line and "not detected" in line)
