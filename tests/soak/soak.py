"""Soak test: many faults at random moments, of the kinds a real cluster has, and the promise checked after
each run: every attempt resumed from the newest committed checkpoint (no committed step lost), nothing was
committed past the planned last step, the run was called finished only with its last step committed (and
uploaded, with storage), every attempt left a record, every committed checkpoint passes its deep check, and
the final weights are byte-identical to an uninterrupted run of the same plan. On the local SLURM cluster:

    bash scripts/slurm-local.sh up
    PYTHONPATH=$PWD .venv/bin/python -m tests.soak.soak --seeds 20261201-20261220 --trials 10 [--steps 100]

Each seed is one 2-node run of `--steps` steps (tiny Qwen3, LoRA, `save_steps=10`) under one profile, the
seed's number modulo the profiles (so consecutive seeds cover them all):

    plain        the run dir on the local disk, no object storage
    storage      checkpoints synced to SeaweedFS through a fault proxy that can refuse every connection
    workers      `dataloader_num_workers=2`: stop signals reach the DataLoader workers too, as SLURM sends them
    slow-commit  every save takes SLOW_SAVE_S more before its commit (slow_save_plugin.py)
    small-disk   the run dir on a tmpfs, shared by every node, that holds a few checkpoints more than kept

Before each of its attempts trains, the seed's random generator picks what happens to it:

    kill        kill -9 one or both training workers a random number of steps past the resume point
    kill-other  kill -9 node 1's worker only: a failure on a node other than node 0
    kill-save   kill -9 both workers the moment a checkpoint folder exists without its manifest (mid-save)
    signal      `scancel --signal=USR2` (what SLURM sends ahead of a preemption, to every process of the step)
    ctld-stop   USR2, and slurmctld frozen from then for 20-40 s: the requeue falls due while it cannot answer
    s3-restore  (storage) the endpoint refuses connections from a kill until 10-40 s into the next attempt
    s3-upload   (storage) the endpoint goes down as a save begins; USR2 during the outage; back 20-40 s later
    disk-full   (small-disk) the filesystem is filled the moment a save begins, freed once the attempt ended
    last-save   USR2 the moment the save of the last step begins (the run must end there, never train past it)

The last trial of a seed is always `last-save`; a run that reaches its end before its trials are used up
ends the seed early (counted, never waited for). Prints a table by seed and one by fault kind, and one line:
`trials T, seeds S, divergences D, corrupt C`; writes the details to bench/results/soak-DATE.json. Reproduce
one seed: `--seeds N`. `--smoke` is the short run CI makes (tests/cluster/test_soak_smoke.py).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path

from swiftslurm.ckpt.checkpoint import (
    MANIFEST,
    checkpoint_dirs,
    checkpoint_step,
    is_committed,
    newest_checkpoint,
    problems,
)
from swiftslurm.rundir.layout import QUARANTINE
from swiftslurm.rundir.records import read_attempts, read_status
from swiftslurm.testing.checkpoints import ResumeSeen, inspect_resume_point, saving_checkpoint
from swiftslurm.testing.cluster import (
    TimedOut,
    alive,
    attempt_ids,
    cancel_if_active,
    kill_9,
    logged_step,
    next_attempt,
    preempt,
    recorded_attempts,
    resume_drained_nodes,
    run_over,
    shared_mounts,
    slurmctld_stopped,
    submit,
    wait_for_run_end,
    wait_gone,
    wait_until,
    workers_of,
)
from swiftslurm.testing.s3 import FaultProxy, Faults, SeaweedServer, server_credentials

REPO = Path(__file__).resolve().parents[2]
SLOW_SAVE_PLUGIN = Path(__file__).resolve().parent / "slow_save_plugin.py"
BRIDGE = os.environ.get("SWIFTSLURM_BRIDGE_IP", "10.77.0.1")  # jobs reach the host only there
BUCKET = "soak"

PROFILES = ("plain", "storage", "workers", "slow-commit", "small-disk")
COMMON = {"kill": 0.25, "kill-other": 0.15, "kill-save": 0.20, "signal": 0.25, "ctld-stop": 0.15}
EXTRA = {"storage": {"s3-restore": 0.30, "s3-upload": 0.30}, "small-disk": {"disk-full": 0.35}}
FILE = "adapter_model.safetensors"  # the weights compared with the uninterrupted run's
SAVE_POLL_S = 0.02
STOP_SIGNAL_LINE = "[swiftslurm] stop signal: "  # the wrapper's word that a stop signal reached it
KEEP = 3


@dataclass
class Trial:
    seed: int
    attempt: str
    action: str
    resume_step: int
    at_step: int = 0  # the newest step node 0 had logged when it acted
    mid_save: str | None = None  # the checkpoint still without manifest once the fault landed
    note: str = ""


@dataclass
class SeedResult:
    seed: int
    profile: str
    job: str = ""
    trials: list[Trial] = field(default_factory=list)
    divergences: list[str] = field(default_factory=list)
    corrupt: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Setting:
    """What a profile adds to a run: plan overrides, and the fault handles its actions use."""

    overrides: tuple[str, ...] = ()
    proxy: FaultProxy | None = None
    disk: Path | None = None  # the filesystem the run dir is on (small, or cached per node), if not the root's


def plan_overrides(steps: int) -> tuple[str, ...]:
    return (
        f"swift.max_steps={steps}",
        "swift.save_steps=10",
        f"keep_checkpoints={KEEP}",
        "resilience.backoff_base_s=1",
        "resilience.max_consecutive_failures=50",
        "resilience.max_restarts=1000",
        "resilience.max_attempts=1000",  # preemptions are never counted against it
    )


def profile_of(seed: int) -> str:
    return PROFILES[seed % len(PROFILES)]


def training_overrides(profile: str) -> tuple[str, ...]:
    """The profile's overrides that may change what is trained: the uninterrupted run has them too."""
    return ("swift.dataloader_num_workers=2",) if profile == "workers" else ()


def uninterrupted(root: Path, steps: int, extra: tuple[str, ...]) -> bytes:
    """The final weights of the same plan never stopped."""
    run_dir = root / ("uninterrupted" + "".join(f"-{o.split('=')[0]}" for o in extra))
    run_dir.mkdir(parents=True)
    job = submit(run_dir, *plan_overrides(steps), *extra)
    try:
        assert wait_for_run_end(run_dir, job, timeout_s=1800) == "COMPLETED", read_status(run_dir)
    finally:
        cancel_if_active(job)
    final = newest_checkpoint(run_dir / "output")
    assert final is not None and checkpoint_step(final) == steps, final
    return (final / FILE).read_bytes()


# ---------------------------------------------------------------- profiles


@contextlib.contextmanager
def setting_for(
    profile: str, seed: int, root: Path, store: SeaweedServer | None, checkpoint_mib: float
) -> Iterator[Setting]:
    if profile == "storage":
        assert store is not None
        with FaultProxy(store.endpoint_url, Faults(seed=seed), host=BRIDGE, lifetime_s=3600) as proxy:
            yield Setting(
                (
                    "storage=s3",
                    f"storage.bucket={BUCKET}",
                    f"storage.prefix=seed-{seed}",
                    "storage.addressing_style=path",
                    "storage.region=us-east-1",
                    f"storage.endpoint_url={proxy.url}",
                    "storage.wait_at_exit_s=120",
                ),
                proxy=proxy,
            )
    elif profile == "small-disk":
        with small_disk(seed, mib=max(64, int(checkpoint_mib * (KEEP + 4)) + 48)) as disk:
            yield Setting(disk=disk)
    elif profile == "slow-commit":
        yield Setting((f"swift.external_plugins=[{SLOW_SAVE_PLUGIN}]", "swift.callbacks=[slow_save]"))
    else:
        yield Setting(training_overrides(profile))


@contextlib.contextmanager
def small_disk(seed: int, mib: int) -> Iterator[Path]:
    """A tmpfs of ``mib`` MiB that every node of the local cluster sees (its shared mount point)."""
    where = shared_mounts() / f"soak-{seed}"
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m", f"soak-{seed}", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        with contextlib.suppress(OSError):
            where.rmdir()


def profile_is_small(setting: Setting) -> bool:
    return setting.disk is not None and setting.disk.parent == shared_mounts()


def fill(disk: Path) -> Path:
    """Write a file on ``disk`` until it is full; returns the file (delete it to free the space)."""
    filler = disk / "filler"
    block = b"\0" * (1 << 20)
    with open(filler, "wb") as out:
        try:
            while True:
                out.write(block)
                out.flush()
        except OSError as err:
            if err.errno != errno.ENOSPC:
                raise
    return filler


# ---------------------------------------------------------------- actions


def act(
    trial: Trial, run_dir: Path, job: str, pids: list[int], steps: int, rng: random.Random, setting: Setting
) -> None:
    """Do the trial's action to the attempt's training processes, its job or its surroundings at its moment."""
    output = run_dir / "output"
    if trial.action in ("kill-save", "last-save", "disk-full", "s3-upload"):
        above = steps - 1 if trial.action == "last-save" else trial.resume_step
        folder = _wait_for_save(output, above, pids)
        if folder is None:
            trial.note = "ended before the save began"
            return
        trial.at_step = logged_step(run_dir, trial.attempt)
        if trial.action == "kill-save":
            kill_9(pids)
            wait_gone(pids)
        elif trial.action == "last-save":
            preempt(job)
        elif trial.action == "disk-full":
            _disk_full(trial, run_dir, setting)
        else:
            _upload_outage(trial, run_dir, job, rng, setting)
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
    elif trial.action == "kill-other":
        kill_9(pids[1:])
    elif trial.action == "signal":
        preempt(job)
    elif trial.action == "ctld-stop":
        # scancel has its answer before slurmctld passes the signal on: freeze it once the wrapper has the
        # signal (the requeue that follows the save then falls due while it cannot answer), not before.
        seen = stop_signals_logged(run_dir)
        preempt(job)
        try:
            wait_until(lambda: stop_signals_logged(run_dir) > seen, 10, "the stop signal", poll_s=SAVE_POLL_S)
        except TimedOut:
            trial.note = "the stop signal had not reached the wrapper in 10 s"
        with slurmctld_stopped():
            time.sleep(rng.uniform(20, 40))
    elif trial.action == "s3-restore":
        assert setting.proxy is not None
        setting.proxy.go_down()
        kill_9(pids)
        _come_back_later(setting.proxy, run_dir, trial.attempt, rng.uniform(10, 40))


def stop_signals_logged(run_dir: Path) -> int:
    """How many stop signals the run's wrappers have said they received (their submitit logs)."""
    logs = (run_dir / "submitit").glob("*_log.out")
    return sum(log.read_text(errors="replace").count(STOP_SIGNAL_LINE) for log in logs)


def _wait_for_save(output: Path, above: int, pids: list[int]) -> Path | None:
    """The checkpoint folder of a save in progress above step ``above``, the moment it appears (None if the
    trainer ended first)."""
    while (folder := saving_checkpoint(output, above)) is None:
        if not all(alive(p) for p in pids):
            return None
        time.sleep(SAVE_POLL_S)
    return folder


def _disk_full(trial: Trial, run_dir: Path, setting: Setting) -> None:
    """Fill the run dir's filesystem mid-save; free it once the attempt has its record (or the run moved on)."""
    assert setting.disk is not None and profile_is_small(setting)
    filler = fill(setting.disk)
    over = run_over(run_dir)
    try:
        wait_until(lambda: trial.attempt in recorded_attempts(run_dir), 600, f"{trial.attempt}'s record", over=over)
    except AssertionError as err:
        trial.note = f"no record after the disk filled: {err}"
    finally:
        filler.unlink()


def _upload_outage(trial: Trial, run_dir: Path, job: str, rng: random.Random, setting: Setting) -> None:
    assert setting.proxy is not None
    setting.proxy.go_down()
    preempt(job)  # at once (the tiny run's steps take milliseconds): the stop-save and the drain meet the outage
    _come_back_later(setting.proxy, run_dir, trial.attempt, rng.uniform(20, 40))


def _come_back_later(proxy: FaultProxy, run_dir: Path, attempt: str, after_s: float) -> None:
    """The endpoint back ``after_s`` after the attempt following ``attempt`` began (or the run ended)."""

    def later() -> None:
        known = attempt_ids(run_dir)
        with contextlib.suppress(AssertionError):
            wait_until(
                lambda: [a for a in attempt_ids(run_dir) if a not in known and a != attempt],
                900,
                "the next attempt",
                over=run_over(run_dir),
            )
        time.sleep(after_s)
        proxy.come_back()

    threading.Thread(target=later, daemon=True).start()


def choose(rng: random.Random, turn: int, trials: int, profile: str) -> str:
    if turn == trials - 1:
        return "last-save"
    actions = {**COMMON, **EXTRA.get(profile, {})}
    return rng.choices(list(actions), list(actions.values()))[0]


# ---------------------------------------------------------------- one seed


def soak_one(
    seed: int,
    root: Path,
    steps: int,
    trials: int,
    reference: bytes,
    store: SeaweedServer | None,
    checkpoint_mib: float,
    actions: tuple[str, ...] = (),
) -> SeedResult:
    """One seed's run and its verdict. ``actions``: the first trials' actions, instead of the seed's picks."""
    rng = random.Random(seed)
    profile = profile_of(seed)
    result = SeedResult(seed, profile)
    started = time.monotonic()
    with setting_for(profile, seed, root, store, checkpoint_mib) as setting:
        run_dir = (setting.disk or root) / f"seed-{seed}" / "run"
        run_dir.parent.mkdir(parents=True)
        result.job = submit(run_dir, *plan_overrides(steps), *setting.overrides)
        seen: list[ResumeSeen] = []
        over = run_over(run_dir, result.job)
        try:
            while (attempt := next_attempt(run_dir, [s.attempt for s in seen], over=over)) is not None:
                if drained := resume_drained_nodes():
                    print(f"seed {seed}: resumed drained nodes {drained}", flush=True)
                seen.append(inspect_resume_point(run_dir, attempt))
                if len(result.trials) >= trials:
                    continue  # trials used up: let the run finish
                resume = seen[-1].checkpoint
                step = (checkpoint_step(resume) or 0) if resume else 0
                turn = len(result.trials)
                action = actions[turn] if turn < len(actions) else choose(rng, turn, trials, profile)
                trial = Trial(seed, attempt, action, step)
                pids = workers_of(run_dir, attempt)
                if not pids:
                    continue  # ended before it trained (e.g. resumed at the last step and finished)
                act(trial, run_dir, result.job, pids, steps, rng, setting)
                result.trials.append(trial)
                print(
                    f"seed {seed} ({profile}) {trial.attempt}: {trial.action} at step {trial.at_step} {trial.note}",
                    flush=True,
                )
            if setting.proxy is not None:
                setting.proxy.come_back()  # the run's end drains its uploads into a store that answers
            state = wait_for_run_end(run_dir, result.job, timeout_s=900)
        finally:
            cancel_if_active(result.job)
        result.seconds = time.monotonic() - started
        judge(result, run_dir, seen, steps, reference, state, storage=setting.proxy is not None)
        if setting.disk is not None:  # keep what the judge read: the mount goes away
            shutil.copytree(run_dir, root / f"seed-{seed}" / "run", symlinks=True, dirs_exist_ok=True)
    return result


def judge(
    result: SeedResult, run_dir: Path, seen: list[ResumeSeen], steps: int, reference: bytes, state: str, storage: bool
) -> None:
    """The promise, checked on what the run left behind."""
    output, records = run_dir / "output", read_attempts(run_dir)
    status = read_status(run_dir) or {}
    if state != "COMPLETED" or status.get("state") != "finished" or status.get("committed_step") != steps:
        result.divergences.append(f"ended {state}, status {status.get('state')} at {status.get('committed_step')}")
    if status.get("state") == "finished" and not is_committed(output / f"checkpoint-{steps}"):
        result.divergences.append(f"called finished without checkpoint-{steps} committed")
    if storage and status.get("state") == "finished" and steps in (status.get("storage") or {}).get("pending", []):
        result.divergences.append(f"called finished with checkpoint-{steps} not uploaded")
    unrecorded = [a for a in attempt_ids(run_dir) if a not in {r.attempt for r in records}]
    if unrecorded:
        result.divergences.append(f"attempts without a record: {unrecorded}")
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


# ---------------------------------------------------------------- the campaign


def seeds_from(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def report(results: list[SeedResult]) -> str:
    kinds = [*COMMON, *(k for extra in EXTRA.values() for k in extra), "last-save"]
    lines = ["| seed | profile | job | trials | mid-save landed | minutes | verdict |"]
    lines.append("| ---: | --- | ---: | --- | ---: | ---: | --- |")
    for r in results:
        counts = Counter(t.action for t in r.trials)
        shown = ", ".join(f"{k} {counts[k]}" for k in kinds if counts[k])
        landed = sum(t.mid_save is not None for t in r.trials)
        verdict = "; ".join(r.divergences + r.corrupt) or "ok"
        lines.append(f"| {r.seed} | {r.profile} | {r.job} | {shown} | {landed} | {r.seconds / 60:.1f} | {verdict} |")
    lines += [
        "",
        "| fault | trials | landed as meant | in seeds | seeds not ok |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for kind in kinds:
        done = [(r, t) for r in results for t in r.trials if t.action == kind]
        if not done:
            continue
        landed = sum(not t.note for _, t in done)
        seeds = {r.seed for r, _ in done}
        bad = {r.seed for r, _ in done if r.divergences or r.corrupt}
        lines.append(f"| {kind} | {len(done)} | {landed} | {len(seeds)} | {len(bad)} |")
    trials = sum(len(r.trials) for r in results)
    divergences = sum(bool(r.divergences) for r in results)
    corrupt = sum(len(r.corrupt) for r in results)
    broken = Counter(kind for r in results for kind in {promise_broken(d) for d in r.divergences})
    lines.append("\n" + ", ".join(f"{kind} {broken[kind]}" for kind in PROMISES) + " (runs)")
    lines.append(f"trials {trials}, seeds {len(results)}, divergences {divergences}, corrupt {corrupt}")
    return "\n".join(lines)


# What the judge's findings break, in the words of the promise; counted per run by `report`.
PROMISES = (
    "called finished without the last step committed",
    "lost committed steps",
    "ended without a record",
    "not finished",
    "diverged from the uninterrupted run",
)


def promise_broken(finding: str) -> str:
    """Which promise one of `judge`'s findings breaks."""
    if finding.startswith("called finished"):
        return PROMISES[0]
    if " resumed from " in finding:
        return PROMISES[1]
    if finding.startswith("attempts without a record"):
        return PROMISES[2]
    if finding.startswith("ended "):
        return PROMISES[3]
    return PROMISES[4]  # checkpoints past the last step, final weights that differ


@contextlib.contextmanager
def object_store(seeds: list[int]) -> Iterator[SeaweedServer | None]:
    """SeaweedFS on the bridge if a seed syncs to storage (its credentials exported, as a user's shell does)."""
    if not any(profile_of(seed) == "storage" for seed in seeds):
        yield None
        return
    os.environ.update(server_credentials())
    with SeaweedServer(host=BRIDGE) as store:
        store.create_bucket(BUCKET)
        yield store


def campaign(
    seeds: list[int], trials: int, steps: int, root: Path, done: Callable[[list[SeedResult]], None] = lambda _: None
) -> list[SeedResult]:
    """Soak each seed in turn; ``done`` gets the results so far after each seed (a campaign of hours that is
    stopped keeps what it judged)."""
    references: dict[tuple[str, ...], bytes] = {}
    results: list[SeedResult] = []
    with object_store(seeds) as store:
        for seed in seeds:
            extra = training_overrides(profile_of(seed))
            if extra not in references:
                references[extra] = uninterrupted(root, steps, extra)
            results.append(soak_one(seed, root, steps, trials, references[extra], store, _checkpoint_mib(root)))
            done(results)
    return results


def _checkpoint_mib(root: Path) -> float:
    """The size of one checkpoint of the uninterrupted run (the small disk is sized from it)."""
    run = next(root.glob("uninterrupted*"))
    final = newest_checkpoint(run / "output")
    assert final is not None
    return sum(p.stat().st_size for p in final.rglob("*") if p.is_file()) / (1 << 20)


def load_results(path: Path) -> list[SeedResult]:
    """The seeds of a results file that a campaign wrote (several campaigns' files make one table)."""
    seeds = json.loads(path.read_text())["seeds"]
    return [SeedResult(**{**s, "trials": [Trial(**t) for t in s["trials"]]}) for s in seeds]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="20261201-20261220", help="N or FIRST-LAST")
    parser.add_argument("--trials", type=int, default=10, help="faults per seed (the last is last-save)")
    parser.add_argument("--steps", type=int, default=100, help="max_steps of each run")
    parser.add_argument("--run-root", type=Path, default=None, help="where the run dirs go (default: /tmp/soak-DATE)")
    parser.add_argument("--smoke", action="store_true", help="CI's short run: --trials 3 --steps 40")
    parser.add_argument(
        "--out", type=Path, default=None, help="the results file (default: bench/results/soak-DATE.json)"
    )
    parser.add_argument(
        "--report", type=Path, nargs="+", default=None, help="print the tables of these results files, run nothing"
    )
    args = parser.parse_args()
    if args.report:
        print(report([r for path in args.report for r in load_results(path)]))
        return
    # A TERM (a timeout, a Ctrl-C's TERM) unwinds like an exception: a frozen slurmctld is thawed, a proxy stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.smoke:
        args.trials, args.steps = 3, 40
    stamp = datetime.now().strftime("%Y-%m-%d-%H%M")
    root = args.run_root or Path(f"/tmp/soak-{stamp}")
    out = args.out or REPO / "bench" / "results" / f"soak-{stamp}.json"

    def write(results: list[SeedResult]) -> None:
        shown = {k: str(v) for k, v in vars(args).items()}
        out.write_text(json.dumps({"args": shown, "seeds": [asdict(r) for r in results]}, indent=1))

    results = campaign(seeds_from(args.seeds), args.trials, args.steps, root, write)
    print(report(results))
    print(f"details: {out}")
    failed = sum(bool(r.divergences or r.corrupt) for r in results)
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
