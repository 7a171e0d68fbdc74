"""`python -m swiftslurm.node RUN_DIR`: what srun runs on every node (job.sbatch, sbatch/ templates)."""

from __future__ import annotations

import sys

from swiftslurm.errors import SwiftSlurmError, report
from swiftslurm.node.supervise import exit_code, run_node
from swiftslurm.signals import SignalLog, ignore_from_now_on

USAGE = "takes one argument, the run dir. HINT: python -m swiftslurm.node RUN_DIR"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        return report(USAGE)
    signals = SignalLog()
    signals.install()  # until the node's work is done; then ignored, so a late signal cannot kill the process
    try:
        return exit_code(run_node(args[0], signals))
    except SwiftSlurmError as err:
        return report(err)
    finally:
        ignore_from_now_on()


if __name__ == "__main__":
    sys.exit(main())
