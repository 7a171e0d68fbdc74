"""`python -m swiftslurm.node.task_env PROGRAM [ARGS...]`: start PROGRAM with the per-task SLURM variables the
step's task lacks put back (``slurm_env.task_variables_by_host``: SLURM 22.05 leaves them out of an OCI
container's environment). container=oci starts each node's submitit runner, and so the wrapper, through it."""

from __future__ import annotations

import os
import socket
import sys

from swiftslurm.errors import SwiftSlurmError, report
from swiftslurm.slurm_env import slurm_hostnames, task_variables_by_host

USAGE = "takes the program to start and its arguments. HINT: python -m swiftslurm.node.task_env PYTHON -m ..."


def main(argv: list[str]) -> int:
    if not argv:
        return report(USAGE)
    try:
        restored = task_variables_by_host(os.environ, socket.gethostname(), slurm_hostnames)
    except SwiftSlurmError as err:
        return report(err)
    if changed := {k: v for k, v in restored.items() if os.environ.get(k) != v}:
        shown = " ".join(f"{k}={os.environ.get(k, '(unset)')}→{v}" for k, v in changed.items())
        print(f"[swiftslurm] this container task's SLURM variables, set from the node list: {shown}", flush=True)
    os.execvpe(argv[0], argv, {**os.environ, **restored})
    return 0  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
