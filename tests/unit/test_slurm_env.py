"""Rank derivation from SLURM environments: host lists, ranks, ports, allocation checks."""

from __future__ import annotations

import pytest

from swiftslurm.errors import NodeError
from swiftslurm.slurm_env import SlurmEnv, check_allocation, expand_hostlist, master_port, rank_env
from tests.conftest import plan_for


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu-a[001-003,010],gpu-b7", ["gpu-a001", "gpu-a002", "gpu-a003", "gpu-a010", "gpu-b7"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("rack[1-2]-node[1-2]", ["rack1-node1", "rack1-node2", "rack2-node1", "rack2-node2"]),
        ("a1,b[2,4],c", ["a1", "b2", "b4", "c"]),
        ("host-1.cluster.local", ["host-1.cluster.local"]),
    ],
)
def test_host_lists_expand_like_slurm(nodelist: str, hosts: list[str]) -> None:
    assert expand_hostlist(nodelist) == hosts


def test_malformed_host_list_names_the_variable() -> None:
    with pytest.raises(NodeError, match="SLURM_JOB_NODELIST"):
        expand_hostlist("node[1-")


def srun_env(node: int, nodes: int = 2, job: str = "4242", nodelist: str = "gpu[07-08]", **extra: str) -> dict:
    env = {
        "SLURM_JOB_ID": job,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(nodes),
        "SLURM_NODEID": str(node),
        "SLURM_PROCID": str(node),
        "SLURM_NTASKS": str(nodes),
    }
    return env | extra


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (srun_env(0), dict(job_id="4242", hosts=("gpu07", "gpu08"), node_id=0, num_nodes=2, proc_id=0)),
        (srun_env(1), dict(node_id=1, proc_id=1)),
        (srun_env(1, SLURM_RESTART_COUNT="3"), dict(restart_count=3)),
        # Older SLURM sets SLURM_NNODES / SLURM_NODELIST only.
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_NODELIST": "a[1-4]",
                "SLURM_NNODES": "4",
                "SLURM_NODEID": "2",
                "SLURM_PROCID": "2",
                "SLURM_NTASKS": "4",
            },
            dict(hosts=("a1", "a2", "a3", "a4"), num_nodes=4, node_id=2),
        ),
        ({}, dict(job_id=None, hosts=(), node_id=0, num_nodes=1, in_slurm=False)),
        ({"SUBMITIT_LOCAL_JOB_ID": "999"}, dict(job_id="999", in_slurm=False)),
        # An sbatch shell without srun (no SLURM_PROCID) is not a task: treated as local.
        ({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n1"}, dict(in_slurm=False)),
    ],
)
def test_slurm_env_from_environ(env: dict, expected: dict) -> None:
    where = SlurmEnv.from_environ(env)
    for name, value in expected.items():
        assert getattr(where, name) == value, name


def test_from_environ_does_not_touch_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    before = dict(os.environ)
    SlurmEnv.from_environ(srun_env(1))
    assert dict(os.environ) == before


def test_every_node_of_a_two_node_job_gets_its_rank_and_the_first_host_as_master() -> None:
    plan = plan_for(
        "+cluster=a100x16", "model=qwen3-8b", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "strategy=zero3"
    )
    envs = [rank_env(SlurmEnv.from_environ(srun_env(n)), plan) for n in (0, 1)]
    assert [e["NODE_RANK"] for e in envs] == ["0", "1"]
    assert {e["MASTER_ADDR"] for e in envs} == {"gpu07"}
    assert {e["NNODES"] for e in envs} == {"2"}
    assert {e["NPROC_PER_NODE"] for e in envs} == {"8"}
    assert len({e["MASTER_PORT"] for e in envs}) == 1


def test_single_process_run_sets_no_torchrun_variables() -> None:
    assert rank_env(SlurmEnv.local({}), plan_for()) == {}


def test_single_process_deepspeed_run_is_started_by_torchrun() -> None:
    # Without torchrun's variables DeepSpeed discovers ranks through MPI, which aborts on a SLURM node whose
    # Open MPI has no PMI support (seen on an H200 node: ZeRO-3 on one GPU).
    plan = plan_for("strategy=zero3", "cluster.nodes=1", "cluster.cpu_procs_per_node=1")
    assert plan.topology.procs_per_node == 1 and "--deepspeed" in plan.swift_argv
    env = rank_env(SlurmEnv.from_environ(srun_env(0, nodes=1, nodelist="gpu07")), plan)
    assert env["NPROC_PER_NODE"] == "1" and "MASTER_PORT" in env


def test_master_port_differs_between_jobs_and_stays_in_range() -> None:
    ports = {master_port(str(job), 10000) for job in range(1000, 1100)}
    assert len(ports) == 100
    assert all(10000 <= p < 30000 for p in ports)
    assert master_port("123_4", 10000) == master_port("1234", 10000)  # array-style ids


def test_requeued_job_keeps_its_master_port() -> None:
    plan = plan_for("+cluster=local-slurm")
    first = rank_env(SlurmEnv.from_environ(srun_env(0)), plan)
    again = rank_env(SlurmEnv.from_environ(srun_env(0, SLURM_RESTART_COUNT="1")), plan)
    assert first["MASTER_PORT"] == again["MASTER_PORT"]


def test_allocation_with_other_node_count_is_refused_with_a_hint() -> None:
    plan = plan_for("+cluster=local-slurm")
    with pytest.raises(NodeError, match="--nodes=2"):
        check_allocation(SlurmEnv.from_environ(srun_env(0, nodes=3, nodelist="n[1-3]")), plan)


def test_more_than_one_task_per_node_is_refused() -> None:
    plan = plan_for("+cluster=local-slurm")
    where = SlurmEnv.from_environ(srun_env(0, SLURM_NTASKS="4"))
    with pytest.raises(NodeError, match="--ntasks-per-node=1"):
        check_allocation(where, plan)
