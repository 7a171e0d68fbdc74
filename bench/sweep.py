"""Benchmark: submitting a 1000-point sweep as a job array, and rendering `status` for it.

    bash scripts/slurm-local.sh up && .venv/bin/python -m bench.sweep [--points 1000] [--repeats 3]

Each repeat, interleaved:
- swiftslurm: `python -m swiftslurm -m +cluster=local-slurm seed=range(0,N) array_parallelism=1 swift.max_steps=1`
  (swiftslurm's sweeper composes once, plans and validates each of the N points, writes N run directories,
  then one sbatch array); checked: SLURM lists N tasks of that array (`squeue -r`) before it is cancelled;
  baseline: the bare `sbatch --array=0-(N-1)%1 --wrap true` of the same size (SLURM's own floor).
- status: `python -m swiftslurm status SWEEP_DIR` (and `--json`) over the N points with SLURM asked (one
  squeue and one sacct for all jobs); baseline: those two SLURM calls alone, plus a bare interpreter start.
Arrays are cancelled right after submission (at most one task may start meanwhile). Prints medians and
ratios; writes bench/results/sweep-<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


CPU_S: list[float] = []  # CPU seconds (user + system) of each timed command, its worker processes included
SUBMIT_CPU_S: list[float] = []  # the sweep's: on a busy shared machine its wall time says more about the others


def timed(argv: list[str], cwd: Path) -> tuple[float, str]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env={**os.environ, "SWIFTSLURM_RUNS": "runs"})
    took = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_S.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return took, done.stdout


def submit_sweep(points: int, cwd: Path) -> tuple[float, Path, str]:
    argv = [sys.executable, "-m", "swiftslurm", "-m", "+cluster=local-slurm", f"seed=range(0,{points})"]
    took, out = timed([*argv, "array_parallelism=1", "swift.max_steps=1"], cwd)
    SUBMIT_CPU_S.append(CPU_S[-1])
    array = out.split("job array(s) ['")[1].split("'")[0]
    tasks = subprocess.run(["squeue", "-h", "-r", "-j", array, "-o", "%i"], capture_output=True, text=True, check=True)
    subprocess.run(["scancel", array], check=True)
    if len(tasks.stdout.split()) != points:  # the array SLURM holds is the sweep: every point a task
        raise SystemExit(f"array {array} has {len(tasks.stdout.split())} tasks in SLURM, not {points}")
    [sweep_dir] = (cwd / "runs" / "sweeps").iterdir()
    return took, sweep_dir, array


def bare_array(points: int, cwd: Path) -> float:
    took, out = timed(["sbatch", "--parsable", f"--array=0-{points - 1}%1", "-p", "debug", "--wrap", "true"], cwd)
    subprocess.run(["scancel", out.strip()], check=True)
    return took


def slurm_queries(job_ids: list[str], cwd: Path) -> float:
    ids = ",".join(job_ids)
    a, _ = timed(["squeue", "-h", "-j", ids, "-o", "%i %T"], cwd)
    b, _ = timed(["sacct", "-X", "-n", "-P", "-j", ids, "-o", "JobID,State"], cwd)
    c, _ = timed([sys.executable, "-c", "pass"], cwd)
    return a + b + c


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[float]] = {k: [] for k in ("submit", "sbatch_array", "status", "status_json", "slurm")}
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="swiftslurm-bench-sweep-") as tmp:
            cwd = Path(tmp)
            took, sweep_dir, _ = submit_sweep(args.points, cwd)
            times["submit"].append(took)
            times["sbatch_array"].append(bare_array(args.points, cwd))
            times["status"].append(timed([sys.executable, "-m", "swiftslurm", "status", str(sweep_dir)], cwd)[0])
            status_json = timed([sys.executable, "-m", "swiftslurm", "status", str(sweep_dir), "--json"], cwd)
            times["status_json"].append(status_json[0])
            report = json.loads(status_json[1])
            assert len(report["runs"]) == args.points, len(report["runs"])
            times["slurm"].append(slurm_queries([r["job_id"] for r in report["runs"]], cwd))
        print(f"repeat {repeat + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
        print(f"  submit used {SUBMIT_CPU_S[-1]:.2f} CPU s; load average {os.getloadavg()[0]:.1f}", flush=True)
    result = {
        "points": args.points,
        "repeats": args.repeats,
        "cores": os.cpu_count(),
        "load_average_1_5_15_min_at_end": os.getloadavg(),  # a shared machine: how busy it was
        "seconds": {k: summary(v) for k, v in times.items()},
        "submit_cpu_seconds": summary(SUBMIT_CPU_S),
        "ratios": {
            "submit / bare sbatch --array": statistics.median(times["submit"])
            / statistics.median(times["sbatch_array"]),
            "status / (squeue + sacct + python start)": statistics.median(times["status"])
            / statistics.median(times["slurm"]),
        },
        "per_point_ms": {
            "submit": 1000 * statistics.median(times["submit"]) / args.points,
            "status": 1000 * statistics.median(times["status"]) / args.points,
        },
    }
    out = REPO / "bench" / "results" / f"sweep-{time.strftime('%Y-%m-%d')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
