"""Benchmark: `status` over a folder of 1000 run dirs and over a 1000-point sweep (issue 29).

    .venv/bin/python -m bench.status_scale [--runs 1000] [--repeats 5] [--slurm fake|real] [--out FILE]

Builds N run dirs with swiftslurm's own writers (plan.json, job.json, status.json, attempts.jsonl with up to three
attempts, each attempt's node logs and trainer timeline, ms-swift's logging.jsonl, committed checkpoints) in four
kinds (finished, running, pending, failed) and a sweep dir of N more points, then times `status FOLDER` and
`status SWEEP_DIR`, each cold (no accounting cache: the first status of a folder) and warm (the next one):

- in this process, `status.main`, with slurm.runner wrapped to count the SLURM commands it starts;
- as a CLI process, `python -m swiftslurm status`, with squeue/sacct/scontrol on PATH replaced by shims that log
  each call (and run the real command with --slurm real).

--slurm fake: the SLURM commands answer at once and know no job (no cluster needed). --slurm real: the real
commands of the local cluster (`bash scripts/slurm-local.sh status` says whether it is up); the unfinished runs
point at the tasks of a held job array submitted for the benchmark (cancelled at the end), so squeue answers for
them. The swiftslurm measured is the one `import swiftslurm` finds (PYTHONPATH=DIR measures another checkout's).
Prints a table; writes the raw figures as JSON (--out, default bench/results/status-scale-<date>.json).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import swiftslurm
from swiftslurm import slurm
from swiftslurm.ckpt.checkpoint import commit
from swiftslurm.plan import JobPlan
from swiftslurm.rundir.jsonio import write_json_atomic
from swiftslurm.rundir.layout import METRICS, OPEN_ATTEMPT, attempt_dir, node_log, output_dir, trainer_timeline
from swiftslurm.rundir.records import AttemptRecord, append_attempt, record_submissions, write_status
from swiftslurm.rundir.sweepdir import record_points
from swiftslurm.rundir.timeline import COMMITTED, SAVE, TRAIN_BEGIN, TRAIN_END, TimelineWriter

REPO = Path(__file__).resolve().parents[1]
KINDS = ("finished",) * 4 + ("running",) * 3 + ("pending",) * 2 + ("failed",)  # run i is KINDS[i % 10]
MAX_STEPS, LOG_EVERY, SAVE_EVERY, NODES = 2000, 5, 500, 2
SHIMMED = ("squeue", "sacct", "scontrol")
OVERRIDES = ("+cluster=a100x16", "model=qwen3-8b", "strategy=zero3", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]")


# ---------------------------------------------------------------- the run dirs


def base_plan() -> JobPlan:
    """One real plan (a 16-GPU ZeRO-3 LoRA run), composed once; each run dir gets a copy under its own name."""
    from hydra import compose, initialize_config_dir

    from swiftslurm.__main__ import to_config
    from swiftslurm.planning.config import open_dict_overrides, register_configs
    from swiftslurm.planning.make import PlanContext, make_plan

    register_configs()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = to_config(compose("config", overrides=open_dict_overrides(list(OVERRIDES))))
    return make_plan(cfg, PlanContext(cwd=REPO))


def metric_line(step: int) -> dict[str, Any]:
    """One of ms-swift's logging.jsonl records (the keys it writes at each logging step)."""
    return {
        "loss": round(2.5 - step / MAX_STEPS, 6),
        "grad_norm": 0.81234,
        "learning_rate": 9.9e-05,
        "token_acc": 0.61234,
        "epoch": round(step / MAX_STEPS, 4),
        "global_step/max_steps": f"{step}/{MAX_STEPS}",
        "percentage": f"{100 * step / MAX_STEPS:.2f}%",
        "elapsed_time": f"{step // 2}s",
        "remaining_time": "1h 2m 3s",
        "memory(GiB)": 21.37,
        "train_speed(s/it)": 0.51234,
    }


def write_attempt(run_dir: Path, n: int, job_id: str, first: int, last: int, ended: bool) -> AttemptRecord:
    """Attempt ``n`` from step ``first`` to ``last``: its node logs, its trainer timeline, its record (if it ended)."""
    name = f"{job_id}.{n}"
    folder = attempt_dir(run_dir, name)
    folder.mkdir(parents=True)
    for node in range(NODES):
        steps = range(first + LOG_EVERY, last + 1, LOG_EVERY)
        lines = [f"[INFO:swift] {metric_line(s)}\n" for s in steps] if node == 0 else ["[INFO:swift] training\n"]
        node_log(folder, node).write_text("".join(lines))
    timeline = TimelineWriter(str(trainer_timeline(folder)))
    timeline.event(TRAIN_BEGIN, step=first)
    for step in range(first - first % SAVE_EVERY + SAVE_EVERY, last + 1, SAVE_EVERY):
        timeline.event(SAVE, step=step, started=time.time() - 5)
        timeline.event(COMMITTED, step=step)
    record = AttemptRecord(
        attempt=name,
        job_id=job_id,
        restart_count=n,
        hosts=tuple(f"node{k}" for k in range(NODES)),
        start=time.time() - 3600,
        first_step_at=time.time() - 3500,
        last_step=last,
        max_steps=MAX_STEPS,
        nodes=NODES,
        phases={"prepare": time.time() - 3600, "train": time.time() - 3550, "conclude": time.time() - 10},
    )
    if not ended:
        write_json_atomic(run_dir / OPEN_ATTEMPT, record.as_dict(), durable=False)
        return record
    timeline.event(TRAIN_END, started=time.time() - 2)
    done = last >= MAX_STEPS
    reason, decision = ("finished", "done") if done else ("preempted", "requeue")
    record = replace(record, end=time.time() - 5, exit_code=0, reason=reason, decision=decision, why=reason)
    append_attempt(run_dir, record)
    return record


def write_training(run_dir: Path, job_id: str, attempts: int, reached: int, still_going: bool) -> None:
    """``attempts`` attempts that together reached step ``reached``; logging.jsonl and committed checkpoints."""
    per = reached // attempts
    for n in range(attempts):
        last = reached if n == attempts - 1 else per * (n + 1)
        write_attempt(run_dir, n, job_id, per * n, last, ended=not (still_going and n == attempts - 1))
    lines = [json.dumps(metric_line(s)) + "\n" for s in range(LOG_EVERY, reached + 1, LOG_EVERY)]
    output_dir(run_dir).mkdir(exist_ok=True)
    (output_dir(run_dir) / METRICS).write_text("".join(lines))
    for step in range(SAVE_EVERY, reached + 1, SAVE_EVERY)[-2:]:  # retention keeps the two newest
        checkpoint = output_dir(run_dir) / f"checkpoint-{step}"
        checkpoint.mkdir()
        for name in ("adapter_model.safetensors", "adapter_config.json", "trainer_state.json"):
            (checkpoint / name).write_text("{}")
        commit(checkpoint, world_size=16, swift_version="3.9.0", last_step=MAX_STEPS)


def write_run(run_dir: Path, kind: str, plan: JobPlan, job_id: str) -> None:
    """One run dir of ``kind``, carried by job ``job_id`` (requeued in place: every attempt is that job's)."""
    from swiftslurm.submit.jobs import write_run_dir

    plan = replace(plan, run_name=run_dir.name, run_dir=str(run_dir))
    write_run_dir(plan, "# config.yaml\n", "#!/bin/bash\n", durable=False)
    if kind == "finished":
        write_training(run_dir, job_id, 3, MAX_STEPS, still_going=False)
        write_status(run_dir, "finished", why="reached max_steps", job_id=job_id)
    elif kind == "running":
        write_training(run_dir, job_id, 3, MAX_STEPS // 2, still_going=True)
        write_status(run_dir, "running", job_id=job_id, attempt=f"{job_id}.2")
    elif kind == "failed":
        write_training(run_dir, job_id, 1, 300, still_going=False)
        write_status(
            run_dir, "failed", why="the trainer exited 1 (CUDA error: an illegal memory access)", job_id=job_id
        )


def build(root: Path, runs: int, job_ids: Callable[[str, int], str]) -> tuple[Path, Path]:
    """``root``/runs/ with N run dirs and ``root``/sweep/ with an N-point sweep (sweep.jsonl beside its points).
    Written without fsync (os.fsync stubbed while building): durability is not what is measured."""
    plan = base_plan()
    folder, sweep = root / "runs", root / "sweep"
    real_fsync, os.fsync = os.fsync, lambda fd: None
    try:
        for parent in (folder, sweep):
            jobs = [(parent / f"p{i:04d}", job_ids(parent.name, i)) for i in range(runs)]
            for i, (run_dir, job_id) in enumerate(jobs):
                write_run(run_dir, KINDS[i % len(KINDS)], plan, job_id)
            record_submissions(jobs, "slurm")
        points = [
            {"num": i, "run_dir": str(d), "job_id": j, "overrides": [f"seed={i}"]} for i, (d, j) in enumerate(jobs)
        ]
        record_points(sweep, points)
    finally:
        os.fsync = real_fsync
    return folder, sweep


# ---------------------------------------------------------------- SLURM: fake or real, counted


def fake_runner(argv: Sequence[str], timeout_s: float) -> slurm.Answer:
    """A controller that answers at once and knows no job."""
    return slurm.Answer(0, "")


class Counted:
    """slurm.runner wrapped: every SLURM command this process starts, by name."""

    def __init__(self, inner: slurm.Runner) -> None:
        self.inner = inner
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout_s: float) -> slurm.Answer:
        self.calls.append(list(argv))
        return self.inner(argv, timeout_s)


def write_shims(folder: Path, real: bool) -> Path:
    """squeue/sacct/scontrol that log their argv to folder/calls.log and run the real one (real) or print nothing."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in SHIMMED:
        target = shutil.which(name) if real else None
        then = f'exec {target} "$@"' if target else "exit 0"
        (folder / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {folder}/calls.log\n{then}\n')
        (folder / name).chmod(0o755)
    return folder / "calls.log"


def held_array(tasks: int) -> str:
    """A held job array of ``tasks`` tasks (pending, never started): job ids squeue and sacct know."""
    argv = ["sbatch", "--parsable", "--hold", f"--array=0-{tasks - 1}", "-p", "debug", "--wrap", "true"]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.strip().split(";")[0]


# ---------------------------------------------------------------- timing


def drop_caches(paths: Sequence[Path]) -> None:
    """Forget every run dir's accounting cache: the next status is a folder's first."""
    for parent in paths:
        for cache in parent.glob("*/accounting.json"):
            cache.unlink()


def in_process(path: Path, counted: Counted) -> tuple[float, int]:
    from swiftslurm.ops import status

    before = len(counted.calls)
    started = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()):
        code = status.main([str(path)])
    took = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"status {path} exited {code}")
    return took, len(counted.calls) - before


def as_cli(path: Path, shims: Path, log: Path, cwd: Path) -> tuple[float, int]:
    before = len(log.read_text().splitlines()) if log.exists() else 0
    env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}", "PYTHONPATH": str(CODE)}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "swiftslurm", "status", str(path)], cwd=cwd, env=env, capture_output=True
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"status {path} exited {done.returncode}: {done.stderr.decode()[-2000:]}")
    return took, len(log.read_text().splitlines()) - before if log.exists() else 0


CODE = Path(swiftslurm.__file__).resolve().parents[1]  # the checkout measured; the CLI process imports the same


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def floors(job_ids: list[str], live: list[str], cwd: Path, real: bool) -> dict[str, float]:
    """What status cannot go below, timed alone: a bare interpreter start, and (real SLURM) the two questions with
    the folder's job ids (status's own argv: slurm.job_lists gives one list each here)."""
    argvs = {"python -c pass": [sys.executable, "-c", "pass"]}
    if real:
        argvs["squeue"] = ["squeue", "-h", "-r", "-j", ",".join(live), "-o", "%i %T"]
        argvs["sacct -D"] = [
            "sacct",
            "-D",
            "-X",
            "-n",
            "-P",
            "-j",
            ",".join(job_ids),
            "-o",
            ",".join(slurm.JOB_RUN_FIELDS),
        ]
    took = {}
    for name, argv in argvs.items():
        started = time.perf_counter()
        subprocess.run(argv, cwd=cwd, capture_output=True, check=True)
        took[name] = time.perf_counter() - started
    return took


def measure(paths: dict[str, Path], repeats: int, counted: Counted, shims: Path, log: Path, cwd: Path) -> dict:
    """Each repeat, interleaved: for each path, cold then warm, in this process, then cold then warm as a CLI."""
    seconds: dict[str, list[float]] = {}
    calls: dict[str, list[int]] = {}
    for _ in range(repeats):
        for name, path in paths.items():
            for how, timed in (
                ("in-process", lambda p: in_process(p, counted)),
                ("cli", lambda p: as_cli(p, shims, log, cwd)),
            ):
                for when in ("cold", "warm"):
                    if when == "cold":
                        drop_caches([path])
                    took, n = timed(path)
                    seconds.setdefault(f"{name} {how} {when}", []).append(took)
                    calls.setdefault(f"{name} {how} {when}", []).append(n)
    return {key: {"seconds": summary(v), "slurm_calls": calls[key], "all_s": v} for key, v in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--slurm", choices=("fake", "real"), default="fake")
    parser.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / f"status-scale-{time.strftime('%Y-%m-%d')}.json"
    )
    args = parser.parse_args()
    real = args.slurm == "real"
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv)}
    report |= {"code": str(CODE), "runs": args.runs, "repeats": args.repeats, "slurm": args.slurm}
    report["load_at_start"] = os.getloadavg()
    array = held_array(args.runs) if real else None
    try:
        with tempfile.TemporaryDirectory(prefix="status-scale-") as tmp:
            report |= run(Path(tmp), args.runs, args.repeats, array, real)
    finally:
        if array:
            subprocess.run(["scancel", array], check=False)
    report["load_at_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for key, r in report["results"].items():
        s = r["seconds"]
        print(f"{key:28s} {s['min']:.2f} / {s['median']:.2f} / {s['max']:.2f} s  SLURM calls {r['slurm_calls']}")
    for key, values in report["floors"].items():
        print(f"{'floor: ' + key:28s} {min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f} s")
    print(f"wrote {args.out}")


def run(root: Path, runs: int, repeats: int, array: str | None, real: bool) -> dict[str, Any]:
    """Build the run dirs under ``root``, then time status over them ``repeats`` times, and the floors."""

    def job_of(parent: str, i: int) -> str:
        """The held array's task i for an unfinished run (real), else an id no cluster has given out yet."""
        if array and KINDS[i % len(KINDS)] in ("running", "pending"):
            return f"{array}_{i}"
        return str((900000 if parent == "runs" else 800000) + i)

    started = time.perf_counter()
    folder, sweep = build(root, runs, job_of)
    built_s = time.perf_counter() - started
    counted = Counted(slurm.runner if real else fake_runner)
    slurm.runner = counted
    shims = root / "shims"
    log = write_shims(shims, real)
    results = measure({"folder": folder, "sweep": sweep}, repeats, counted, shims, log, root)
    live = [job_of("runs", i) for i in range(runs) if KINDS[i % len(KINDS)] in ("running", "pending")]
    floor = [floors([job_of("runs", i) for i in range(runs)], live, root, real) for _ in range(repeats)]
    return {
        "build_s": built_s,
        "slurm_commands_seen": sorted({" ".join(c[:2]) for c in counted.calls}),
        "results": results,
        "floors": {key: [f[key] for f in floor] for key in floor[0]},
    }


if __name__ == "__main__":
    main()
