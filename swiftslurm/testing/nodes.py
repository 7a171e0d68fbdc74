"""Losing a node of the local cluster (scripts/slurm-local.sh) as if it lost power, and bringing it back."""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
from pathlib import Path

from swiftslurm.testing.cluster import alive, kill_9, wait_until

REPO = Path(__file__).resolve().parents[2]
NODE_READY = {"idle", "mixed", "allocated", "completing"}


def cluster_state_dir() -> Path:
    """Where scripts/slurm-local.sh keeps the cluster's state (pids/, log/)."""
    env = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-local.sh"), "env"], capture_output=True, text=True
    ).stdout
    found = re.search(r"^SWIFTSLURM_SLURM_STATE=(\S+)$", env, re.MULTILINE)
    return Path(found.group(1) if found else "/tmp/swiftslurm-slurm")


def slurmd_pid(node: str) -> int | None:
    """The PID of `slurmd -D -N NODE` (how scripts/slurm-local.sh starts each node's daemon)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
                if Path(argv[0]).name == "slurmd" and argv[1:4] == ["-D", "-N", node] and alive(int(entry.name)):
                    return int(entry.name)
    return None


def namespace_pids(node: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", f"sslurm-{node}"], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def node_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-p", "debug", "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def other_jobs_on(node: str, job_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-w", node, "-o", "%i"], capture_output=True, text=True).stdout
    return [j for j in out.split() if j != job_id]


def lose_node(node: str) -> None:
    """As if the node lost power: kill -9 its slurmd, then everything in its network namespace (slurmstepd,
    the wrapper, swift, torchrun, the worker), until nothing is left there."""
    daemon = slurmd_pid(node)
    assert daemon is not None, f"slurmd of {node} is not running"
    kill_9([daemon])
    for _ in range(50):
        left = [pid for pid in namespace_pids(node) if alive(pid)]
        if not left:
            return
        kill_9(left)
        time.sleep(0.2)
    raise AssertionError(f"processes in {node}'s namespace survive kill -9: {left}")


def slurmd_command(node: str) -> list[str]:
    """scripts/slurm-local.sh's start_slurmd: the node's network namespace, a UTS namespace named after it, and a
    mount namespace of its own (a slave of the host's), so a node restored by a test keeps its own mounts."""
    unshare = ["unshare", "--uts", "--mount", "--propagation", "slave", "--"]
    namespace = ["nsenter", f"--net=/run/netns/sslurm-{node}", "--", *unshare]
    return [*namespace, "sh", "-c", 'hostname "$1" && exec slurmd -D -N "$1"', "sh", node]


def restore_node(node: str, state_dir: Path) -> None:
    """Start the node's slurmd again as scripts/slurm-local.sh's start_slurmd does, record its PID where the
    script's status/up look for it, and return the node to service."""
    if slurmd_pid(node) is None:
        with open(state_dir / "log" / f"slurmd-{node}.out", "ab") as out:
            daemon = subprocess.Popen(
                slurmd_command(node),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=state_dir,
            )
        # nsenter, unshare and sh all exec: the PID is slurmd's, as `start_daemon` records it.
        (state_dir / "pids" / f"slurmd-{node}.pid").write_text(f"{daemon.pid} slurmd\n")
        wait_until(lambda: slurmd_pid(node) == daemon.pid, 30, f"slurmd of {node} to start")
    # ReturnToService=2 brings it back once slurmd registers; RESUME only if it stays down or drained.
    with contextlib.suppress(AssertionError):
        wait_until(lambda: node_state(node) in NODE_READY, 30, f"{node} back in service", poll_s=1)
    if node_state(node) not in NODE_READY:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
    wait_until(lambda: node_state(node) in NODE_READY, 120, f"{node} back in service (sinfo: {node_state(node)})")


def excluded_nodes(job_id: str) -> str:
    """The job's ExcNodeList, as the wrapper set it when it requeued (scontrol show job), for the record."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    found = re.search(r"\bExcNodeList=(\S+)", out)
    return found.group(1) if found else "?"
