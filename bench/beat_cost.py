"""Benchmark: what global rank 0's heartbeat costs the training loop per step, written synchronously (each
`StepBeat.step_ended` returns once its beat is renamed into place) against the background writer the plugins use
(`StepBeat.from_environ`: the call hands the beat to a daemon thread, rundir/beat.py).

    .venv/bin/python -m bench.beat_cost [--calls 200] [--repeats 5] [--step-ms 20] [--slow-ms 5 50] [--dir DIR]

The training step is modelled as `time.sleep(--step-ms)` between two `step_ended` calls: the training thread
waits for the GPU and holds no GIL meanwhile, as a CUDA synchronize does. Each call is timed alone
(perf_counter_ns around `step_ended`). Two file systems:

  local   the real write (temp file, write, rename, no fsync) in --dir, by default a folder on the file system
          of this checkout.
  slow-N  the same write after a fixed sleep of N ms (each of --slow-ms) inside the write function: it stands
          for the metadata server round trips of a create and a rename on Lustre or NFS (5 ms), or a server
          stalled for longer than a step (50 ms, longer than the modelled step: the background writer then
          writes fewer beats than steps). It models their latency only, not a loaded server's own tail or
          contention (a longer tail widens the synchronous rows only).

Each (file system, mode) runs --repeats times, the modes alternating (A B, B A, ...), --calls calls each.
Reported per configuration: the mean cost of a call in each repeat, min / median / max over the repeats, and
over all calls of all repeats the median, p99 and max single call; for the background writer, how many beats
were written (the rest were replaced before their turn) and a check that the newest beat is on disk after
`flush`. Prints a markdown table and writes bench/results/beat-cost-DATE.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from swiftslurm.rundir.beat import StepBeat, read_beat, write_beat_file

REPO = Path(__file__).resolve().parents[1]
MODES = ("sync", "background")


def counting_writer(slow_s: float) -> tuple[Callable[[Path, dict[str, Any]], None], list[int]]:
    written: list[int] = []

    def write(path: Path, beat: dict[str, Any]) -> None:
        if slow_s:
            time.sleep(slow_s)
        write_beat_file(path, beat)
        written.append(beat["step"])

    return write, written


def one_run(folder: Path, mode: str, calls: int, step_s: float, slow_s: float) -> dict[str, Any]:
    path = folder / f"progress-{mode}.json"
    path.unlink(missing_ok=True)
    write, written = counting_writer(slow_s)
    beat = StepBeat(path, background=mode == "background", write_file=write)
    costs_ns: list[int] = []
    for step in range(1, calls + 1):
        time.sleep(step_s)  # the step itself: the training thread waits for the GPU
        started = time.perf_counter_ns()
        beat.step_ended(step, calls)
        costs_ns.append(time.perf_counter_ns() - started)
    flushed = beat.flush(timeout=60.0)
    on_disk = read_beat(path)
    return {
        "costs_ns": costs_ns,
        "written": len(written),
        "newest_on_disk": flushed and on_disk is not None and on_disk.step == calls,
        "in_order": written == sorted(written),
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    means_ms = [statistics.fmean(run["costs_ns"]) / 1e6 for run in runs]
    every_ms = sorted(cost / 1e6 for run in runs for cost in run["costs_ns"])
    return {
        "mean_per_call_ms": {"min": min(means_ms), "median": statistics.median(means_ms), "max": max(means_ms)},
        "single_call_ms": {
            "median": statistics.median(every_ms),
            "p99": every_ms[min(len(every_ms) - 1, round(0.99 * len(every_ms)))],
            "max": every_ms[-1],
        },
        "beats_written": [run["written"] for run in runs],
        "newest_on_disk": all(run["newest_on_disk"] for run in runs),
        "in_order": all(run["in_order"] for run in runs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200, help="step_ended calls per repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--step-ms", type=float, default=20.0, help="the modelled training step between calls")
    parser.add_argument("--slow-ms", type=float, nargs="*", default=[5.0, 50.0], help="delays added to each write")
    parser.add_argument("--dir", type=Path, default=REPO, help="where the temporary folder is made")
    parser.add_argument("--out", type=Path, help="the JSON results (default bench/results/beat-cost-DATE.json)")
    args = parser.parse_args()
    started = datetime.now()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".beat-cost-") as tmp:
        for fs, slow_s in (("local", 0.0), *((f"slow-{ms:g}", ms / 1000) for ms in args.slow_ms)):
            runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            for repeat in range(args.repeats):
                for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                    runs[mode].append(one_run(Path(tmp), mode, args.calls, args.step_ms / 1000, slow_s))
            results[fs] = {mode: summary(mode_runs) for mode, mode_runs in runs.items()}
    info = {
        "started": started.isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "dir_fs": args.dir.as_posix(),
        "args": {k: (v.as_posix() if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "results": results,
    }
    print(
        "| file system | mode | mean per call, min / median / max over repeats (ms) "
        "| single call median / p99 / max (ms) | beats written |"
    )
    print("| --- | --- | ---: | ---: | ---: |")
    for fs, modes in results.items():
        for mode, row in modes.items():
            mean, one = row["mean_per_call_ms"], row["single_call_ms"]
            print(
                f"| {fs} | {mode} | {mean['min']:.3f} / {mean['median']:.3f} / {mean['max']:.3f} "
                f"| {one['median']:.3f} / {one['p99']:.3f} / {one['max']:.3f} "
                f"| {min(row['beats_written'])}-{max(row['beats_written'])} of {args.calls} |"
            )
    checks = [row["newest_on_disk"] and row["in_order"] for modes in results.values() for row in modes.values()]
    print(f"newest beat on disk after flush, beats written in order: {all(checks)}")
    out = args.out or REPO / "bench" / "results" / f"beat-cost-{started:%Y-%m-%d}.json"
    out.write_text(json.dumps(info, indent=1) + "\n")
    print(f"written: {out}")


if __name__ == "__main__":
    main()
