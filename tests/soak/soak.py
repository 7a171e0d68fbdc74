"""Soak test (issue 18): many kills and stop signals at random moments, and the promise checked after each
run: every attempt resumed from the newest committed checkpoint, nothing was committed past the planned last
step, every committed checkpoint passes its deep check, and the final weights are byte-identical to an
uninterrupted run of the same plan. Not part of CI (it runs for a long time); on the local SLURM cluster:

    bash scripts/slurm-local.sh up
    PYTHONPATH=$PWD .venv/bin/python -m tests.soak.soak --seeds 20261201-20261210 --trials 10 [--steps 100]

Each seed is one 2-node run of `--steps` steps (tiny Qwen3, LoRA, `save_steps=10`). Before each of its attempts
trains, the seed's random generator picks what happens to it:

    kill        kill -9 one or both training workers a random number of steps (and a random fraction of a
                second) past the resume point; with both nodes alive the run restarts in place
    kill-save   kill -9 both workers the moment a checkpoint folder exists without its manifest (mid-save)
    signal      `scancel --signal=USR2` (what SLURM sends ahead of a preemption) at a random step: the ranks
                save, the run is requeued
    last-save   USR2 the moment the save of the last step begins (the run must end there, never train past it)

The last trial of a seed is always `last-save` (while the run still has steps to go it is not); a run that
reaches its end before its trials are used up ends the seed early (counted, never waited for). Prints a
table, the seeds' verdicts and one line: `trials T, divergences D, corrupt C`; writes the details to
bench/results/soak-DATE.json. Reproduce one seed: `--seeds N`.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path

from swiftslurm.ckpt.checkpoint import MANIFEST, checkpoint_dirs, checkpoint_step, newest_checkpoint, problems
from swiftslurm.rundir.layout import QUARANTINE
from swiftslurm.rundir.records import read_attempts, read_status
from swiftslurm.testing.checkpoints import ResumeSeen, inspect_resume_point, saving_checkpoint
from swiftslurm.testing.cluster import (
    alive,
    cancel_if_active,
    kill_9,
    logged_step,
    next_attempt,
    preempt,
    run_over,
    submit,
    wait_for_run_end,
    wait_gone,
    wait_until,
    workers_of,
)

REPO = Path(__file__).resolve().parents[2]

ACTIONS = ("kill", "kill-save", "signal")
WEIGHTS = (0.45, 0.25, 0.30)
FILE = "adapter_model.safetensors"  # the weights compared with the uninterrupted run's
SAVE_POLL_S = 0.02


@dataclass
class Trial:
    seed: int
    attempt: str
    action: str
    resume_step: int
    at_step: int = 0  # the newest step node 0 had logged when it acted
    mid_save: str | None = None  # the checkpoint still without manifest once the workers were dead
    note: str = ""


@dataclass
class SeedResult:
    seed: int
    job: str
    trials: list[Trial] = field(default_factory=list)
    divergences: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    seconds: float = 0.0


def plan_overrides(steps: int) -> tuple[str, ...]:
    return (
        f"swift.max_steps={steps}",
        "swift.save_steps=10",
        "keep_checkpoints=3",
        "resilience.backoff_base_s=1",
        "resilience.max_consecutive_failures=50",
        "resilience.max_restarts=1000",
        "resilience.max_attempts=1000",  # preemptions are never counted against it
    )


def uninterrupted(root: Path, steps: int) -> bytes:
    """The final weights of the same plan never stopped."""
    run_dir = root / "uninterrupted"
    run_dir.mkdir(parents=True)
    job = submit(run_dir, *plan_overrides(steps))
    try:
        assert wait_for_run_end(run_dir, job, timeout_s=1800) == "COMPLETED", read_status(run_dir)
    finally:
        cancel_if_active(job)
    final = newest_checkpoint(run_dir / "output")
    assert final is not None and checkpoint_step(final) == steps, final
    return (final / FILE).read_bytes()


def act(trial: Trial, run_dir: Path, job: str, pids: list[int], steps: int, rng: random.Random) -> None:
    """Do the trial's action to the attempt's training processes (or its job) at its moment."""
    output = run_dir / "output"
    if trial.action in ("kill-save", "last-save"):
        above = steps - 1 if trial.action == "last-save" else trial.resume_step
        folder = _wait_for_save(output, above, pids)
        if folder is None:
            trial.note = "ended before the save began"
            return
        trial.at_step = logged_step(run_dir, trial.attempt)
        if trial.action == "kill-save":
            kill_9(pids)
            wait_gone(pids)
        else:
            preempt(job)
        trial.mid_save = None if (folder / MANIFEST).exists() else folder.name
        return
    target = min(trial.resume_step + rng.randint(3, 30), steps - 5)
    wait_until(
        lambda: logged_step(run_dir, trial.attempt) >= target or not all(alive(p) for p in pids),
        600,
        f"{trial.attempt} to reach step {target}",
        poll_s=0.05,
    )
    time.sleep(rng.uniform(0.0, 0.5))
    if not all(alive(p) for p in pids):
        trial.note = f"ended before step {target}"
        return
    trial.at_step = logged_step(run_dir, trial.attempt)
    if trial.action == "kill":
        kill_9(pids if rng.random() < 0.5 else [rng.choice(pids)])
    else:
        preempt(job)


def _wait_for_save(output: Path, above: int, pids: list[int]) -> Path | None:
    """The checkpoint folder of a save in progress above step ``above``, the moment it appears (None if the
    trainer ended first)."""
    while (folder := saving_checkpoint(output, above)) is None:
        if not all(alive(p) for p in pids):
            return None
        time.sleep(SAVE_POLL_S)
    return folder


def choose(rng: random.Random, turn: int, trials: int) -> str:
    return "last-save" if turn == trials - 1 else rng.choices(ACTIONS, WEIGHTS)[0]


def soak_one(seed: int, root: Path, steps: int, trials: int, reference: bytes) -> SeedResult:
    rng = random.Random(seed)
    run_dir = root / f"seed-{seed}"
    run_dir.mkdir(parents=True)
    started = time.monotonic()
    result = SeedResult(seed, submit(run_dir, *plan_overrides(steps)))
    seen: list[ResumeSeen] = []
    over = run_over(run_dir, result.job)
    try:
        while (attempt := next_attempt(run_dir, [s.attempt for s in seen], over=over)) is not None:
            seen.append(inspect_resume_point(run_dir, attempt))
            if len(result.trials) >= trials:
                continue  # trials used up: let the run finish
            resume = seen[-1].checkpoint
            step = (checkpoint_step(resume) or 0) if resume else 0
            trial = Trial(seed, attempt, choose(rng, len(result.trials), trials), step)
            pids = workers_of(run_dir, attempt)
            if not pids:
                continue  # ended before it trained (e.g. resumed at the last step and finished)
            act(trial, run_dir, result.job, pids, steps, rng)
            result.trials.append(trial)
            print(f"seed {seed} {trial.attempt}: {trial.action} at step {trial.at_step} {trial.note}", flush=True)
        state = wait_for_run_end(run_dir, result.job, timeout_s=900)
    finally:
        cancel_if_active(result.job)
    result.seconds = time.monotonic() - started
    judge(result, run_dir, seen, steps, reference, state)
    return result


def judge(result: SeedResult, run_dir: Path, seen: list[ResumeSeen], steps: int, reference: bytes, state: str) -> None:
    """The promise, checked on what the run left behind."""
    output, records = run_dir / "output", read_attempts(run_dir)
    status = read_status(run_dir) or {}
    if state != "COMPLETED" or status.get("state") != "finished" or status.get("committed_step") != steps:
        result.divergences.append(f"ended {state}, status {status.get('state')} at {status.get('committed_step')}")
    for before, after in pairwise(records):
        if after.resume_step != before.committed_step:
            result.divergences.append(
                f"{after.attempt} resumed from {after.resume_step}, newest commit {before.committed_step}"
            )
    beyond = [p.name for p in _all_checkpoints(output) if (checkpoint_step(p) or 0) > steps]
    if beyond:
        result.divergences.append(f"checkpoints past step {steps}: {beyond}")
    for resume in seen:
        if resume.checkpoint is not None and (resume.committed_at is None or resume.problems):
            result.corrupt.append(f"{resume.attempt} resumed from {resume.checkpoint.name}: {resume.problems}")
    for _, path in checkpoint_dirs(output):
        if (path / MANIFEST).is_file() and (found := problems(path, deep=True)):
            result.corrupt.append(f"{path.name}: {found}")
    final = newest_checkpoint(output)
    if final is None or (final / FILE).read_bytes() != reference:
        result.divergences.append(f"final weights of {final} differ from the uninterrupted run's")


def _all_checkpoints(output: Path) -> list[Path]:
    folders = [output, output / QUARANTINE]
    return [p for f in folders if f.is_dir() for p in f.iterdir() if p.name.startswith("checkpoint-")]


def seeds_from(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def report(results: list[SeedResult]) -> str:
    lines = ["| seed | job | trials (kill / kill-save / signal / last-save) | mid-save landed | minutes | verdict |"]
    lines.append("| ---: | ---: | --- | ---: | ---: | --- |")
    for r in results:
        counts = " / ".join(str(sum(t.action == a for t in r.trials)) for a in (*ACTIONS, "last-save"))
        landed = sum(t.mid_save is not None for t in r.trials)
        verdict = "; ".join(r.divergences + r.corrupt) or "ok"
        lines.append(f"| {r.seed} | {r.job} | {counts} | {landed} | {r.seconds / 60:.1f} | {verdict} |")
    trials = sum(len(r.trials) for r in results)
    divergences = sum(bool(r.divergences) for r in results)
    corrupt = sum(len(r.corrupt) for r in results)
    lines.append(f"\ntrials {trials}, divergences {divergences}, corrupt {corrupt}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="20261201-20261210", help="N or FIRST-LAST")
    parser.add_argument("--trials", type=int, default=10, help="kills/signals per seed (the last is last-save)")
    parser.add_argument("--steps", type=int, default=100, help="max_steps of each run")
    parser.add_argument("--run-root", type=Path, default=None, help="where the run dirs go (default: /tmp/soak-DATE)")
    args = parser.parse_args()
    stamp = datetime.now().strftime("%Y-%m-%d-%H%M")
    root = args.run_root or Path(f"/tmp/soak-{stamp}")
    reference = uninterrupted(root, args.steps)
    results = [soak_one(seed, root, args.steps, args.trials, reference) for seed in seeds_from(args.seeds)]
    text = report(results)
    print(text)
    out = REPO / "bench" / "results" / f"soak-{stamp}.json"
    out.write_text(
        json.dumps(
            {"args": {k: str(v) for k, v in vars(args).items()}, "seeds": [asdict(r) for r in results]}, indent=1
        )
    )
    print(f"details: {out}")


if __name__ == "__main__":
    main()
