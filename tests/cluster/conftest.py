"""Integration fixtures: the real local SLURM cluster, and runs on it (helpers: swiftslurm.testing)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.node_group import NODE_GROUP_ENV, group_nodes, node_group, partition
from tests.conftest import REPO

LONG = ("swift.max_steps=120", "swift.save_steps=50")  # the run whose final adapter the resume tests compare
ADAPTER = "output/checkpoint-120/adapter_model.safetensors"
# The host side of scripts/slurm-local.sh's bridge: the nodes' network namespaces reach the host only there.
BRIDGE = os.environ.get("SWIFTSLURM_BRIDGE_IP", "10.77.0.1")
SHARED_ENV = "SWIFTSLURM_TEST_SHARED"  # a directory shared by the processes of one cluster tier run


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n G`, scripts/test.sh), worker gwK uses node group K+1 of a cluster started with
    SWIFTSLURM_SLURM_GROUPS=G: its jobs never share a node with another worker's (swiftslurm/testing/node_group.py)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and NODE_GROUP_ENV not in os.environ:
        os.environ[NODE_GROUP_ENV] = str(int(worker.removeprefix("gw")) + 1)


@pytest.fixture(scope="session")
def slurm_cluster() -> None:
    """The cluster from `scripts/slurm-local.sh up`. CI requires it; elsewhere its absence skips."""
    ok = (
        shutil.which("sinfo") is not None
        and subprocess.run(["bash", str(REPO / "scripts" / "slurm-local.sh"), "status"], capture_output=True).returncode
        == 0
    )
    if not ok:
        if os.environ.get("SWIFTSLURM_REQUIRE_SLURM") == "1":
            pytest.fail("the local SLURM cluster is not up: bash scripts/slurm-local.sh up")
        pytest.skip("no local SLURM cluster (bash scripts/slurm-local.sh up)")
    if node_group() and len(group_nodes()) < 3:
        pytest.fail(
            f"node group {node_group()} has no partition {partition()} of 3 nodes or more: start the cluster with "
            "SWIFTSLURM_SLURM_NODES=3G SWIFTSLURM_SLURM_GROUPS=G for `pytest -n G` (scripts/test.sh does)"
        )


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: None) -> bytes:
    """The final adapter of a LONG run that is never stopped (same seed, same settings): resumed runs must
    end with these very bytes. Trained once for all the processes of one tier run: the first to need it trains
    it, the others wait for its bytes (in SWIFTSLURM_TEST_SHARED, which scripts/test.sh sets for its cluster
    phases; else where pytest-xdist's workers of one session share their temporary directories)."""
    shared = shared_dir(tmp_path_factory)
    if shared is None:
        return train_uninterrupted(tmp_path_factory)
    saved = shared / "uninterrupted-adapter.safetensors"
    with open(shared / "uninterrupted.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or this process dies
        if not saved.exists():
            partial = saved.with_suffix(".partial")
            partial.write_bytes(train_uninterrupted(tmp_path_factory))
            partial.rename(saved)
        return saved.read_bytes()


def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """A directory that every process of this tier run sees, or None when this process is on its own."""
    if shared := os.environ.get(SHARED_ENV):
        return Path(shared)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return tmp_path_factory.getbasetemp().parent  # the session's, above each worker's own
    return None


def train_uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *LONG, cwd=run_dir.parent)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return (run_dir / ADAPTER).read_bytes()
