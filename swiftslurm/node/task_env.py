"""`python -m swiftslurm.node.task_env PROGRAM [ARGS...]`: start PROGRAM with the per-task SLURM variables the
step's task lacks put back (``slurm_env.task_variables_by_host``: SLURM 22.05 leaves them out of an OCI
container's environment). container=oci starts each node's submitit runner, and so the wrapper, through it."""

from __future__ import annotations

import os
import socket
import sys

from swiftslurm.errors import NodeError
from swiftslurm.slurm_env import slurm_hostnames, task_variables_by_host


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m swiftslurm.node.task_env PROGRAM [ARGS...]")
    try:
        restored = task_variables_by_host(os.environ, socket.gethostname(), slurm_hostnames)
    except NodeError as err:
        sys.exit(f"swiftslurm: {err}")
    if changed := {k: v for k, v in restored.items() if os.environ.get(k) != v}:
        shown = " ".join(f"{k}={os.environ.get(k, '(unset)')}→{v}" for k, v in changed.items())
        print(f"[swiftslurm] this container task's SLURM variables, set from the node list: {shown}", flush=True)
    os.execvpe(argv[0], argv, {**os.environ, **restored})


if __name__ == "__main__":
    main(sys.argv[1:])
