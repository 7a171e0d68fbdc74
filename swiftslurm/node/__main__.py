"""`python -m swiftslurm.node RUN_DIR`: what srun runs on every node (job.sbatch, sbatch/ templates)."""

from __future__ import annotations

import sys

from swiftslurm.errors import SwiftSlurmError
from swiftslurm.node.supervise import exit_code, run_node
from swiftslurm.signals import SignalLog, ignore_from_now_on


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        say("usage: python -m swiftslurm.node RUN_DIR")
        return 2
    signals = SignalLog()
    signals.install()  # until the node's work is done; then ignored, so a late signal cannot kill the process
    try:
        return exit_code(run_node(args[0], signals))
    except SwiftSlurmError as err:
        say(f"swiftslurm: {err}")
        return 2
    finally:
        ignore_from_now_on()


def say(line: str) -> None:
    """One line on stderr in one write: print() writes the text and its newline separately (stderr to a pipe is
    write-through), and `srun --unbuffered` forwards each write as it comes, so srun's own "srun: error: ..."
    could land between them, glued to this line."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
