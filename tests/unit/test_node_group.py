"""The cluster tier's processes each send their jobs to nodes of their own (swiftslurm/testing/node_group.py)."""

from __future__ import annotations

import pytest

from swiftslurm.testing.cli import command
from swiftslurm.testing.node_group import NODE_GROUP_ENV, partition, with_partition


def test_without_a_group_jobs_go_to_the_whole_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NODE_GROUP_ENV, raising=False)
    assert partition() == "debug" and partition("urgent") == "urgent"
    assert with_partition(("+cluster=local-slurm", "wait=true")) == ("+cluster=local-slurm", "wait=true")


def test_a_group_names_its_partitions_and_goes_right_after_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODE_GROUP_ENV, "2")
    assert partition() == "debug2" and partition("urgent") == "urgent2"
    args = ("model=x", "+cluster=local-slurm", "cluster.partition=mine")
    assert with_partition(args) == (
        "model=x",
        "+cluster=local-slurm",
        "cluster.partition=debug2",
        "cluster.partition=mine",
    )
    assert command("+cluster=local-slurm")[-2:] == ["+cluster=local-slurm", "cluster.partition=debug2"]


def test_a_group_leaves_other_commands_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(NODE_GROUP_ENV, "1")
    assert with_partition(("status", "/runs/a")) == ("status", "/runs/a")  # not a run on the local cluster
    assert with_partition(("run_dir=/r",)) == ("run_dir=/r",)  # the embedded default runs locally
