"""Resume on fewer nodes (`resilience.min_nodes`, opt-in): the node count a requeue asks for (pure), the ranks
and gradient accumulation of an attempt on fewer nodes, the plan-time refusals, and the leader's requeue with
SLURM faked at its one seam (slurm_cli.run). The run on the real cluster is tests/cluster/test_shrink.py."""

from __future__ import annotations

import json
import re
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from swiftslurm import slurm as slurm_cli
from swiftslurm.ckpt.checkpoint import ResumePoint
from swiftslurm.engines.registry import engine_for
from swiftslurm.errors import ConfigError, NodeError, SubmitError
from swiftslurm.node import conclude as conclude_mod
from swiftslurm.node import decide
from swiftslurm.node import requeue as requeue_mod
from swiftslurm.node.decide import Action, Decision, Reason, nodes_for_next, with_node_count
from swiftslurm.node.watch import Observed
from swiftslurm.ops.runs import gather
from swiftslurm.plan import JobPlan
from swiftslurm.planning import memory_plan
from swiftslurm.planning.validate import shrunk_shape_refusal
from swiftslurm.rundir import records
from swiftslurm.rundir.beat import ProgressWatch
from swiftslurm.rundir.layout import ATTEMPTS, attempt_dir, progress_file
from swiftslurm.slurm_env import AttemptShape, SlurmEnv, check_allocation, rank_env
from tests.conftest import compose_config, plan_for

THREE = ("+cluster=local-slurm", "cluster.nodes=3", "global_batch_size=6")


SHRINKS = (*THREE, "resilience.min_nodes=2")


DATASET = "dataset=[AI-ModelScope/alpaca-gpt4-data-en]"  # a real model needs one


def on(nodes: int, node_id: int = 0) -> SlurmEnv:
    hosts = tuple(f"n{i}" for i in range(nodes))
    return SlurmEnv(job_id="77", hosts=hosts, node_id=node_id, num_nodes=nodes, proc_id=node_id, num_tasks=nodes)


@pytest.mark.parametrize(
    ("planned", "least", "usable", "nodes"),
    [
        (3, 2, 3, 3),  # a replacement is there: the full count
        (3, 2, 5, 3),  # never more than planned
        (3, 2, 2, 2),  # one lost, none to replace it: shrink
        (3, 2, 1, 2),  # never below min_nodes: the job waits for nodes to come back
        (4, 1, 0, 1),
        (3, 2, None, 3),  # SLURM could not say: as without min_nodes
    ],
)
def test_the_next_attempt_asks_for_the_usable_nodes_between_min_nodes_and_the_plan(
    planned: int, least: int, usable: int | None, nodes: int
) -> None:
    assert nodes_for_next(planned, least, usable) == nodes


def requeue(why: str = "lost n2") -> Decision:
    return Decision(Action.REQUEUE, Reason.INFRA, why, 30, ("n2",))


def test_a_lost_node_without_replacement_shrinks_the_requeue_and_says_so() -> None:
    shrunk = with_node_count(requeue(), 3, 2, healthy=["n0", "n1", "n2"], excluded=["n2"])
    assert shrunk.nodes == 2 and shrunk.exclude_hosts == ("n2",) and shrunk.delay_s == 30
    assert "on 2 of 3 nodes" in shrunk.why and "resilience.min_nodes=2" in shrunk.why
    assert shrunk.why.startswith("lost n2; ")


def test_back_to_the_full_count_when_the_partition_has_it_again() -> None:
    full = with_node_count(requeue(), 3, 2, healthy=["n0", "n1", "n2", "n3"], excluded=["n2"])
    assert full.nodes == 3 and full.why == "lost n2"


def test_too_few_nodes_left_waits_at_min_nodes() -> None:
    waiting = with_node_count(requeue(), 3, 2, healthy=["n0"], excluded=[])
    assert waiting.nodes == 2 and "waits for nodes to come back" in waiting.why


@pytest.mark.parametrize("action", [Action.DONE, Action.STOP, Action.RESTART])
def test_only_a_requeue_gets_a_node_count(action: Action) -> None:
    decision = Decision(action, Reason.INFRA, "x")
    assert with_node_count(decision, 3, 2, healthy=["n0"], excluded=[]) is decision


def test_an_allocation_of_fewer_nodes_is_refused_without_min_nodes() -> None:
    with pytest.raises(NodeError, match=r"plan\.json was made for 3"):
        check_allocation(on(2), plan_for(*THREE))


def test_an_allocation_between_min_nodes_and_the_plan_is_accepted() -> None:
    plan = plan_for(*SHRINKS)
    check_allocation(on(2), plan)
    check_allocation(on(3), plan)
    with pytest.raises(NodeError, match="allows 2 to 3"):
        check_allocation(on(1), plan)


def test_ranks_come_from_the_allocation_and_the_global_batch_stays() -> None:
    plan = plan_for(*SHRINKS)
    assert (plan.batch.grad_accum, plan.batch.data_parallel) == (2, 3)
    env = rank_env(on(2, node_id=1), plan)
    assert (env["NNODES"], env["NODE_RANK"], env["NPROC_PER_NODE"]) == ("2", "1", "1")
    batch = AttemptShape.of(on(2), plan).batch
    assert (batch.micro, batch.grad_accum, batch.data_parallel, batch.global_) == (1, 3, 2, 6)
    assert AttemptShape.of(on(3), plan).batch is plan.batch
    assert engine_for(plan.launcher).reshaped_args(batch) == (
        "--per_device_train_batch_size",
        "1",
        "--gradient_accumulation_steps",
        "3",
    )


def test_without_min_nodes_ranks_and_batch_are_the_plans() -> None:
    plan = plan_for(*THREE)
    assert rank_env(on(3), plan)["NNODES"] == "3" and AttemptShape.of(on(3), plan).batch is plan.batch


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (("resilience.min_nodes=4",), r"min_nodes=4 is above cluster.nodes=3"),
        (("resilience.min_nodes=0",), r"resilience.min_nodes=0 must be at least 1"),
        # 6 samples over 3, 2 and 1 ranks divide; 3 nodes × micro 2 = 6 does not divide over 2 ranks × 2 = 4.
        (("global_batch_size=6", "micro_batch_size=2", "resilience.min_nodes=2"), r"multiple of 12"),
        (("global_batch_size=null", "resilience.min_nodes=2"), r"on 2 node\(s\) the global batch of 3"),
        (("strategy=zero3", "resilience.min_nodes=2"), r"DeepSpeed.*ZeRO-3.*strategy=zero2"),
    ],
)
def test_a_run_that_could_not_shrink_is_refused_at_plan_time(overrides: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_for(*THREE, *overrides)


def test_megatron_is_refused_with_the_reason() -> None:
    with pytest.raises(ConfigError, match=r"megatron.*resilience\.min_nodes out"):
        plan_for(
            "+cluster=a100x16",
            "model=qwen3-8b",
            "strategy=megatron",
            "task=megatron_sft",
            "resilience.min_nodes=1",
            DATASET,
        )


def test_full_replicas_and_fsdp2_may_shrink() -> None:
    assert plan_for(*THREE, "strategy=ddp", "resilience.min_nodes=1").resilience.min_nodes == 1
    fsdp2 = ("+cluster=a100x16", "model=qwen3-8b", "strategy=fsdp2", "resilience.min_nodes=1", DATASET)
    assert plan_for(*fsdp2).resilience.min_nodes == 1


BIG = ("+cluster=a100x16", "model=qwen2.5-72b-instruct", "strategy=fsdp2", "strategy.tuner_type=full")


BIG_ON_FOUR = (*BIG, "cluster.nodes=4", "global_batch_size=96", DATASET)  # fits on 4 and 3 nodes, not on 2 or 1


def test_a_shrink_that_would_not_fit_is_refused_naming_the_fewest_nodes_that_fit() -> None:
    """FSDP2 shards over fewer ranks after a shrink: each GPU holds more (memory planner, docs/memory.md)."""
    with pytest.raises(ConfigError, match=r"min_nodes=1: on 1 node\(s\).*would not fit.*min_nodes to 3, the fewest"):
        plan_for(*BIG_ON_FOUR, "resilience.min_nodes=1")
    assert plan_for(*BIG_ON_FOUR, "resilience.min_nodes=3").resilience.min_nodes == 3


def test_cpu_clusters_have_no_memory_check() -> None:
    assert shrunk_shape_refusal(compose_config(*SHRINKS), 1) is None


def test_the_dry_run_shows_the_range_and_the_smallest_shape() -> None:
    three = (*BIG_ON_FOUR, "resilience.min_nodes=3")
    line = memory_plan.shrink_line(compose_config(*three), plan_for(*three)) or ""
    found = re.fullmatch(
        r"resilience  may resume on 3\.\.4 nodes \(min_nodes=3\); at 3: accumulation 4, est\. ([\d.]+) GiB/GPU .*", line
    )
    assert found, line
    shape = memory_plan.shape_of(compose_config(*BIG_ON_FOUR))
    assert shape is not None
    full = memory_plan.plan_estimate(compose_config(*BIG_ON_FOUR), shape)
    assert float(found[1]) > full.gib()  # fewer ranks to shard over: more per GPU
    cpu = memory_plan.shrink_line(compose_config(*SHRINKS), plan_for(*SHRINKS))
    assert cpu == "resilience  may resume on 2..3 nodes (min_nodes=2); at 2: accumulation 3 (docs/resilience.md)"
    assert memory_plan.shrink_line(compose_config(*THREE), plan_for(*THREE)) is None


class Partition:
    """slurm_cli.run as SLURM answers it: `sinfo` lists the partition's nodes with their states."""

    def __init__(self, states: dict[str, str]) -> None:
        self.states = states
        self.calls: list[list[str]] = []

    def run(self, argv: list[str]) -> str:
        self.calls.append(argv)
        if argv[0] == "sinfo" and "%T" in argv[-1]:
            return "".join(f"{node} debug* {state}\n" for node, state in self.states.items())
        if argv[0] == "sinfo":
            return "".join(f"{node} debug*\n" for node in self.states)
        if argv[:3] == ["scontrol", "show", "node"]:
            return "".join(f"NodeName={h} State={self.states[h].upper()}\n" for h in argv[4].split(","))
        if argv[:2] == ["scontrol", "update"] or argv[:2] == ["scontrol", "requeue"]:
            return ""
        raise SubmitError(f"`{' '.join(argv)}` failed")


def shrink_plan(tmp_path: Path, *overrides: str) -> JobPlan:
    return replace(plan_for(*SHRINKS, *overrides), run_dir=str(tmp_path / "run"))


def conclude_lost(
    tmp_path: Path,
    plan: JobPlan,
    monkeypatch: pytest.MonkeyPatch,
    states: dict[str, str],
    fake: Partition | None = None,
) -> Decision:
    """Node 0 concluding an attempt on n0..n2 in which n2 wrote no result (its trainer's peers failed), unless
    `states` says n2 is up: then it wrote one too (a crash with every node alive)."""
    fake = fake or Partition(states)
    monkeypatch.setattr(slurm_cli, "run", fake.run)
    monkeypatch.setattr(time, "sleep", lambda _s: None)
    monkeypatch.setattr(conclude_mod, "SILENT_HOST_WAIT_S", 0.0)
    run_dir = Path(plan.run_dir)
    here = attempt_dir(run_dir, "77.0")
    here.mkdir(parents=True)
    plan.output_dir.mkdir()
    for node in (0, 1, 2) if not decide.node_down(states["n2"]) else (0, 1):
        records.write_node_result(here, node, f"n{node}", 1)
    watch = ProgressWatch(progress_file(here), time.time())
    observed = Observed(1, [], False, watch, time.time() - 3600)
    return conclude_mod.conclude(plan, on(3), run_dir, "77.0", ResumePoint(None, 0), observed)


def test_a_node_lost_for_good_requeues_on_the_others(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = shrink_plan(tmp_path)
    decision = conclude_lost(tmp_path, plan, monkeypatch, {"n0": "mixed", "n1": "idle", "n2": "down*"})
    assert (decision.action, decision.nodes) == (Action.REQUEUE, 2), decision
    record = json.loads((tmp_path / "run" / ATTEMPTS).read_text().splitlines()[-1])
    assert (record["nodes"], record["next_nodes"], record["failed_host"]) == (3, 2, "n2")


def test_status_shows_the_node_count_of_each_attempt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conclude_lost(tmp_path, shrink_plan(tmp_path), monkeypatch, {"n0": "mixed", "n1": "idle", "n2": "down*"})
    assert gather(tmp_path / "run").attempt_reasons == ("infra→requeue on 3 nodes",)


def test_a_crash_with_every_node_alive_restarts_in_place_and_asks_for_no_node_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Restart in place (decide.restart_in_place) comes first: a shrink only happens on a requeue."""
    fake = Partition({"n0": "mixed", "n1": "idle", "n2": "mixed"})
    decision = conclude_lost(tmp_path, shrink_plan(tmp_path), monkeypatch, fake.states, fake)
    assert (decision.action, decision.nodes) == (Action.RESTART, None), decision
    assert not any(argv[0] == "sinfo" and "%T" in argv[-1] for argv in fake.calls)  # no node count asked


def test_a_lost_node_with_a_spare_keeps_the_full_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = shrink_plan(tmp_path)
    states = {"n0": "mixed", "n1": "idle", "n2": "down*", "n3": "allocated"}  # n3 is busy, not lost
    decision = conclude_lost(tmp_path, plan, monkeypatch, states)
    assert (decision.action, decision.nodes) == (Action.REQUEUE, 3), decision


def test_without_min_nodes_the_requeue_leaves_the_node_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = replace(plan_for(*THREE), run_dir=str(tmp_path / "run"))
    decision = conclude_lost(tmp_path, plan, monkeypatch, {"n0": "mixed", "n1": "idle", "n2": "down*"})
    assert decision.action is Action.REQUEUE and decision.nodes is None
    record = json.loads((tmp_path / "run" / ATTEMPTS).read_text().splitlines()[-1])
    assert "nodes" not in record and "next_nodes" not in record


def test_the_requeue_sets_the_jobs_node_count_and_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Partition({})
    monkeypatch.setattr(slurm_cli, "run", fake.run)
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    decision = replace(requeue(), nodes=2)
    with pytest.raises(requeue_mod.Requeued):
        requeue_mod.requeue(on(3), shrink_plan(tmp_path, "cluster.cpus_per_task=4"), decision)
    # NumCPUs with it: SLURM keeps the 3 nodes' 12 CPUs otherwise, which 2 nodes of 4 CPUs can never give.
    assert ["scontrol", "update", "JobId=77", "NumNodes=2-2", "NumTasks=2", "NumCPUs=8"] in fake.calls


def test_a_requeue_without_a_node_count_does_not_touch_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = Partition({})
    monkeypatch.setattr(slurm_cli, "run", fake.run)
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    with pytest.raises(requeue_mod.Requeued):
        requeue_mod.requeue(on(3), shrink_plan(tmp_path), requeue())
    assert not any("NumNodes" in word for argv in fake.calls for word in argv)
