"""Benchmark: wall time of a dry run (plan + render + print), against bare interpreter start-up.

    .venv/bin/python -m bench.dry_run [--repeats 5]

The target is "well under 2 s" (no ms-swift or torch import on the login side). Reports min/median/max
of each, interleaved, and the ratio of medians.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

DATASET = "dataset=[AI-ModelScope/alpaca-gpt4-data-en]"  # a real model names its data
DRY_RUN = ["-m", "swiftslurm", "+cluster=a100x16", "model=qwen3-8b", "strategy=zero3", DATASET, "dry_run=true"]
BASELINE = ["-c", "pass"]


def timed(args: list[str], cwd: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, *args], cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    runs: dict[str, list[float]] = {"dry run": [], "python -c pass": []}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(repeats):  # interleaved, so load on a shared machine hits both alike
            runs["dry run"].append(timed(DRY_RUN, cwd))
            runs["python -c pass"].append(timed(BASELINE, cwd))
    for name, values in runs.items():
        print(f"{name:16s} min {min(values):.3f} s  median {statistics.median(values):.3f} s  max {max(values):.3f} s")
    ratio = statistics.median(runs["dry run"]) / statistics.median(runs["python -c pass"])
    print(f"dry run / interpreter start-up (medians): {ratio:.1f}x")


if __name__ == "__main__":
    main()
