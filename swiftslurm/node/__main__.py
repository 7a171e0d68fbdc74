"""`python -m swiftslurm.node RUN_DIR`: what srun runs on every node (job.sbatch, sbatch/ templates).

The stop signals are taken over before anything else is imported: SLURM's warning can come while the wrapper is
still importing (seconds from a shared file system, or with many nodes starting on loaded cores), and an
unhandled SIGUSR2 or SIGTERM would kill it, so that no node records the stop."""

from __future__ import annotations

import sys

from swiftslurm.signals import SignalLog, ignore_from_now_on

USAGE = "takes one argument, the run dir. HINT: python -m swiftslurm.node RUN_DIR"


def main(argv: list[str] | None = None) -> int:
    signals = SignalLog()
    signals.install()  # until the node's work is done; then ignored, so a late signal cannot kill the process
    try:
        from swiftslurm.errors import SwiftSlurmError, report
        from swiftslurm.node.supervise import exit_code, run_node

        args = sys.argv[1:] if argv is None else argv
        if len(args) != 1:
            return report(USAGE)
        try:
            return exit_code(run_node(args[0], signals))
        except SwiftSlurmError as err:
            return report(err)
    finally:
        ignore_from_now_on()


if __name__ == "__main__":
    sys.exit(main())
