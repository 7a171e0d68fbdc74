"""`python -m swiftslurm.submit.preflight` on the real 2-node SLURM cluster: it passes, and it fails with a clear
message when a node cannot reach the master port (a real routing rule in the nodes' network namespaces) or
cannot see the run directory (a tmpfs mounted over it in one node's own mount namespace)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts, status
from swiftslurm.testing.node_group import group_nodes
from swiftslurm.testing.nodes import slurmd_pid

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
BLOCKED_BASE = 20000  # a master port base no other test uses: only this test's jobs get ports it blocks
TIMEOUT = "preflight_timeout_s=20"


def preflight(run_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "swiftslurm.submit.preflight", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def prepare(tmp_path: Path, *overrides: str) -> Path:
    run_dir = tmp_path / "run"
    done = swiftslurm("+cluster=local-slurm", "dry_run=true", f"run_dir={run_dir}", TIMEOUT, *overrides, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return run_dir


def report(run_dir: Path) -> dict:
    (path,) = (run_dir / "preflight").glob("*/report.json")
    return json.loads(path.read_text())


def failures(data: dict) -> list[tuple[str, str]]:
    return [(n["host"], c["detail"]) for n in data["nodes"] for c in n["checks"] if not c["ok"]]


def last_job_id() -> int:
    ids = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
    ids += subprocess.run(["sacct", "-n", "-X", "-o", "JobID"], capture_output=True, text=True).stdout.split()
    return max((int(i.split("_")[0]) for i in ids if i.split("_")[0].isdigit()), default=0)


@contextlib.contextmanager
def master_ports_blocked(first: int, last: int) -> Iterator[None]:
    """In every node's network namespace, a policy-routing rule that refuses TCP to ports first..last (connect()
    fails with EACCES, as behind a firewall that rejects): a node reaches its own master port over its loopback
    routes (looked up before the rule), every other node cannot."""
    rule = ["ip", "rule", "add", "ipproto", "tcp", "dport", f"{first}-{last}", "prohibit"]
    namespaces = [Path(f"/run/netns/sslurm-{node}") for node in group_nodes()]
    added = []
    try:
        for ns in namespaces:
            subprocess.run(["nsenter", f"--net={ns}", *rule], check=True)
            added.append(ns)
        yield
    finally:
        for ns in added:
            subprocess.run(["nsenter", f"--net={ns}", "ip", "rule", "del", *rule[3:]], check=True)


@contextlib.contextmanager
def hidden_from(node: str, path: Path) -> Iterator[None]:
    """An empty tmpfs over `path` in `node`'s mount namespace only: that node sees its own empty directory, as
    with a run dir on a disk that node does not share."""
    pid = slurmd_pid(node)
    assert pid is not None, f"slurmd of {node} is not running"
    if os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt"):
        pytest.skip(
            f"slurmd of {node} shares the host's mount namespace (a cluster started before slurm-local.sh gave "
            "nodes their own): `bash scripts/slurm-local.sh restart` enables this test"
        )
    enter = ["nsenter", f"--target={pid}", "--mount", "--"]
    subprocess.run([*enter, "mount", "-t", "tmpfs", "-o", "size=16m", "swiftslurm-hidden", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run([*enter, "umount", str(path)], check=True)


def test_preflight_passes_on_two_nodes(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = prepare(tmp_path)
    done = preflight(run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "preflight passed on 2 node(s)" in done.stdout
    data = report(run_dir)
    assert data["ok"] and len(data["nodes"]) == 2 and len(data["hosts"]) == 2
    checks = {c["name"] for n in data["nodes"] for c in n["checks"]}
    for name in ("master port free", "master port reachable", "run dir visible", "run dir writable", "free disk"):
        assert name in checks
    assert "2 node(s), sum [3.0, 2.0] correct" in done.stdout


def test_preflight_fails_when_a_node_cannot_reach_the_master_port(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = prepare(tmp_path, f"cluster.master_port_base={BLOCKED_BASE}")
    first = BLOCKED_BASE + last_job_id() + 1  # the next jobs' ports: base + job id
    with master_ports_blocked(first, first + 199):
        done = preflight(run_dir)
    assert done.returncode == 1, done.stdout + done.stderr
    data = report(run_dir)
    master, peer = data["hosts"]
    port = int(data["master"].split(":")[1])
    assert first <= port <= first + 199
    assert "preflight FAILED" in done.stdout
    assert f"{peer}: cannot reach {master}:{port} (Permission denied" in done.stdout
    assert "HINT: open TCP from every node" in done.stdout
    assert any(h == peer and d.startswith(f"cannot reach {master}:{port}") for h, d in failures(data))
    assert any("not run" in d for _, d in failures(data))  # no all-reduce without every node


def test_preflight_fails_when_a_node_cannot_see_the_run_dir(tmp_path: Path, slurm_cluster: None) -> None:
    first, skipped, blind = group_nodes()[:3]
    run_dir = prepare(tmp_path, f"cluster.exclude={skipped}")  # the job runs on `first` (node 0) and `blind`
    with hidden_from(blind, run_dir):
        done = preflight(run_dir)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{blind}: cannot read {run_dir}/plan.json (No such file or directory): the run dir is not visible" in (
        done.stdout
    )
    assert "HINT: put run_dir on a filesystem every node mounts" in done.stdout
    found = failures(report(run_dir))
    assert {h for h, _ in found} == {blind}
    assert any(d.startswith(f"{first} cannot see ") and f"written by {blind}" in d for _, d in found)  # both ways


def test_preflight_as_first_step_stops_the_run_without_training(tmp_path: Path, slurm_cluster: None) -> None:
    """`preflight=true`: a failing check ends the job before training, recorded as the attempt's reason."""
    run_dir = tmp_path / "run"
    overrides = ("preflight=true", TIMEOUT, "preflight_min_free_gb=1000000", "wait=true")
    done = swiftslurm("+cluster=local-slurm", f"run_dir={run_dir}", *overrides, cwd=tmp_path, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    state = status(run_dir)
    assert state["state"] == "failed" and re.match(r"preflight failed: node\d: ", state["why"])
    assert "1000000.0 GB needed" in state["why"]
    (record,) = attempts(run_dir)
    assert record["decision"] == "stop" and record["preflight"] == "failed"
    assert not (run_dir / "output").exists() or not list((run_dir / "output").glob("checkpoint-*"))
    logs = swiftslurm("logs", str(run_dir), cwd=tmp_path)  # node 0 put its verdict where `logs` looks
    assert "] [swiftslurm] preflight FAILED (" in logs.stdout, logs.stdout + logs.stderr
