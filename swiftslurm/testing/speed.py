"""How much slower this machine is right now than the one the test tiers' budgets were measured on.

The tiers' time budgets (scripts/test.sh) catch a suite that grows; on a shared machine they also caught a
machine that was slower that hour (CI ran the unchanged unit tier in 212 s against 75-120 s). So the budgets
are ratios to a baseline measured in the same run, as benchmarks are: before the tiers, scripts/test.sh times
the work that dominates them (a fresh interpreter importing ms-swift's training entry point, what every rank,
`swift` and torchrun process of the cluster tier does first) and scales every budget by how much longer it took
than on the reference machine, never below 1.

    python -m swiftslurm.testing.speed     # prints SWIFTSLURM_MACHINE_SLOWDOWN=<ratio>, then a line saying why
"""

from __future__ import annotations

import subprocess
import sys
import time

# The reference: the fastest of RUNS imports on the 2-core machine with nothing else running (2026-12-03),
# the machine on which the budgets in scripts/test.sh were set.
REFERENCE_S = 5.5
RUNS = 3
WORKLOAD = "from swift import sft_main"


def import_seconds(runs: int = RUNS) -> float:
    """The fastest wall-clock time of `runs` fresh interpreters importing ms-swift's training entry point:
    the fastest, so a moment of other work does not count, while a machine slow throughout does."""
    times = []
    for _ in range(runs):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", WORKLOAD], check=True, capture_output=True)
        times.append(time.monotonic() - start)
    return min(times)


def slowdown(seconds: float, reference_s: float = REFERENCE_S) -> float:
    """The factor the budgets are multiplied by: never below 1 (a faster machine keeps the budgets as set)."""
    return max(1.0, round(seconds / reference_s, 2))


def main() -> None:
    took = import_seconds()
    factor = slowdown(took)
    print(f"SWIFTSLURM_MACHINE_SLOWDOWN={factor}")
    print(
        f"machine speed: importing ms-swift took {took:.1f} s (reference {REFERENCE_S:.1f} s): "
        f"every tier's budget x {factor}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
