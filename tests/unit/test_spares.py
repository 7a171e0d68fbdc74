"""Hot spares (`resilience.spare_nodes`, docs/resilience.md "Hot spares"): the roster each node trains on, the
decision that puts a spare in a lost node's place, a spare's way through the attempt state machine, the plan's
refusals, its line and its sbatch flags, and the ledger's and status's view of the spares."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from unittest.mock import ANY

import pytest

from swiftslurm.ckpt.checkpoint import ResumePoint
from swiftslurm.errors import ConfigError, NodeError
from swiftslurm.node import attempt, conclude, decide, outcome
from swiftslurm.node.heartbeat import beat_as_spare
from swiftslurm.node.watch import Observed
from swiftslurm.ops import accounting, ledger
from swiftslurm.ops.runs import gather, spares_left, standing_spares
from swiftslurm.ops.status import spares_line
from swiftslurm.plan import JobPlan
from swiftslurm.render import render_sbatch
from swiftslurm.rundir import records
from swiftslurm.rundir.beat import STALE_S, ProgressWatch, spare_silences
from swiftslurm.rundir.jsonio import write_json_atomic
from swiftslurm.rundir.layout import attempt_dir, spare_beat_file
from swiftslurm.rundir.records import AttemptRecord, read_status
from swiftslurm.signals import SignalLog
from swiftslurm.slurm_env import JOB_RUN_ENV, SlurmEnv, check_allocation, first_roster, on_roster, rank_env
from swiftslurm.submit.report import describe_plan
from swiftslurm.submit.report import spares_line as plan_spares_line
from tests.conftest import plan_for

HOSTS = ("n1", "n2", "n3")
NONCE = "77@1"


def spares_plan(*overrides: str) -> JobPlan:
    return plan_for("+cluster=local-slurm", "resilience.spare_nodes=1", *overrides)


def task(node: int, hosts: tuple[str, ...] = HOSTS, job: str = "77") -> SlurmEnv:
    """What srun gives the task on ``node`` of a job on ``hosts``."""
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NODELIST": ",".join(hosts),
        "SLURM_JOB_NUM_NODES": str(len(hosts)),
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_NTASKS": str(len(hosts)),
        JOB_RUN_ENV: f"{job}@1",  # the batch script's name for this run of the job: the nonce, without scontrol
    }
    return SlurmEnv.from_environ(env)


# ---------------------------------------------------------------- the roster


def test_the_first_roster_is_slurms_first_nodes_and_the_rest_stand_by() -> None:
    plan = spares_plan()
    assert first_roster(task(0), plan) == ("n1", "n2")
    assert on_roster(task(2), ("n1", "n2")) is None  # n3: a spare, no trainer


def test_a_node_on_a_roster_takes_its_rank_and_master_from_the_roster_not_from_slurm() -> None:
    plan = spares_plan()
    spare = on_roster(task(2), ("n1", "n3"))
    assert spare is not None
    assert (spare.node_id, spare.num_nodes, spare.hosts) == (1, 2, ("n1", "n3"))
    env = rank_env(spare, plan)
    assert (env["NODE_RANK"], env["NNODES"], env["MASTER_ADDR"]) == ("1", "2", "n1")
    assert env["MASTER_PORT"] == rank_env(on_roster(task(0), ("n1", "n3")) or task(0), plan)["MASTER_PORT"]


def test_without_spares_the_roster_is_the_allocation_as_it_was() -> None:
    plan = plan_for("+cluster=local-slurm")
    where = task(1, ("n1", "n2"))
    assert on_roster(where, first_roster(where, plan)) is where


def test_the_allocation_must_hold_the_training_nodes_and_the_spares() -> None:
    plan = spares_plan()
    check_allocation(task(0), plan)
    with pytest.raises(NodeError, match=r"made for 2 \+ 1 spare\(s\).*--nodes=3"):
        check_allocation(task(0, ("n1", "n2")), plan)


# ---------------------------------------------------------------- the decision


LOST_NODE = decide.Decision(
    decide.Action.REQUEUE, decide.Reason.INFRA, "infrastructure failure: node 1 lost; requeued in 30s (...)", 30
)


@pytest.mark.parametrize(
    ("roster", "lost", "spares", "expected"),
    [
        (("a", "b", "c"), ("b",), ("s", "t"), ("a", "s", "c")),  # the survivors keep their ranks
        (("a", "b", "c"), ("b", "c"), ("s", "t"), ("a", "s", "t")),
        (("a", "b", "c"), ("b", "c"), ("s",), None),  # not enough spares
        (("a", "b"), ("a",), ("s",), None),  # node 0 leads: without it the job is gone
        (("a", "b"), ("x",), ("s",), ("a", "b")),  # a lost host off the roster changes nothing
    ],
)
def test_next_roster_puts_each_spare_in_a_lost_nodes_place(
    roster: tuple[str, ...], lost: tuple[str, ...], spares: tuple[str, ...], expected: tuple[str, ...] | None
) -> None:
    assert decide.next_roster(roster, lost, spares) == expected


def test_a_lost_node_with_a_spare_left_restarts_in_place_on_it() -> None:
    allocation = decide.Allocation(False, 0, roster=("a", "b"), spares=("s",), lost=("b",))
    decision = decide.swap_in_spares(LOST_NODE, allocation, decide.Budget())
    assert (decision.action, decision.roster, decision.spares) == (decide.Action.RESTART, ("a", "s"), ())
    assert "restarted in place on a spare (b -> s; 0 spare(s) left; 1 of 5)" in decision.why, decision.why


@pytest.mark.parametrize(
    ("allocation", "budget", "says"),
    [
        (decide.Allocation(False, 0, ("a", "b"), (), ("b",)), decide.Budget(), "0 spare(s) left for 1 lost node"),
        (decide.Allocation(False, 2, ("a", "b"), ("s",), ("b",)), decide.Budget(max_restarts=2), "are spent"),
        (decide.Allocation(False, 0, ("a", "b"), ("s",), ("a",)), decide.Budget(), "no restart onto a spare"),
    ],
)
def test_without_a_spare_or_a_restart_left_the_lost_node_requeues_as_before(
    allocation: decide.Allocation, budget: decide.Budget, says: str
) -> None:
    decision = decide.swap_in_spares(LOST_NODE, allocation, budget)
    assert decision.action is decide.Action.REQUEUE and decision.roster == () and says in decision.why


def test_a_stop_signal_or_a_user_error_never_takes_a_spare() -> None:
    allocation = decide.Allocation(False, 0, ("a", "b"), ("s",), ("b",))
    preempted = decide.Decision(decide.Action.REQUEUE, decide.Reason.PREEMPTED, "preempted")
    assert decide.swap_in_spares(preempted, allocation, decide.Budget()) == preempted


def test_decide_takes_the_spare_path_only_when_a_node_is_lost() -> None:
    history = decide.History(attempts=1, timeouts=0, consecutive_failures=1)
    swapped = decide.decide(
        decide.Reason.INFRA,
        "b lost",
        history,
        decide.Budget(),
        0.0,
        0,
        decide.Allocation(False, 0, ("a", "b"), ("s",), ("b",)),
    )
    alive = decide.decide(
        decide.Reason.INFRA, "crash", history, decide.Budget(), 0.0, 0, decide.Allocation(True, 0, ("a", "b"), ("s",))
    )
    assert (swapped.action, swapped.roster) == (decide.Action.RESTART, ("a", "s"))
    assert (alive.action, alive.roster) == (decide.Action.RESTART, ())  # the same nodes, the spare still stands by


@pytest.mark.parametrize(
    ("silent", "spare_state", "lost", "spares"),
    [
        (["n2"], "IDLE", ("n2",), ("n3",)),
        (["n2"], "IDLE+NOT_RESPONDING", ("n2",), ()),  # a spare SLURM reports down is not called in
        (["n2", "n1"], "IDLE", (), ("n3",)),  # another node is silent too: no swap, the requeue
    ],
)
def test_node_0_calls_in_only_spares_slurm_does_not_report_down(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, silent: list[str], spare_state: str, lost: tuple, spares: tuple
) -> None:
    monkeypatch.setattr(conclude.records, "silent_hosts", lambda *_: silent)
    monkeypatch.setattr(conclude, "_node_states", lambda hosts: dict.fromkeys(hosts, spare_state))
    beat_as_spare(spare_beat_file(tmp_path, "n3"))  # its wrapper stands by
    blamed = ("n2", "SLURM reports n2 as DOWN and it wrote no result")
    found = conclude._allocation(tmp_path, ("n1", "n2"), decide.Reason.INFRA, blamed, 0, ("n3",), 0.0)
    assert found is not None and (found.lost, found.spares) == (lost, spares)


# ---------------------------------------------------------------- the spares' heartbeats


def write_beat(attempt: Path, host: str, at: float) -> None:
    spare_beat_file(attempt, host).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(spare_beat_file(attempt, host), {"host": host, "pid": 1, "updated": at})


@pytest.mark.parametrize(
    ("beat_age", "attempt_age", "called_in"),
    [
        (3.0, 1000.0, True),  # it beats
        (STALE_S + 20, 1000.0, False),  # its wrapper fell silent: SLURM still reports the node up
        (None, 10.0, True),  # no beat yet, 10 s into the attempt: it gets STALE_S to beat
        (None, STALE_S + 20, False),  # never beat in the whole attempt
        (5000.0, 10.0, True),  # an earlier job's beat (job ids repeat): the same as none yet
    ],
)
def test_node_0_calls_in_only_a_spare_whose_wrapper_beats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beat_age: float | None, attempt_age: float, called_in: bool
) -> None:
    monkeypatch.setattr(conclude.records, "silent_hosts", lambda *_: ["n2"])
    monkeypatch.setattr(conclude, "_node_states", lambda hosts: dict.fromkeys(hosts, "IDLE"))
    now = time.time()
    if beat_age is not None:
        write_beat(tmp_path, "n3", now - beat_age)
    blamed = ("n2", "SLURM reports n2 as DOWN and it wrote no result")
    found = conclude._allocation(tmp_path, ("n1", "n2"), decide.Reason.INFRA, blamed, 0, ("n3",), now - attempt_age)
    assert found is not None and found.spares == (("n3",) if called_in else ())
    assert [host for host, _ in found.silent_spares] == ([] if called_in else ["n3"])


def test_a_silent_spare_is_skipped_and_the_why_says_so() -> None:
    live, silent = decide.live_spares(("s", "t"), {"s": 240.0, "t": 4.0}, STALE_S)
    assert (live, silent) == (("t",), (("s", 240.0),))
    skipped = decide.Allocation(False, 0, ("a", "b"), live, ("b",), silent_spares=silent)
    decision = decide.swap_in_spares(LOST_NODE, skipped, decide.Budget())
    assert (decision.action, decision.roster) == (decide.Action.RESTART, ("a", "t"))
    assert decision.spares == ("s",)  # still left: node 0 asks again at the next loss
    assert decision.why.endswith("1 spare(s) left; 1 of 5); spare not called in, its wrapper silent: s for 240 s")
    alone = decide.Allocation(False, 0, ("a", "b"), (), ("b",), silent_spares=(("s", 240.0),))
    requeued = decide.swap_in_spares(LOST_NODE, alone, decide.Budget())
    assert requeued.action is decide.Action.REQUEUE, requeued
    said = "no restart onto a spare: 0 spare(s) left for 1 lost node(s); spare not called in, its wrapper silent: s"
    assert said in requeued.why, requeued.why


class Clock:
    """time.time and time.sleep for a wait that takes no time: each sleep moves the clock on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_spare_beats_every_few_seconds_while_it_waits_not_at_every_poll(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, beats = Clock(), []
    monkeypatch.setattr(outcome, "time", clock)
    monkeypatch.setattr(outcome, "beat_as_spare", lambda path: beats.append((clock.now, path)))
    polls = iter(range(8))  # 8 polls, 2 s apart: 16 s of standing by, then a stop signal
    assert outcome.wait_as_spare(tmp_path, None, lambda: next(polls, None) is None, "n3") == outcome.Outcome(
        outcome.END
    )
    assert [at - 1000.0 for at, _ in beats] == [0.0, 6.0, 12.0]  # BEAT_S 5 s, looked at every 2 s poll
    assert {path for _, path in beats} == {spare_beat_file(tmp_path, "n3")}


def test_a_spares_beat_is_read_back_as_its_silence(tmp_path: Path) -> None:
    beat_as_spare(spare_beat_file(tmp_path, "n3"))
    now = time.time()
    silences = spare_silences(tmp_path, ("n3", "n4"), now + 30, now - 100)
    assert round(silences["n3"]) == 30 and silences["n4"] == pytest.approx(130)  # n4: none since the start


class HeldLease:
    def check(self, _: str) -> None:
        pass


def test_node_0_records_the_spares_standing_by_for_status(tmp_path: Path) -> None:
    a = attempt.Attempt(tmp_path, spares_plan(), task(0), "77", SignalLog(), spares=("n3",))
    a.lease, a.phase = HeldLease(), attempt.Phase.TRAIN  # type: ignore[assignment]
    attempt._record_phase(a)
    assert read_status(tmp_path) == {"state": "running", "phase": "train", "spares": ["n3"], "updated": ANY}


# ---------------------------------------------------------------- a spare's attempt


def test_a_spare_stands_by_joins_the_next_attempt_on_its_roster_and_trains_at_the_lost_nodes_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    plan = replace(spares_plan(f"run_dir={run_dir}"), tiny_cache=None)
    outcome.publish(attempt_dir(run_dir, "77"), outcome.Outcome("restart", "77.i1", ("n1", "n3"), ()), NONCE)
    outcome.publish(attempt_dir(run_dir, "77.i1"), outcome.Outcome(outcome.END), NONCE)
    trained: list[tuple[str, SlurmEnv]] = []

    def agreed(*_: object) -> ResumePoint:
        return ResumePoint(None, 50)

    def trains(plan: JobPlan, where: SlurmEnv, run_dir: Path, attempt_id: str, *_: object) -> Observed:
        trained.append((attempt_id, where))
        return Observed(0, [], False, ProgressWatch(Path("/dev/null"), 1.0), 1.0)

    monkeypatch.setattr(attempt, "agree_on_resume", agreed)
    monkeypatch.setattr(attempt, "train", trains)
    result = attempt.run(run_dir, plan, task(2), SignalLog())

    [(attempt_id, where)] = trained
    assert attempt_id == "77.i1" and (where.node_id, where.hosts) == (1, ("n1", "n3"))
    assert result.exit_code == 0


@pytest.mark.parametrize(
    ("said", "why"),
    [
        (outcome.Outcome(outcome.END), "node 0 ended the attempt without a restart"),
        (outcome.Outcome("restart", "77.i1", ("n1", "n2"), ("n3",)), None),  # a spare again: stands by for 77.i1
    ],
)
def test_a_spare_ends_with_the_run_or_stands_by_again(tmp_path: Path, said: outcome.Outcome, why: str | None) -> None:
    run_dir = tmp_path / "run"
    plan = replace(spares_plan(f"run_dir={run_dir}"), tiny_cache=None)
    outcome.publish(attempt_dir(run_dir, "77"), said, NONCE)
    outcome.publish(attempt_dir(run_dir, "77.i1"), outcome.Outcome(outcome.END), NONCE)
    result = attempt.run(run_dir, plan, task(2), SignalLog())
    assert (result.exit_code, result.why) == (0, "node 0 ended the attempt without a restart"), result
    assert why is None or result.why == why


def test_a_node_taken_off_the_roster_and_not_a_spare_ends(tmp_path: Path) -> None:
    a = attempt.Attempt(tmp_path, spares_plan(), task(1), "77", SignalLog(), allocation=task(1))
    said = outcome.Outcome("restart", "77.i1", ("n1", "n3"), ())
    assert attempt._follow(a, said) is attempt.Phase.DONE
    assert a.result is not None and a.result.why == "taken off the roster by node 0"


def test_the_outcome_carries_the_roster_and_the_spares(tmp_path: Path) -> None:
    said = outcome.Outcome("restart", "77.i1", ("n1", "n3"), ("n4",))
    outcome.publish(tmp_path, said, "job-run")
    assert outcome.wait_as_spare(tmp_path, "job-run", lambda: False, "n4") == said


def test_a_spare_ends_its_wait_on_a_stop_signal(tmp_path: Path) -> None:
    assert outcome.wait_as_spare(tmp_path, None, lambda: True, "n4") == outcome.Outcome(outcome.END)


# ---------------------------------------------------------------- the plan


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (("resilience.spare_nodes=1",), "needs SLURM"),
        (("+cluster=local-slurm", "cluster.nodes=1", "resilience.spare_nodes=1"), "on a 1-node plan"),
        (("+cluster=local-slurm", "resilience.spare_nodes=1", "resilience.min_nodes=1"), "with resilience.min_nodes"),
        (("+cluster=local-slurm", "resilience.spare_nodes=1", "resilience.max_restarts=0"), "max_restarts=0"),
        (("+cluster=local-slurm", "resilience.spare_nodes=-1"), "negative"),
    ],
)
def test_spares_that_could_never_take_a_place_are_refused_with_the_fix(
    overrides: tuple[str, ...], refused: str
) -> None:
    with pytest.raises(ConfigError, match=refused) as err:
        plan_for(*overrides)
    assert "HINT:" in str(err.value) and "\n" not in str(err.value)


def test_the_job_asks_for_the_spares_and_keeps_its_nodes_after_a_loss() -> None:
    script = render_sbatch(spares_plan())
    assert "#SBATCH --nodes=3\n" in script and "#SBATCH --no-kill\n" in script
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=1 --no-kill " in script
    plain = render_sbatch(plan_for("+cluster=local-slurm"))
    assert "#SBATCH --nodes=2\n" in plain and "no-kill" not in plain


def test_the_plan_shows_the_spares_and_their_cost() -> None:
    plan = spares_plan()
    line = plan_spares_line(plan)
    assert line is not None and line in describe_plan(plan)
    assert "1 node(s) beside the 2 training: the job asks for 3" in line
    assert "0.5 CPU process-hours per job run at the time limit, 33% of the allocation" in line  # 1 × 30 min
    assert plan_spares_line(plan_for("+cluster=local-slurm")) is None


# ---------------------------------------------------------------- ledger and status


def test_the_ledger_counts_the_spares_share_as_its_own_category() -> None:
    marks = (ledger.Mark(0.0, "startup"), ledger.Mark(10.0, "committed"), ledger.Mark(90.0, "finish"))
    held = ledger.AttemptMarks("77", "77", 0.0, 100.0, marks, hosts=2, spares=1)
    spent = ledger.compute([ledger.Allocation("77", 0.0, 100.0, width=3)], [held], 1, "CPU process", 100.0)
    assert spent.allocated_s == 300.0 and spent.spent_s["spares"] == 100.0
    assert (spent.spent_s["startup"], spent.spent_s["committed"], spent.spent_s["finish"]) == (20.0, 160.0, 20.0)
    assert spent.unaccounted_s == 0.0


def test_a_job_run_slurm_resized_after_the_loss_is_one_job_run_and_its_spares_end_with_the_resize() -> None:
    """sacct shows a `--no-kill` job that lost a node as a RESIZING row on 3 nodes, then a row on the 2 left."""
    before = ledger.AttemptMarks(
        "77",
        "77",
        0.0,
        60.0,
        (ledger.Mark(0, "startup"), ledger.Mark(10, "committed"), ledger.Mark(40, "restart")),
        2,
        1,
    )
    after = ledger.AttemptMarks(
        "77.i1",
        "77",
        60.0,
        100.0,
        (ledger.Mark(60, "startup"), ledger.Mark(70, "committed"), ledger.Mark(95, "finish")),
        2,
    )
    rows = [ledger.Allocation("77", 0.0, 50.0, 3, 0.0, resized=True), ledger.Allocation("77", 50.0, 100.0, 2, 50.0)]
    spent = ledger.compute(rows, [before, after], 1, "CPU process", 100.0)
    assert spent.allocated_s == 250.0 and spent.unaccounted_s == 0.0 and spent.outside_s == 0.0
    assert spent.spent_s["spares"] == 50.0  # the spare's 50 s until SLURM let the lost node go
    assert (spent.spent_s["restart"], spent.spent_s["committed"]) == (60.0, 110.0)  # across the resize: a restart
    assert spent.queue_wait_s == 0.0 and spent.requeue_hold_s == 0.0


def test_sacct_s_resizing_row_marks_the_job_run_as_resized() -> None:
    rows = [
        {"job_id": "78", "raw_id": "78", "state": "RESIZING", "submit": 0.0, "start": 0.0, "end": 36.0, "nodes": 3},
        {"job_id": "78", "raw_id": "78", "state": "COMPLETED", "submit": 36.0, "start": 36.0, "end": 80.0, "nodes": 2},
    ]
    first, second = accounting.allocations_of(rows, 1)
    assert (first.resized, first.width, second.resized, second.width) == (True, 3, False, 2)


def test_status_tells_the_spares_left_and_each_swap() -> None:
    swapped = AttemptRecord("77", "77", hosts=("n1", "n2"), spares=("n3",), swaps=(("n2", "n3"),))
    after = AttemptRecord("77.i1", "77", hosts=("n1", "n3"))
    assert spares_left([swapped, after]) == 0
    assert spares_left([AttemptRecord("77", "77", hosts=("n1", "n2"), spares=("n3",))]) == 1
    assert spares_left([AttemptRecord("77", "77", hosts=("n1", "n2"))]) is None
    assert AttemptRecord.from_dict(swapped.as_dict()) == swapped  # as attempts.jsonl keeps it


def test_status_tells_each_standing_spares_heartbeat_while_the_run_runs(tmp_path: Path) -> None:
    now = time.time()
    records.open_attempt(tmp_path, AttemptRecord("77.i1", "77", start=now - 1000))
    records.write_status(tmp_path, "running", job_id="77", attempt="77.i1", spares=["n3", "n4"])
    write_beat(attempt_dir(tmp_path, "77.i1"), "n3", now - 4)
    write_beat(attempt_dir(tmp_path, "77.i1"), "n4", now - 240)
    facts = gather(tmp_path)
    assert [(b["host"], b["alive"]) for b in facts.spare_beats] == [("n3", True), ("n4", False)], facts.spare_beats
    assert facts.spares_left == 2  # no attempt record has the spares yet: status.json names them
    assert spares_line(replace(facts, spare_beats=standing_spares(tmp_path, "running", now))) == (
        "spares: 2 standing by (n3: beat 4 s ago, n4: SILENT for 240 s, not called in); nodes replaced by a spare: none"
    )
    assert standing_spares(tmp_path, "finished", now) == ()  # the spares end with the run
