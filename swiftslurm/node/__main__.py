"""`python -m swiftslurm.node RUN_DIR`: what srun runs on every node (job.sbatch, sbatch/ templates)."""

from __future__ import annotations

import sys

from swiftslurm.errors import SwiftSlurmError
from swiftslurm.node.signals import SignalLog
from swiftslurm.node.supervise import exit_code, run_node


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m swiftslurm.node RUN_DIR", file=sys.stderr)
        return 2
    signals = SignalLog()
    signals.install()  # for the rest of the process: a late signal must not kill it by default action either
    try:
        return exit_code(run_node(args[0], signals))
    except SwiftSlurmError as err:
        print(f"swiftslurm: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
