"""Which of the local cluster's nodes this test process uses, so that several test processes share the cluster
without sharing a node.

`scripts/slurm-local.sh` with `SWIFTSLURM_SLURM_GROUPS=G` splits the nodes into G groups and gives group K the
partitions `debugK` and `urgentK` (beside `debug` and `urgent` on every node). A process whose
SWIFTSLURM_TEST_NODE_GROUP is K sends every job there: the runs it submits through the command line
(`with_partition`), and the plain sbatch calls of its tests (`partition`). Unset, everything goes to `debug`
and `urgent`, the whole cluster, as before.
"""

from __future__ import annotations

import os
import subprocess

from swiftslurm.slurm_env import expand_hostlist

NODE_GROUP_ENV = "SWIFTSLURM_TEST_NODE_GROUP"
LOCAL_CLUSTER = "+cluster=local-slurm"


def node_group() -> str:
    """This process's group ("1", "2", ...), or "" when it uses the whole cluster."""
    return os.environ.get(NODE_GROUP_ENV, "")


def partition(base: str = "debug") -> str:
    """The partition this process's jobs of kind ``base`` (debug: preemptible, urgent: preempts) go to."""
    return f"{base}{node_group()}"


def with_partition(args: tuple[str, ...]) -> tuple[str, ...]:
    """Command-line overrides with this process's partition right after `+cluster=local-slurm`, so that an
    override of the caller's own that comes later still wins."""
    if not node_group() or LOCAL_CLUSTER not in args:
        return args
    at = args.index(LOCAL_CLUSTER) + 1
    return (*args[:at], f"cluster.partition={partition()}", *args[at:])


def group_nodes() -> list[str]:
    """The nodes of this process's partition (all of them when it has no group), [] if SLURM has no such one."""
    out = subprocess.run(["sinfo", "-h", "-p", partition(), "-o", "%N"], capture_output=True, text=True)
    nodes = out.stdout.strip()
    return expand_hostlist(nodes) if out.returncode == 0 and nodes else []
