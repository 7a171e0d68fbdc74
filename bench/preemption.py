"""Benchmark: from a preemption signal (or a killed rank) to the first resumed training step, on the local
SLURM cluster.

    bash scripts/slurm-local.sh up
    .venv/bin/python -m bench.preemption [--repeats 3] [--run-root DIR] [--kill-repeats 3]

Each repeat submits the tiny 2-node run (`+cluster=local-slurm swift.max_steps=200 swift.save_steps=100`),
waits until node 0 logs step 30 or later, sends `scancel --signal=USR2 JOB` (what SLURM sends ahead of a
preemption), waits for the requeued job to complete, and reads the run directory back:

    USR2 at the wrapper (attempt record `signals`)
      a1  -> checkpoint written    newest mtime of the files in checkpoint-N (ms-swift / Transformers)
      a2  -> checkpoint committed  manifest `committed_at` (swiftslurm: barrier, checksums, manifest)
      b1  -> trainer ended         mtime of logs/ATTEMPT/node0.json (the wrapper ends it at the commit)
      b2  -> requeued              attempt record `end`, written just before `scontrol requeue` (swiftslurm)
      c1  -> old run ended         slurmctld.log "Requeuing JobId=N" (the wrapper exits once SLURM accepted)
      c2  -> job allocated again   slurmctld.log "Allocate JobId=N" or backfill's "Started JobId=N" (requeue delay)
      c3  -> wrapper up            submitit's "Starting with JobEnvironment" (batch script, srun, Python)
      w   -> `swift` launched      next attempt record `start` (swiftslurm: imports, plan, resume point)
      d   -> ms-swift main         "Start time of running main" in node0.log (imports, torchrun, model)
      e   -> first resumed step    next attempt record `first_step_at` (data, trainer, checkpoint load)

The baseline starts the same `swift sft` command (same checkpoint, same two nodes, through plain
`srun`, without swiftslurm's wrapper) and times process start -> first step in its output, polled as
often as the wrapper polls (0.5 s), split at ms-swift's main into d and e like the resumed attempt; the
ratio of the two is what launching under swiftslurm adds. Prints markdown tables of min / median / max
over the repeats. swiftslurm's own share is a2 + b1 + b2 + c1 + w: everything but the save (a1), SLURM's
requeue delay (c2), SLURM's and submitit's launch of the wrapper (c3) and ms-swift's start-up (d, e).

A failure instead of a preemption (--kill-repeats): each repeat kills rank 1's training process with
SIGKILL once node 0 logs step 30, with both nodes alive, twice: once as configured (restart in place inside
the job) and once with `resilience.max_restarts=0 resilience.backoff_base_s=0` (the requeue path, no
back-off), and times kill -> decided (attempt record `end`) -> `swift` launched (next record `start`) ->
ms-swift main -> first resumed step.
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
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import MANIFEST
from swiftslurm.plan import JobPlan
from swiftslurm.render import swift_command
from swiftslurm.testing.cluster import TERMINAL, attempts, job_state, preempt, wait_for_job, wait_until
from swiftslurm.testing.cluster import submit as submit_run

REPO = Path(__file__).resolve().parents[1]

MAX_STEPS = 200
SIGNAL_AT_STEP = 30
POLL_S = 0.5  # as the wrapper's ProgressWatch polls (swiftslurm.node.watch.POLL_S)
JOB_TIMEOUT_S = 900.0
# A repeat that cannot be measured: the harness's failed waits and asserts (AssertionError subclasses), this
# file's own shape checks (RuntimeError), a SLURM command that failed.
UNUSABLE = (AssertionError, RuntimeError, subprocess.SubprocessError)
ENDED_CHECK_S = 2.0  # how often to ask SLURM whether a run ended early (sacct is slow)
_STEP = re.compile(r"'global_step/max_steps': '(\d+)/(\d+)'")
_SWIFT_MAIN = re.compile(r"Start time of running main: (\S+ \S+)")
_SUBMITIT_START = re.compile(r"submitit INFO \((\S+ \S+)\) - Starting with JobEnvironment")
_BASELINE_START = re.compile(r"\[bench\] start (\d+) ([\d.]+)")
_CTLD_LINE = r"^\[(\S+)\] (?:\S+ )*?(?:{what}) JobId={job}\b"
_CTLD_REQUEUED = "Requeuing"
_CTLD_ALLOCATED = "sched: Allocate|_start_job: Started"  # main scheduler | backfill

PHASES = (
    ("a1", "USR2 -> checkpoint written (ms-swift saves)"),
    ("a2", "-> checkpoint committed (swiftslurm manifest)"),
    ("b1", "-> trainer ended (swiftslurm ends it at the commit)"),
    ("b2", "-> requeued (swiftslurm decides, `scontrol requeue`)"),
    ("c1", "-> old run ended (the wrapper exits at the requeue)"),
    ("c2", "-> job allocated again (SLURM requeue delay)"),
    ("c3", "-> wrapper Python up (batch script, srun, submitit)"),
    ("w", "-> `swift` launched (swiftslurm start-up)"),
    ("d", "-> ms-swift main (imports, torchrun, model load)"),
    ("e", "-> first resumed step (data, trainer, checkpoint load)"),
)
SUMS = (
    ("a", "save: USR2 -> committed", ("a1", "a2")),
    ("b", "commit -> requeue", ("b1", "b2")),
    ("c", "requeue -> wrapper up (SLURM)", ("c1", "c2", "c3")),
    ("total", "USR2 -> first resumed step", tuple(key for key, _ in PHASES)),
    ("a+b", "USR2 -> requeued", ("a1", "a2", "b1", "b2")),
    ("own", "swiftslurm's share: a2 + b1 + b2 + c1 + w", ("a2", "b1", "b2", "c1", "w")),
    ("own+c3", "the same plus batch script, srun, submitit start-up", ("a2", "b1", "b2", "c1", "c3", "w")),
)
KILL_PHASES = (
    ("k1", "kill -9 rank 1 -> decided (attempt record `end`)"),
    ("k2", "-> `swift` launched (next attempt's `start`)"),
    ("d", "-> ms-swift main (imports, torchrun, model load)"),
    ("e", "-> first resumed step (data, trainer, checkpoint load)"),
)
KILL_PATHS = {  # name -> extra overrides
    "restart in place": (),
    "requeue (max_restarts=0)": ("resilience.max_restarts=0", "resilience.backoff_base_s=0"),
}


@dataclass(frozen=True)
class Repeat:
    """One preempted-and-resumed run: seconds per phase, and the baseline's d and e."""

    phases: dict[str, float]
    plain: dict[str, float] | None  # the same command without swiftslurm: "d" (start -> main), "e" (-> step)
    stopped_at: int  # the step the signal saved
    job_id: str


# ---------------------------------------------------------------------------------------------
# Talking to SLURM and reading files
# ---------------------------------------------------------------------------------------------


def sh(argv: list[str]) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def newest_step(log: Path) -> int:
    try:
        steps = _STEP.findall(log.read_text(errors="replace"))
    except FileNotFoundError:
        return 0
    return int(steps[-1][0]) if steps else 0


def wait_for_step(log: Path, step: int, over: Callable[[], str | None], poll_s: float = 0.1) -> float:
    """Wait until ``log`` shows a training step >= ``step``; return when it was seen. ``over()`` says why the
    step will never come (on this shared cluster other jobs preempt or kill ours now and then)."""

    def seen() -> float | None:
        return time.time() if newest_step(log) >= step else None

    return wait_until(seen, JOB_TIMEOUT_S, f"step {step} in {log}", poll_s=poll_s, over=over)


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


def slurmctld_log() -> Path:
    config = sh(["scontrol", "show", "config"])
    match = re.search(r"^SlurmctldLogFile\s*=\s*(\S+)", config, re.MULTILINE)
    if not match or not Path(match[1]).is_file():
        raise RuntimeError("slurmctld's log file is not readable here (needed for the requeue timestamps)")
    return Path(match[1])


def slurmctld_times(job_id: str, what: str) -> list[float]:
    """When slurmctld logged ``what`` (a regex alternative) for the job, in order (millisecond stamps)."""
    pattern = re.compile(_CTLD_LINE.format(what=what, job=job_id), re.MULTILINE)
    return [local_time(m[1]) for m in pattern.finditer(slurmctld_log().read_text(errors="replace"))]


def requeue_marks(job_id: str) -> tuple[float, float]:
    """(the requeued run ended, the job was allocated nodes again)."""
    requeued = slurmctld_times(job_id, _CTLD_REQUEUED)
    allocated = [t for t in slurmctld_times(job_id, _CTLD_ALLOCATED) if requeued and t > requeued[-1]]
    if not allocated:
        raise RuntimeError(f"slurmctld's log shows no requeue of job {job_id} followed by a new allocation")
    return requeued[-1], allocated[0]


# ---------------------------------------------------------------------------------------------
# One preempted run
# ---------------------------------------------------------------------------------------------


def submit(run_dir: Path, *extra: str) -> str:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    return submit_run(run_dir, f"swift.max_steps={MAX_STEPS}", "swift.save_steps=100", *extra)


def ended_early(run_dir: Path, job_id: str) -> Callable[[], str | None]:
    """Other jobs may preempt this one first (then a record appears) or kill its node (the job fails). SLURM
    is asked at most every ENDED_CHECK_S (sacct is slow; the step is polled far more often)."""
    asked_at = -ENDED_CHECK_S

    def why() -> str | None:
        nonlocal asked_at
        if (run_dir / "attempts.jsonl").exists():
            return "the run has an attempt record already (stopped by something else?)"
        if time.monotonic() - asked_at < ENDED_CHECK_S:
            return None
        asked_at = time.monotonic()
        state = job_state(job_id)
        return f"job {job_id} is {state}" if state in TERMINAL else None

    return why


def completed(job_id: str, run_dir: Path) -> None:
    state = wait_for_job(job_id, timeout_s=JOB_TIMEOUT_S)
    if state != "COMPLETED":
        raise RuntimeError(f"job {job_id} ended {state}, not COMPLETED; see {run_dir}/logs")


def preempt_and_finish(run_dir: Path) -> str:
    """Submit, send USR2 once training is under way, wait for the requeued job to complete."""
    job_id = submit(run_dir)
    try:
        wait_for_step(run_dir / "logs" / job_id / "node0.log", SIGNAL_AT_STEP, ended_early(run_dir, job_id))
    except UNUSABLE:
        subprocess.run(["scancel", job_id], check=False)  # a spoilt repeat must not hold the cluster
        raise
    preempt(job_id)
    completed(job_id, run_dir)
    return job_id


def two_attempts(run_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """The preempted attempt and the one that resumed; anything else (another test's preemption of
    this job, a failure) makes the repeat unusable."""
    records = attempts(run_dir)
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
        *requeue_marks(job_id),
        submitit_start(run_dir, job_id),
        resumed["start"],
        local_time(last_match(_SWIFT_MAIN, node0_log)[1]),
        resumed["first_step_at"],
    ]
    spans = {key: later - earlier for (key, _), (earlier, later) in zip(PHASES, pairwise(times), strict=True)}
    return spans, resumed["resume_step"]


# ---------------------------------------------------------------------------------------------
# A killed rank: restart in place vs requeue
# ---------------------------------------------------------------------------------------------


def rank_pid(run_dir: Path, rank: int) -> int | None:
    """The PID of the run's ms-swift training process of ``rank`` (its command line names sft.py and the
    run's output dir; its environment, RANK)."""
    output = str(run_dir / "output")
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if not any(a.endswith("swift/cli/sft.py") for a in argv[1:3]) or output not in argv:
                continue
            env = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if f"RANK={rank}" in env:
            return int(entry.name)
    return None


def kill_and_finish(run_dir: Path, extra: tuple[str, ...]) -> tuple[str, float]:
    """Submit, kill -9 rank 1 once node 0 logs step SIGNAL_AT_STEP, wait for the job to complete; return the
    job id and when the kill was sent."""
    job_id = submit(run_dir, *extra)
    try:
        wait_for_step(run_dir / "logs" / job_id / "node0.log", SIGNAL_AT_STEP, ended_early(run_dir, job_id))
        pid = rank_pid(run_dir, 1)
        if pid is None:
            raise RuntimeError("rank 1's training process was not found")
        killed_at = time.time()
        os.kill(pid, 9)
    except (*UNUSABLE, OSError):
        subprocess.run(["scancel", job_id], check=False)
        raise
    completed(job_id, run_dir)
    return job_id, killed_at


def kill_phases(run_dir: Path, killed_at: float, decision: str) -> dict[str, float]:
    records = attempts(run_dir)
    shape = [(r["reason"], r["decision"]) for r in records]
    if shape != [("infra", decision), ("finished", "done")]:
        raise RuntimeError(f"expected one {decision} then a finished attempt, got {shape}")
    killed, resumed = records
    node0_log = run_dir / "logs" / resumed["attempt"] / "node0.log"
    times = [
        killed_at,
        killed["end"],
        resumed["start"],
        local_time(last_match(_SWIFT_MAIN, node0_log)[1]),
        resumed["first_step_at"],
    ]
    return {key: later - earlier for (key, _), (earlier, later) in zip(KILL_PHASES, pairwise(times), strict=True)}


def kill_repeats(run_root: Path, repeats: int) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in KILL_PATHS}
    for index in range(repeats):
        for name, extra in KILL_PATHS.items():
            run_dir = Path(tempfile.mkdtemp(dir=run_root, prefix="kill-")) / "run"
            try:
                job_id, killed_at = kill_and_finish(run_dir, extra)
                spans = kill_phases(run_dir, killed_at, "requeue" if extra else "restart")
            except UNUSABLE as err:
                print(f"kill repeat {index} ({name}): unusable: {err}", flush=True)
                continue
            shown = " ".join(f"{key}={value:.2f}" for key, value in spans.items())
            print(f"kill repeat {index} ({name}): job {job_id}: {shown}", flush=True)
            runs[name].append(spans)
    return runs


def kill_table(runs: dict[str, list[dict[str, float]]]) -> str:
    lines = ["| path | phase | from the previous mark to | min s | median s | max s |"]
    lines.append("| --- | --- | --- | ---: | ---: | ---: |")
    for name, spans in runs.items():
        if not spans:
            continue
        lines += [stats_row(name, key, what, values=[s[key] for s in spans]) for key, what in KILL_PHASES]
        lines.append(
            stats_row(name, "**total**", "kill -> first resumed step", values=[sum(s.values()) for s in spans])
        )
    return "\n".join(lines)


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


def plain_launch(run_dir: Path, checkpoint: str) -> dict[str, float]:
    """The plain command on node 0: start -> ms-swift main (d) -> first step in its output (e)."""
    plan = JobPlan.load(run_dir / "plan.json")
    out_dir = run_dir.parent / f"{run_dir.name}-plain"
    out_dir.mkdir()
    log = out_dir / "node0.log"
    argv = [*srun_argv(plan, out_dir), *baseline_argv(plan, checkpoint, out_dir / "output")]
    with open(out_dir / "srun.err", "wb") as srun_err:  # srun's own notes when the job is cancelled
        srun = subprocess.Popen(argv, env={**os.environ, **baseline_env(plan)}, cwd=out_dir, stderr=srun_err)
    try:
        first_step = wait_for_step(log, 1, lambda: "srun ended" if srun.poll() is not None else None, poll_s=POLL_S)
    finally:
        started = _BASELINE_START.search(log.read_text(errors="replace")) if log.is_file() else None
        if started:
            subprocess.run(["scancel", started[1]], check=False)
        srun.wait(timeout=120)
    if not started:
        raise RuntimeError(f"{log} has no start line")
    main_at = local_time(last_match(_SWIFT_MAIN, log)[1])
    return {"d": main_at - float(started[2]), "e": first_step - main_at}


# ---------------------------------------------------------------------------------------------
# Repeats and report
# ---------------------------------------------------------------------------------------------


def one_repeat(run_root: Path) -> Repeat:
    # A fresh directory each time: an existing run dir would be resumed, not started.
    run_dir = Path(tempfile.mkdtemp(dir=run_root, prefix="run-")) / "run"
    job_id = preempt_and_finish(run_dir)
    spans, stopped_at = phases(run_dir, job_id)
    _, resumed = two_attempts(run_dir)
    try:
        plain = plain_launch(run_dir, resumed["resumed_from"])
    except UNUSABLE as err:  # the preemption figures stand on their own
        print(f"baseline of {run_dir}: unusable: {err}", flush=True)
        plain = None
    return Repeat(spans, plain, stopped_at, job_id)


def describe(run: Repeat) -> str:
    spans = " ".join(f"{key}={value:.2f}" for key, value in run.phases.items())
    return f"job {run.job_id}: stopped at step {run.stopped_at}; {spans}; " + (
        f"plain d={run.plain['d']:.2f} e={run.plain['e']:.2f}" if run.plain else "no baseline"
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
    """The resumed attempt's launch (d, e) next to the same command's without swiftslurm, over the repeats
    whose baseline ran."""
    paired = [(r.phases, r.plain) for r in runs if r.plain is not None]
    if not paired:
        return "no baseline ran to the first step"
    lines = [
        f"{len(paired)} repeat(s) with a baseline, seconds: median (min-max)",
        "",
        "| `swift sft` resuming, 2 nodes | start -> ms-swift main (d) | -> first step (e) | d + e | w + d + e |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    rows = {
        "plain, via srun": [(plain["d"], plain["e"], 0.0) for _, plain in paired],
        "under swiftslurm": [(ours["d"], ours["e"], ours["w"]) for ours, _ in paired],
    }
    medians = {}
    for name, values in rows.items():
        columns = [[d for d, _, _ in values], [e for _, e, _ in values], [d + e for d, e, _ in values]]
        columns.append([w + d + e for d, e, w in values])
        medians[name] = [statistics.median(c) for c in columns]
        lines.append(f"| {name} | " + " | ".join(spread(c) for c in columns) + " |")
    ratios = [ours / plain for ours, plain in zip(medians["under swiftslurm"], medians["plain, via srun"], strict=True)]
    lines.append("| ratio of medians | " + " | ".join(f"{r:.2f}" for r in ratios) + " |")
    return "\n".join(lines)


def spread(values: list[float]) -> str:
    """'median (min-max)' in seconds."""
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def run_repeats(run_root: Path, repeats: int) -> list[Repeat]:
    runs = []
    for index in range(repeats):
        try:
            run = one_repeat(run_root)
        except UNUSABLE as err:
            print(f"repeat {index}: unusable: {err}", flush=True)
            continue
        print(f"repeat {index}: {describe(run)}", flush=True)
        runs.append(run)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--run-root", type=Path, help="where the run dirs go (default: a temp dir, removed after)")
    parser.add_argument("--kill-repeats", type=int, default=0, help="repeats of the killed-rank comparison")
    args = parser.parse_args()
    if shutil.which("sbatch") is None:
        sys.exit("no SLURM here: start the local cluster with `bash scripts/slurm-local.sh up`")
    run_root = args.run_root or Path(tempfile.mkdtemp(prefix="swiftslurm-preemption-"))
    run_root.mkdir(parents=True, exist_ok=True)
    print(f"run root: {run_root}", flush=True)
    runs = run_repeats(run_root.resolve(), args.repeats)
    killed = kill_repeats(run_root.resolve(), args.kill_repeats)
    if not runs and not any(killed.values()):
        sys.exit(f"no usable repeat (run dirs kept in {run_root})")
    if args.run_root is None:
        shutil.rmtree(run_root, ignore_errors=True)
    if runs:
        print(f"\n{len(runs)} repeat(s), seconds\n\n{phase_table(runs)}\n\n{baseline_table(runs)}")
    if any(killed.values()):
        print(f"\nkill -9 of rank 1, both nodes alive, seconds\n\n{kill_table(killed)}")


if __name__ == "__main__":
    main()
