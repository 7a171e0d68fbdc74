"""Benchmark: from a preemption signal to the first resumed training step, on the local SLURM cluster.

    bash scripts/slurm-local.sh up
    .venv/bin/python bench/preemption.py [--repeats 3] [--run-root DIR]

Each repeat submits the tiny 2-node run (`+cluster=local-slurm swift.max_steps=200 swift.save_steps=100`),
waits until node 0 logs step 30 or later, sends `scancel --signal=USR2 JOB` (what SLURM sends ahead of a
preemption), waits for the requeued job to complete, and reads the run directory back:

    USR2 at the wrapper (attempt record `signals`)
      a1  -> checkpoint written    newest mtime of the files in checkpoint-N (ms-swift / Transformers)
      a2  -> checkpoint committed  manifest `committed_at` (swiftslurm: barrier, checksums, manifest)
      b1  -> trainer exited        mtime of logs/ATTEMPT/node0.json (ms-swift and torchrun shut down)
      b2  -> requeued              attempt record `end`, written just before `scontrol requeue` (swiftslurm)
      c1  -> job started again     sacct Start of the new run of the job (SLURM; whole seconds)
      c2  -> wrapper up            submitit's "Starting with JobEnvironment" (batch script, srun, Python)
      w   -> `swift` launched      next attempt record `start` (swiftslurm: imports, plan, resume point)
      d   -> ms-swift main         "Start time of running main" in node0.log (imports, torchrun, model)
      e   -> first resumed step    next attempt record `first_step_at` (data, trainer, checkpoint load)

The baseline starts the same `swift sft` command (same checkpoint, same two nodes, through plain
`srun`, without swiftslurm's wrapper) and times process start -> first step in its output, polled as
often as the wrapper polls (0.5 s); its ratio to the resumed attempt's d + e is what swiftslurm's launch
adds. Prints markdown tables of min / median / max over the repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run as a script from anywhere: swiftslurm is this checkout

from swiftslurm.node.checkpoint import MANIFEST  # noqa: E402
from swiftslurm.plan import JobPlan  # noqa: E402
from swiftslurm.render import swift_command  # noqa: E402

MAX_STEPS = 200
SIGNAL_AT_STEP = 30
POLL_S = 0.5  # as the wrapper's ProgressWatch polls (swiftslurm.node.supervise.POLL_S)
JOB_TIMEOUT_S = 900.0
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
_STEP = re.compile(r"'global_step/max_steps': '(\d+)/(\d+)'")
_SWIFT_MAIN = re.compile(r"Start time of running main: (\S+ \S+)")
_SUBMITIT_START = re.compile(r"submitit INFO \((\S+ \S+)\) - Starting with JobEnvironment")
_BASELINE_START = re.compile(r"\[bench\] start (\d+) ([\d.]+)")

PHASES = (
    ("a1", "USR2 -> checkpoint written (ms-swift saves)"),
    ("a2", "-> checkpoint committed (swiftslurm manifest)"),
    ("b1", "-> trainer exited (ms-swift, torchrun shut down)"),
    ("b2", "-> requeued (swiftslurm decides, `scontrol requeue`)"),
    ("c1", "-> job running again (SLURM requeue delay)"),
    ("c2", "-> wrapper Python up (batch script, srun, submitit)"),
    ("w", "-> `swift` launched (swiftslurm start-up)"),
    ("d", "-> ms-swift main (imports, torchrun, model load)"),
    ("e", "-> first resumed step (data, trainer, checkpoint load)"),
)
SUMS = (
    ("a", "save: USR2 -> committed", ("a1", "a2")),
    ("b", "commit -> requeue", ("b1", "b2")),
    ("c", "requeue -> wrapper up (SLURM)", ("c1", "c2")),
    ("total", "USR2 -> first resumed step", tuple(key for key, _ in PHASES)),
    ("a+b", "swiftslurm share as asked: save + requeue", ("a1", "a2", "b1", "b2")),
    ("own", "swiftslurm's own work: a2 + b2 + w", ("a2", "b2", "w")),
)


@dataclass(frozen=True)
class Repeat:
    """One preempted-and-resumed run: seconds per phase, and the baseline's start -> first step."""

    phases: dict[str, float]
    resumed_launch_s: float  # d + e: `swift` launched -> first resumed step, under the wrapper
    plain_launch_s: float  # the same command without swiftslurm
    stopped_at: int  # the step the signal saved
    job_id: str


# ---------------------------------------------------------------------------------------------
# Talking to SLURM and reading files
# ---------------------------------------------------------------------------------------------


def sh(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def job_state(job_id: str) -> str:
    out = sh(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", "State"]).split()
    return out[0] if out else "UNKNOWN"


def wait_for_state(job_id: str, timeout_s: float = JOB_TIMEOUT_S) -> str:
    """Poll sacct until the job is in a terminal state (a requeue is not one)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (state := job_state(job_id)) in TERMINAL:
            return state
        time.sleep(2)
    subprocess.run(["scancel", job_id], check=False)
    raise RuntimeError(f"job {job_id} still {job_state(job_id)} after {timeout_s:.0f} s (cancelled)")


def newest_step(log: Path) -> int:
    try:
        steps = _STEP.findall(log.read_text(errors="replace"))
    except FileNotFoundError:
        return 0
    return int(steps[-1][0]) if steps else 0


def wait_for_step(log: Path, step: int, timeout_s: float = JOB_TIMEOUT_S, poll_s: float = 0.1) -> float:
    """Wait until ``log`` shows a training step >= ``step``; return when it was seen."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if newest_step(log) >= step:
            return time.time()
        time.sleep(poll_s)
    raise RuntimeError(f"{log} showed no step >= {step} within {timeout_s:.0f} s")


def local_time(text: str, fmt: str | None = None) -> float:
    """A local-time timestamp as the logs print it -> seconds since the epoch."""
    parsed = datetime.strptime(text, fmt) if fmt else datetime.fromisoformat(text)
    return parsed.timestamp()


def last_match(pattern: re.Pattern[str], path: Path) -> re.Match[str]:
    matches = list(pattern.finditer(path.read_text(errors="replace")))
    if not matches:
        raise RuntimeError(f"{path} has no line matching {pattern.pattern!r}")
    return matches[-1]


def written_at(checkpoint: Path) -> float:
    """When the last file of a checkpoint (the manifest aside) was written."""
    return max(p.stat().st_mtime for p in checkpoint.rglob("*") if p.is_file() and p.name != MANIFEST)


def submitit_start(run_dir: Path, job_id: str) -> float:
    """When submitit's process on node 0 started this run of the job (its log is appended to per run)."""
    line = last_match(_SUBMITIT_START, run_dir / "submitit" / f"{job_id}_0_log.out")
    return local_time(line[1], "%Y-%m-%d %H:%M:%S,%f")


def slurm_start(job_id: str) -> float:
    """Start of the job's newest run (sacct lists one row per run with --duplicates)."""
    rows = sh(["sacct", "-j", job_id, "-X", "-D", "-n", "-P", "-o", "Start"]).split()
    return local_time(rows[-1])


# ---------------------------------------------------------------------------------------------
# One preempted run
# ---------------------------------------------------------------------------------------------


def submit(run_dir: Path) -> str:
    overrides = [f"swift.max_steps={MAX_STEPS}", "swift.save_steps=100"]
    argv = [sys.executable, "-m", "swiftslurm", "+cluster=local-slurm", f"run_dir={run_dir}", *overrides]
    done = subprocess.run(argv, cwd=run_dir.parent, capture_output=True, text=True, check=False)
    match = re.search(r"submitted job (\d+)", done.stdout)
    if done.returncode != 0 or not match:
        raise RuntimeError(f"submission failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return match.group(1)


def preempt_and_finish(run_dir: Path) -> str:
    """Submit, send USR2 once training is under way, wait for the requeued job to complete."""
    job_id = submit(run_dir)
    wait_for_step(run_dir / "logs" / job_id / "node0.log", SIGNAL_AT_STEP)
    sh(["scancel", "--signal=USR2", job_id])
    state = wait_for_state(job_id)
    if state != "COMPLETED":
        raise RuntimeError(f"job {job_id} ended {state}, not COMPLETED; see {run_dir}/logs")
    return job_id


def two_attempts(run_dir: Path) -> tuple[dict, dict]:
    """The preempted attempt and the one that resumed; anything else (another test's preemption of
    this job, a failure) makes the repeat unusable."""
    records = [json.loads(line) for line in (run_dir / "attempts.jsonl").read_text().splitlines()]
    shape = [(r["reason"], r["decision"]) for r in records]
    if shape != [("preempted", "requeue"), ("finished", "done")]:
        raise RuntimeError(f"expected one preemption then a finished attempt, got {shape}")
    return records[0], records[1]


def phases(run_dir: Path, job_id: str) -> tuple[dict[str, float], int]:
    """Timestamps along the path USR2 -> first resumed step, turned into seconds per phase."""
    stopped, resumed = two_attempts(run_dir)
    checkpoint = Path(resumed["resumed_from"])
    node0_log = run_dir / "logs" / resumed["attempt"] / "node0.log"
    times = [
        next(t for name, t in stopped["signals"] if name == "SIGUSR2"),
        written_at(checkpoint),
        json.loads((checkpoint / MANIFEST).read_text())["committed_at"],
        (run_dir / "logs" / stopped["attempt"] / "node0.json").stat().st_mtime,
        stopped["end"],
        slurm_start(job_id),
        submitit_start(run_dir, job_id),
        resumed["start"],
        local_time(last_match(_SWIFT_MAIN, node0_log)[1]),
        resumed["first_step_at"],
    ]
    spans = {key: later - earlier for (key, _), (earlier, later) in zip(PHASES, pairwise(times), strict=True)}
    return spans, resumed["resume_step"]


# ---------------------------------------------------------------------------------------------
# Baseline: the same `swift sft`, started by plain srun
# ---------------------------------------------------------------------------------------------

# Per node: the rank variables the wrapper would set, the process start, then the training command.
_BASELINE_SCRIPT = (
    'export NODE_RANK="$SLURM_NODEID" MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)" '
    'MASTER_PORT="$((10000 + SLURM_JOB_ID % 20000))"; '
    'echo "[bench] start $SLURM_JOB_ID $(date +%s.%N)"; exec "$@"'
)


def baseline_argv(plan: JobPlan, checkpoint: str, output_dir: Path) -> list[str]:
    """The resumed attempt's command, writing into ``output_dir`` instead of the run's output."""
    argv = swift_command(plan, ("--resume_from_checkpoint", checkpoint))
    argv[argv.index("--output_dir") + 1] = str(output_dir)
    return argv


def baseline_env(plan: JobPlan) -> dict[str, str]:
    topo = plan.topology
    return {"NNODES": str(topo.nodes), "NPROC_PER_NODE": str(topo.procs_per_node), **dict(plan.env)}


def srun_argv(plan: JobPlan, out_dir: Path) -> list[str]:
    spec = plan.slurm
    assert spec is not None  # local-slurm is a SLURM cluster
    return [
        "srun",
        f"--nodes={plan.topology.nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={spec.cpus_per_task or 1}",
        f"--partition={spec.partition}",
        "--job-name=bench-plain-swift",
        f"--output={out_dir}/node%t.log",
        "--unbuffered",
        "bash",
        "-c",
        _BASELINE_SCRIPT,
        "bash",
    ]


def plain_launch(run_dir: Path, checkpoint: str) -> float:
    """Seconds from the plain command's start on node 0 to the first step in its output."""
    plan = JobPlan.load(run_dir / "plan.json")
    out_dir = run_dir.parent / f"{run_dir.name}-plain"
    out_dir.mkdir()
    log = out_dir / "node0.log"
    argv = [*srun_argv(plan, out_dir), *baseline_argv(plan, checkpoint, out_dir / "output")]
    srun = subprocess.Popen(argv, env={**os.environ, **baseline_env(plan)}, cwd=out_dir)
    try:
        seen = wait_for_step(log, 1, poll_s=POLL_S)
    finally:
        started = _BASELINE_START.search(log.read_text(errors="replace")) if log.is_file() else None
        if started:
            subprocess.run(["scancel", started[1]], check=False)
        srun.wait(timeout=120)
    if not started:
        raise RuntimeError(f"{log} has no start line")
    return seen - float(started[2])


# ---------------------------------------------------------------------------------------------
# Repeats and report
# ---------------------------------------------------------------------------------------------


def one_repeat(run_root: Path) -> Repeat:
    # A fresh directory each time: an existing run dir would be resumed, not started.
    run_dir = Path(tempfile.mkdtemp(dir=run_root, prefix="run-")) / "run"
    job_id = preempt_and_finish(run_dir)
    spans, stopped_at = phases(run_dir, job_id)
    _, resumed = two_attempts(run_dir)
    plain = plain_launch(run_dir, resumed["resumed_from"])
    return Repeat(spans, spans["d"] + spans["e"], plain, stopped_at, job_id)


def describe(run: Repeat) -> str:
    spans = " ".join(f"{key}={value:.2f}" for key, value in run.phases.items())
    return (
        f"job {run.job_id}: stopped at step {run.stopped_at}; {spans}; "
        f"resumed launch {run.resumed_launch_s:.2f} s, plain {run.plain_launch_s:.2f} s"
    )


def stats_row(*labels: str, values: list[float]) -> str:
    low, mid, high = min(values), statistics.median(values), max(values)
    return f"| {' | '.join(labels)} | {low:.2f} | {mid:.2f} | {high:.2f} |"


def phase_table(runs: list[Repeat]) -> str:
    lines = ["| phase | from the previous mark to | min s | median s | max s |", "| --- | --- | ---: | ---: | ---: |"]
    lines += [stats_row(key, what, values=[r.phases[key] for r in runs]) for key, what in PHASES]
    lines += [
        stats_row(f"**{key}**", what, values=[sum(r.phases[p] for p in parts) for r in runs])
        for key, what, parts in SUMS
    ]
    return "\n".join(lines)


def baseline_table(runs: list[Repeat]) -> str:
    resumed = [r.resumed_launch_s for r in runs]
    plain = [r.plain_launch_s for r in runs]
    with_wrapper = [r.phases["w"] + r.resumed_launch_s for r in runs]
    ratio = statistics.median(resumed) / statistics.median(plain)
    ratio_wrapper = statistics.median(with_wrapper) / statistics.median(plain)
    return "\n".join(
        [
            "| start -> first step after resume | min s | median s | max s |",
            "| --- | ---: | ---: | ---: |",
            stats_row("plain `swift sft` via srun: process start", values=plain),
            stats_row("swiftslurm: `swift` launched (d + e)", values=resumed),
            stats_row("swiftslurm: wrapper up (w + d + e)", values=with_wrapper),
            "",
            f"ratio of medians, swiftslurm / plain: {ratio:.2f} (launch), {ratio_wrapper:.2f} (with wrapper start-up)",
        ]
    )


def run_repeats(run_root: Path, repeats: int) -> list[Repeat]:
    runs = []
    for index in range(repeats):
        try:
            run = one_repeat(run_root)
        except (RuntimeError, subprocess.CalledProcessError) as err:
            print(f"repeat {index}: unusable: {err}", flush=True)
            continue
        print(f"repeat {index}: {describe(run)}", flush=True)
        runs.append(run)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run-root", type=Path, help="where the run dirs go (default: a temp dir, removed after)")
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        sys.exit("no SLURM here: start the local cluster with `bash scripts/slurm-local.sh up`")
    run_root = args.run_root or Path(tempfile.mkdtemp(prefix="swiftslurm-preemption-"))
    run_root.mkdir(parents=True, exist_ok=True)
    print(f"run root: {run_root}", flush=True)
    runs = run_repeats(run_root.resolve(), args.repeats)
    if not runs:
        sys.exit(f"no usable repeat (run dirs kept in {run_root})")
    if args.run_root is None:
        shutil.rmtree(run_root, ignore_errors=True)
    print(f"\n{len(runs)} repeat(s), seconds\n\n{phase_table(runs)}\n\n{baseline_table(runs)}")


if __name__ == "__main__":
    main()
