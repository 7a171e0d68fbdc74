"""The run dirs that the docs' commands operate on in tests/unit/test_doc_commands.py, and SLURM's answers about
them: a placeholder's finished run (`RUN_DIR`, `SWEEP_DIR`), and the runs the docs' status examples show, with
the records the wrapper and `status` write (attempts, SLURM's accounting, a trainer's timeline)."""

from __future__ import annotations

import datetime
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from swiftslurm import slurm
from swiftslurm.ckpt.checkpoint import commit
from swiftslurm.rundir.sweepdir import record_points

FIXTURE_RUN = "runs/finished"
FIXTURE_SWEEP = "runs/sweeps/2026-01-01_00-00-00"
T0 = 1796032800.0  # when the docs' finished runs were submitted (2026-12-01)


@dataclass(frozen=True)
class DocRun:
    """A run of the tiny model on 2 nodes × 1 CPU process, as a status example of the docs shows it."""

    path: str
    job: str
    attempts: tuple[str, ...]  # each recorded attempt's "reason→decision"
    step: int  # the newest committed one
    max_steps: int
    loss: float
    seconds_per_step: float
    running: bool = False  # else finished; running: its attempt open, its job running in SLURM's answers


PREEMPTED, FINISHED = "preempted→requeue", "finished→done"
POINT = "runs/tiny-sft-{1}-local-slurm-learning_rate={0},strategy={1}"  # a sweep's point: learning rate, strategy
DOC_RUNS = {
    run.path: run
    for run in (
        DocRun("runs/tiny-sft-ddp-local-slurm", "139", (PREEMPTED, PREEMPTED, FINISHED), 80, 80, 6.1596, 0.267),
        DocRun(POINT.format("0.0001", "ddp"), "19", (PREEMPTED, FINISHED), 20, 20, 6.609, 0.247),
        DocRun(POINT.format("0.0001", "zero2"), "20", (), 10, 20, 6.5811, 0.513, running=True),
        DocRun(POINT.format("0.0002", "ddp"), "21", (FINISHED,), 20, 20, 6.4102, 0.241),
        DocRun(POINT.format("0.0002", "zero2"), "22", (FINISHED,), 20, 20, 6.3957, 0.498),
    )
}
DOC_SWEEPS = {"runs/sweeps/2026-12-01_10-00-00": [path for path in DOC_RUNS if "learning_rate=" in path]}


def write_fixtures(root: Path, args: Sequence[str]) -> dict[str, float]:
    """The placeholders' run and sweep, and the runs and sweeps of DOC_RUNS and DOC_SWEEPS that ``args`` name
    (only those: a dry run of `+cluster=local-slurm` plans runs/tiny-sft-ddp-local-slurm itself). Returns the
    jobs running now: job id -> when it started."""
    finished_run(root / FIXTURE_RUN)
    record_points(root / FIXTURE_SWEEP, [{"num": 0, "run_dir": str(root / FIXTURE_RUN), "action": "planned"}])
    running: dict[str, float] = {}
    for arg in args:
        for path in DOC_SWEEPS.get(arg, [arg] if arg in DOC_RUNS else []):
            running |= write_doc_run(root / path, DOC_RUNS[path])
        if arg in DOC_SWEEPS:
            points = [
                {"num": n, "run_dir": str(root / p), "action": "submitted"} for n, p in enumerate(DOC_SWEEPS[arg])
            ]
            record_points(root / arg, points)
    return running


def finished_run(run_dir: Path) -> None:
    """A run that trained 2 steps and finished: status.json, a committed checkpoint, ms-swift's records, a log."""
    write_json(run_dir / "plan.json", {"run_name": run_dir.name, "topology": {"nodes": 1}, "batch": batch(1)})
    write_metrics(run_dir, [(1, 2.0), (2, 1.5)], max_steps=2, seconds_per_step=0.5)
    write_checkpoint(run_dir, 2)
    (run_dir / "logs" / "1").mkdir(parents=True)
    (run_dir / "logs" / "1" / "node0.log").write_text("{'loss': 1.5, 'global_step/max_steps': '2/2'}\n")
    write_json(run_dir / "status.json", {"state": "finished", "why": "trained every step"})


def write_doc_run(run_dir: Path, run: DocRun) -> dict[str, float]:
    """The run's plan, submission, status, metrics and newest checkpoint, then its attempts: the jobs running."""
    write_json(run_dir / "plan.json", {"run_name": run_dir.name, "topology": {"nodes": 2}, "batch": batch(2)})
    write_json(run_dir / "job.json", {"job_id": run.job, "scheduler": "slurm"})
    write_json(run_dir / "status.json", {"state": "running" if run.running else "finished", "job_id": run.job})
    logged = [(s, round(run.loss + (run.step - s) / 100, 4)) for s in range(5, run.step + 1, 5)]
    write_metrics(run_dir, logged, run.max_steps, run.seconds_per_step)
    write_checkpoint(run_dir, run.step)
    if run.running:
        return {run.job: write_running_attempt(run_dir, run)}
    write_attempts(run_dir, run)
    return {}


def write_attempts(run_dir: Path, run: DocRun) -> None:
    """Each attempt's record, and SLURM's accounting of each run of the job as `status` caches it (final)."""
    rows, accounted = [], []
    for i, outcome in enumerate(run.attempts):
        reason, decision = outcome.split("→")
        submit = T0 + 150 * i
        start, end = submit + 10, submit + 130
        resumed, done = (run.step * n // len(run.attempts) for n in (i, i + 1))
        rows.append(
            {"attempt": run.job if i == 0 else f"{run.job}.r{i}", "job_id": run.job, "hosts": ["node1", "node2"]}
            | {"start": start + 2, "end": end - 2, "first_step_at": start + 60, "reason": reason, "decision": decision}
            | {"resume_step": resumed, "last_step": done, "committed_step": done}
        )
        state = "REQUEUED" if decision == "requeue" else "COMPLETED"
        accounted.append(
            {
                "job_id": run.job,
                "raw_id": run.job,
                "state": state,
                "submit": submit,
                "start": start,
                "end": end,
                "nodes": 2,
            }
        )
    write_lines(run_dir / "attempts.jsonl", rows)
    write_json(run_dir / "accounting.json", {"jobs": {run.job: {"rows": accounted, "asked_at": T0 + 1000}}})


def write_running_attempt(run_dir: Path, run: DocRun) -> float:
    """The attempt training now and its trainer's timeline up to its last commit; returns when its job started."""
    now = time.time()
    opened = {"attempt": run.job, "job_id": run.job, "start": now - 115, "hosts": ["node1", "node2"]}
    write_json(run_dir / "attempt_open.json", opened | {"phases": {"prepare": now - 115, "train": now - 110}})
    events = [
        {"event": "train_begin", "t": now - 90},
        {"event": "save", "step": run.step, "started": now - 20, "t": now - 19},
        {"event": "committed", "step": run.step, "t": now - 19},
    ]
    write_lines(run_dir / "logs" / run.job / "trainer.jsonl", events)
    return now - 120


def slurm_answering(running: dict[str, float]) -> slurm.Runner:
    """The SLURM seam's runner: `squeue` and `sacct --duplicates` answer for the ``running`` jobs (job id -> when
    it started); every other SLURM command is missing from PATH, as in every unit test."""

    def runner(argv: Sequence[str], timeout_s: float) -> slurm.Answer:
        jobs = [j for j in argv[argv.index("-j") + 1].split(",") if j in running] if "-j" in argv else []
        started = {j: datetime.datetime.fromtimestamp(running[j]).isoformat(timespec="seconds") for j in jobs}
        if argv[0] == "squeue":
            return slurm.Answer(0, "".join(f"{j} RUNNING\n" for j in jobs))
        if argv[0] == "sacct" and "-D" in argv:
            return slurm.Answer(0, "".join(f"{j}|{j}|RUNNING|{started[j]}|{started[j]}|Unknown|2\n" for j in jobs))
        raise FileNotFoundError(2, "No such file or directory", argv[0])

    return runner


def batch(data_parallel: int) -> dict[str, int]:
    return {"micro": 1, "grad_accum": 1, "data_parallel": data_parallel}


def write_metrics(run_dir: Path, losses: list[tuple[int, float]], max_steps: int, seconds_per_step: float) -> None:
    """ms-swift's output/logging.jsonl: one record per logged step."""
    speed = {"train_speed(s/it)": seconds_per_step}
    write_lines(
        run_dir / "output" / "logging.jsonl",
        [{"loss": x, "global_step/max_steps": f"{s}/{max_steps}"} | speed for s, x in losses],
    )


def write_checkpoint(run_dir: Path, step: int) -> None:
    checkpoint = run_dir / "output" / f"checkpoint-{step}"
    checkpoint.mkdir(parents=True)
    (checkpoint / "adapter.bin").write_bytes(b"w")
    commit(checkpoint, world_size=1, swift_version="test")


def write_json(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def write_lines(path: Path, records: Sequence[object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
