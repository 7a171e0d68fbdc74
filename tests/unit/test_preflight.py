"""Preflight: the judging of facts (pure), the report, the plan's preflight facts, the checks-only sbatch script,
and one real run of the checks on this machine (one node: port, run dir, paths, disk, gloo all-reduce)."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from swiftslurm.errors import ConfigError
from swiftslurm.planning.make import min_free_gb
from swiftslurm.preflight import checks as pc
from swiftslurm.preflight import gather as preflight
from swiftslurm.slurm_env import SlurmEnv
from swiftslurm.submit import preflight as login_preflight
from tests.conftest import compose_config, plan_for


def test_unreachable_master_port_names_the_address_the_error_and_the_fix() -> None:
    check = pc.port_reachable("node1", 12345, "connect timeout", 20.4)
    assert not check.ok
    assert check.message.startswith("cannot reach node1:12345 (connect timeout; tried for 20 s). HINT: open TCP")
    assert "NCCL_SOCKET_IFNAME" in check.hint


def test_first_failure_is_the_cause_not_its_consequences() -> None:
    dist = pc.skipped("torch.distributed all-reduce", "node2 did not reach the master port")
    node0 = pc.NodeReport(0, "node1", (pc.port_free("node1", 1, None), dist))
    node1 = pc.NodeReport(1, "node2", (pc.port_reachable("node1", 1, "Connection refused", 3),))
    report = pc.assemble("7", [node1, node0])
    assert [n.host for n in report.nodes] == ["node1", "node2"]
    assert report.first_failure() == f"node2: {node1.checks[0].message}"
    assert len(report.failures()) == 2 and not report.ok


@pytest.mark.parametrize(
    ("free_gb", "need_gb", "ok"),
    [(10.0, 10.0, True), (9.9, 10.0, False), (0.5, 1.0, False), (500.0, 112.0, True)],
)
def test_free_disk_threshold(free_gb: float, need_gb: float, ok: bool) -> None:
    check = pc.free_disk("/scratch/run", int(free_gb * 1e9), need_gb)
    assert check.ok is ok
    assert check.detail.startswith(f"{free_gb:.1f} GB free in /scratch/run, {need_gb:.1f} GB needed")
    assert ok or "keep_checkpoints" in check.hint


def test_a_store_a_node_cannot_reach_fails_with_the_fix() -> None:
    """An endpoint the login node reaches and the nodes do not (127.0.0.1): each node asks the store itself."""
    ok = pc.store_reachable("s3://b/p/ at http://10.0.0.5:9000", None)
    assert ok.ok and ok.name == "object store"
    failed = pc.store_reachable("s3://b/p/ at http://127.0.0.1:9000", "cannot reach s3://b/p/")
    assert not failed.ok and "cannot be reached from this node" in failed.message
    assert "storage.endpoint_url" in failed.message and "loopback" in failed.message


@pytest.mark.parametrize(
    ("params_b", "tuner", "need"),
    [(0.0, "lora", 1.0), (8.0, "lora", 1.6), (8.0, "full", 112.0), (72.0, "full", 1008.0), (0.5, "full", 7.0)],
)
def test_free_disk_estimate_is_one_checkpoint_of_the_model(params_b: float, tuner: str, need: float) -> None:
    assert min_free_gb(params_b, tuner) == need


@pytest.mark.parametrize(
    ("planned", "seen", "ok", "text"),
    [
        (0, None, True, "no GPUs planned"),
        (8, 8, True, "8 visible, 8 planned"),
        (8, 4, False, "4 GPU(s) visible, 8 planned"),
        (4, None, False, "cannot count GPUs"),
    ],
)
def test_gpu_count_against_the_plan(planned: int, seen: int | None, ok: bool, text: str) -> None:
    check = pc.gpus(planned, seen, "0,1,2,3", "no torch")
    assert check.ok is ok and text in check.detail


@pytest.mark.parametrize(
    ("result", "error", "ok"),
    [([3.0, 2.0], None, True), ([2.0, 2.0], None, False), (None, "DistStoreError: timed out", False)],
)
def test_all_reduce_sum_is_checked(result: list[float] | None, error: str | None, ok: bool) -> None:
    check = pc.distributed("gloo", 2, result, error)
    assert check.ok is ok
    assert ok or "HINT" in check.message


def test_token_not_visible_says_the_run_dir_is_not_shared() -> None:
    check = pc.token_visible("node3", "node1", "/runs/x/preflight/5/rank0.token", False, 6.7)
    assert not check.ok
    assert "node3 cannot see /runs/x/preflight/5/rank0.token, written by node1, after 7 s" in check.detail
    assert check.hint.startswith("HINT: put run_dir on a filesystem every node mounts")


def test_missing_peer_is_a_consequence_only_when_its_own_report_says_why() -> None:
    assert pc.peer_missing("node2", "node1", 5, 20, reported=True).consequence
    alone = pc.peer_missing("node2", "node1", 5, 20, reported=False)
    assert not alone.consequence and "job log" in alone.hint


def test_node_report_round_trips_through_json() -> None:
    report = pc.NodeReport(1, "gpu-a07", (pc.local_path("/data/x.jsonl", False),), "GPU0 X NV18")
    assert pc.NodeReport.from_dict(json.loads(json.dumps(report.to_dict()))) == report


def test_table_has_one_row_per_check_and_a_verdict() -> None:
    report = pc.assemble("9", [pc.NodeReport(0, "n1", (pc.gpus(0, None, None), pc.local_path("/m", False)))])
    lines = pc.render_table(report).splitlines()
    assert lines[0].split() == ["host", "check", "result", "detail"]
    assert "FAILED" in lines[2] and "/m does not exist on this node. HINT:" in lines[2]
    assert lines[-1].startswith("preflight FAILED (1 check(s)): n1: /m does not exist")


def test_plan_carries_preflight_switch_paths_and_disk_estimate() -> None:
    plan = plan_for(
        "model=qwen3-8b",
        "strategy=zero3",
        "strategy.tuner_type=full",
        "dataset=['/data/sft.jsonl#500',AI-ModelScope/alpaca-gpt4-data-en]",
        "preflight=true",
    )
    assert plan.preflight.enabled and plan.preflight.timeout_s == 60.0
    assert plan.preflight.local_paths == ("/data/sft.jsonl",)  # hub ids are downloaded, not looked for
    params_b = compose_config("model=qwen3-8b").model.params_b
    assert plan.preflight.min_free_gb == min_free_gb(params_b, "full") > 100
    assert plan_for("preflight_min_free_gb=5").preflight.min_free_gb == 5.0


def test_tiny_plan_checks_the_built_model_and_dataset() -> None:
    paths = plan_for().preflight.local_paths
    assert len(paths) == 2 and all(p.startswith("/shared/cache/swiftslurm/") for p in paths)


def test_nonpositive_preflight_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"preflight_timeout_s=0.0 must be positive\. HINT"):
        plan_for("preflight_timeout_s=0")


def test_checks_only_job_asks_for_the_training_allocation_with_a_short_limit() -> None:
    plan = plan_for(
        "+cluster=a100x16", "model=qwen3-8b", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "strategy=zero3"
    )
    script = login_preflight.render_preflight_sbatch(plan, 60.0)
    assert "#SBATCH --job-name=preflight-" in script and "#SBATCH --nodes=2" in script
    assert "#SBATCH --gpus-per-node=" in script and "#SBATCH --time=4" in script
    for absent in ("--signal", "--requeue", "--open-mode"):
        assert absent not in script
    assert "srun --ntasks-per-node=1 --kill-on-bad-exit=0" in script
    assert f"-m swiftslurm.preflight.gather {plan.run_dir} --port-base 10000 --timeout 60.0" in script


def test_probe_result_is_found_among_nccl_log_lines_printed_after_it() -> None:
    """NCCL_DEBUG=INFO writes to the probe's stdout, also after its result (seen on 2 GPU "nodes")."""
    mark = preflight.torch_probe.RESULT_MARK
    stdout = "\n".join(
        [
            "vm:1234:1234 [0] NCCL INFO Bootstrap: Using lo:127.0.0.1<0>",
            mark + json.dumps({"result": [3.0, 2.0]}),
            "vm:1234:1250 [0] NCCL INFO comm 0x5a3c rank 0 nranks 2 - Destroy COMPLETE",
        ]
    )
    assert preflight.probe_result(stdout) == {"result": [3.0, 2.0]}
    # A log line written into the middle of ours still leaves the result readable from the mark on.
    assert preflight.probe_result("NCCL INFO x " + mark + '{"error": "boom"}') == {"error": "boom"}
    assert preflight.probe_result("NCCL INFO only\n{}") is None


def leaders_view_of_node2(tmp_path: Path, checked_in: bool) -> pc.Report:
    """Node 0 (node1) assembling node 1's (node2's) rows: node2's own checks, if it checked in, and what node1
    saw of node2's token and check-in."""
    where = SlurmEnv(job_id="5", hosts=("node1", "node2"), node_id=0, num_nodes=2, proc_id=0, num_tasks=2)
    ctx = preflight.Context(tmp_path, None, None, where, "5", 10000, 1.0, "node1")
    own = pc.NodeReport(1, "node2", (pc.token_visible("node2", "node1", str(ctx.token(0)), True, 0.1),))
    conn = socket.socket()
    conn.close()  # node 0 is done talking to node2: only its report matters here
    got = {1: (own, conn)} if checked_in else {}
    token = pc.token_visible("node1", "node2", str(ctx.token(1)), checked_in, 0.1)
    peer = preflight._peer_report(ctx, 1, got, 0.0, token)
    return pc.assemble("5", [peer])


def test_a_row_names_the_host_that_made_the_check(tmp_path: Path) -> None:
    """Issue 17, item 10: node1's look at node2's token was shown as node2's row ("node2 ... sees node2's
    rank1.token"); it is node1's check, filed under node2 only so that a failure names node2."""
    rows = pc.render_table(leaders_view_of_node2(tmp_path, checked_in=True)).splitlines()[1:-1]
    assert [row.split()[0] for row in rows] == ["node2", "node1"]
    assert "node2 sees node1's" in rows[0] and "node1 sees node2's" in rows[1]


def test_a_peer_that_never_checked_in_is_named_in_node_0s_rows_and_blamed(tmp_path: Path) -> None:
    report = leaders_view_of_node2(tmp_path, checked_in=False)
    rows = pc.render_table(report).splitlines()[1:-1]
    assert [row.split()[0] for row in rows] == ["node1", "node1"]
    assert "node2 did not check in at node1:" in rows[1]
    first = report.first_failure()
    assert first is not None and first.startswith("node2: node1 cannot see ")


def test_a_waited_for_run_with_preflight_says_its_verdict(tmp_path: Path) -> None:
    """`preflight=true wait=true` printed the run's result without a word about the checks (they were only in
    node 0's log): the result names the verdict and the report, passed or failed."""
    from dataclasses import replace

    from swiftslurm.submit.report import result_summary

    def summary(plan: Any) -> str:
        return result_summary(plan, "finished", "", 1)

    plan = plan_for("+cluster=local-slurm", "preflight=true")
    plan = replace(plan, run_dir=str(tmp_path / "run"))
    assert "preflight        no report" in summary(plan)
    report = tmp_path / "run" / "preflight" / "32" / "report.json"
    report.parent.mkdir(parents=True)
    check = {"name": "run dir visible", "ok": True, "detail": "read plan.json"}
    nodes = [{"node": 0, "host": "node1", "checks": [check]}, {"node": 1, "host": "node2", "checks": []}]
    report.write_text(json.dumps({"attempt": "32", "nodes": nodes}))
    assert f"preflight        passed on 2 node(s) ({report})" in summary(plan)
    check.update(ok=False, detail="no such file")
    report.write_text(json.dumps({"attempt": "32", "nodes": [{"node": 1, "host": "node2", "checks": [check]}]}))
    assert "preflight        FAILED 1 check(s), first: node2 run dir visible: no such file" in summary(plan)
    assert "preflight" not in summary(replace(plan, preflight=replace(plan.preflight, enabled=False)))
