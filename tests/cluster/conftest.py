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


# The tier's longest tests, slowest first, as measured on 2026-12-03 and 2026-12-07 (two processes): each process starts
# with its share of them, so that neither is left running one of them alone at the end. pytest-xdist hands each
# process a contiguous part of the collection and steals from the ends of those parts; a test not named here keeps
# its collection order after these. Only the order changes, never what runs.
LONGEST_FIRST = (
    "test_soak_smoke.py::test_the_soak_judges_a_run_through_an_s3_outage_a_frozen_controller_and_a_last_save_signal",
    "test_resilience.py::test_run_longer_than_its_time_limit_finishes_over_several_attempts",
    "test_resilience.py::test_several_preemptions_in_a_row_still_end_identical",
    "test_rlhf.py::test_rlhf_preempted_mid_run_resumes_and_ends_identical[grpo]",
    "test_hangs.py::test_a_rank_blocked_in_a_collective_is_found_within_its_window_with_every_ranks_stacks",
    "test_shrink.py::test_a_lost_node_resumes_on_two_with_the_same_global_batch[strategy=ddp]",
    "test_operations.py::test_cancel_stops_a_running_run_for_good_and_status_works_without_slurm",
    "test_signals.py::test_a_signal_during_the_upload_drain_cuts_it_to_slurms_end_time",
    "test_faults.py::test_kill_9_at_random_moments_always_resumes_from_a_committed_checkpoint",
    "test_shrink.py::test_a_lost_node_resumes_on_two_with_the_same_global_batch[strategy=zero2]",
    "test_goodput.py::test_a_run_preempted_twice_accounts_for_every_allocated_second",
    "test_pace_and_blame.py::test_steps_logged_further_apart_than_the_ceiling_and_a_long_first_save_are_not_a_hang",
    "test_resume_data.py::test_a_streamed_run_preempted_mid_training_ends_identical_to_one_never_stopped",
    "test_operations.py::test_sweep_returns_at_once_requeues_only_the_preempted_point_and_completes",
    "test_rlhf.py::test_rlhf_preempted_mid_run_resumes_and_ends_identical[dpo]",
    "test_faults.py::test_lost_node_is_excluded_and_the_run_finishes_on_the_others",
    "test_rank_children.py::test_a_preempted_run_with_data_loader_workers_saves_at_its_step_and_loses_none[fork]",
    "test_straggler_swap.py::test_a_straggler_is_swapped_for_the_spare_inside_the_same_job",
    "test_spares.py::test_a_lost_training_node_is_replaced_by_the_spare_inside_the_same_job",
)


@pytest.hookimpl(trylast=True)  # after `-m` has deselected what this run leaves out
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, order the collection so that each process's contiguous part begins with its share of
    LONGEST_FIRST (dealt round-robin, longest first)."""
    processes = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if processes < 2:
        return
    items[:] = longest_first_lanes(items, processes)


def longest_first_lanes(items: list[pytest.Item], processes: int) -> list[pytest.Item]:
    """The items as `processes` lanes laid end to end, the shortest lane first (xdist gives its first process
    len // processes items): the known longest tests dealt round-robin, then the others in collection order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    known = sorted((item for item in items if short_id(item) in rank), key=lambda item: rank[short_id(item)])
    ordered = known + [item for item in items if short_id(item) not in rank]
    lanes = [ordered[lane::processes] for lane in range(processes)]
    return [item for lane in sorted(lanes, key=len) for item in lane]


def short_id(item: pytest.Item) -> str:
    return item.nodeid.rpartition("/")[2]


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
