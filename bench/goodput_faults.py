"""Benchmark: the goodput ledger's committed-training share with faults forced on a schedule (issue 29, part 4),
on the local SLURM cluster with real ms-swift (the tiny Qwen3, LoRA, 2 nodes).

    bash scripts/slurm-local.sh up
    .venv/bin/python -m bench.goodput_faults --out bench/results/goodput-faults-DATE.json \
        [--arms save15 save15-requeue save15-lead1 save60] [--lock /tmp/swiftslurm-cluster.lock]

The issue's schedule, a preemption every 30 min of allocation and a worker crash every hour, compressed k = 10
times: every step lasts at least 0.5 s (bench/goodput_plugin.py; a real step of 5 s), the bench sends USR2 to
the job (`scancel --signal=USR2`, SLURM's preemption warning) every 180 s of allocation and SIGKILLs rank 1's
training process every 360 s from 270 s (so the two never coincide). The allocation clock runs only while
squeue says RUNNING: a requeued job's wait in the queue is not allocation. Save intervals are steps, so they
scale with the step. What does not compress is SLURM's and ms-swift's start-up, the model and checkpoint load
and the save's own time: the compressed share is lower than a real run's, and bench/goodput_model.py
projects it to real scale from the per-event costs measured here (`--report` prints both).

Arms (one run each, in the order given; with --lock each run holds the cluster lock only while it runs):

    save60          swift.save_steps=120 (60 s; 10 min real), cluster.signal_lead_s=60, restart in place
    save15          swift.save_steps=30 (15 s; 2.5 min real), the same otherwise
    save15-requeue  save15 with resilience.max_restarts=0: a crash is requeued, as a preemption
    save15-lead1    save15 with cluster.signal_lead_s=1: a warning shorter than the stop save

Each run trains MAX_STEPS steps and ends by itself (a cap of CAP_S of allocation cancels it). Recorded per
arm: the faults as sent, the attempts, `swiftslurm status RUN --json`'s ledger, sacct's rows of the job.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.goodput_model import Costs, Settings, best_save_every, project, relaunch_budget
from swiftslurm.ops import accounting, ledger
from swiftslurm.plan import PlanGlance
from swiftslurm.rundir.layout import attempt_dir, trainer_timeline
from swiftslurm.rundir.records import read_attempts
from swiftslurm.rundir.timeline import read_timeline
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import (
    RUN_ENDED,
    attempts,
    preempt,
    queue_state,
    run_state,
    submit,
    training_workers,
    wait_for_job,
)

K = 10  # compression: step time, save interval and fault intervals are the real ones ÷ K
STEP_S = 0.5  # bench/goodput_plugin.STEP_FLOOR_S (importing it would import ms-swift here)
PREEMPT_EVERY_S = 1800 / K
CRASH_EVERY_S = 3600 / K
CRASH_FIRST_S = 270.0  # halfway between two preemptions
MAX_STEPS = 600
CAP_S = 720.0  # allocation seconds after which a run is cancelled (it should end well before)
POLL_S = 0.5
PLUGIN = str(Path(__file__).resolve().parent / "goodput_plugin.py")
COMMON = (
    f"swift.max_steps={MAX_STEPS}",
    f"swift.external_plugins=[{PLUGIN}]",
    "swift.callbacks=[goodput_step_floor]",
    "swift.logging_steps=5",
)
ARMS: dict[str, tuple[str, ...]] = {
    "save60": ("swift.save_steps=120", "cluster.signal_lead_s=60"),
    "save15": ("swift.save_steps=30", "cluster.signal_lead_s=60"),
    "save15-requeue": (
        "swift.save_steps=30",
        "cluster.signal_lead_s=60",
        "resilience.max_restarts=0",
        "resilience.backoff_base_s=0",
    ),
    "save15-lead1": ("swift.save_steps=30", "cluster.signal_lead_s=1"),
}


@dataclass
class Fault:
    kind: str  # "preempt" (USR2 to the job), "crash" (SIGKILL of rank 1's trainer), "cap" (scancel)
    allocation_s: float  # the allocation clock when it was sent
    at: float  # epoch seconds
    due_s: float  # when the schedule wanted it (a crash waits for a rank 1 to kill)


class Schedule:
    """The faults due on the allocation clock."""

    def __init__(self) -> None:
        self.clock = 0.0
        self.next_preempt = PREEMPT_EVERY_S
        self.next_crash = CRASH_FIRST_S
        self.faults: list[Fault] = []

    def tick(self, dt: float, running: bool) -> None:
        if running:
            self.clock += dt

    def sent(self, kind: str, due_s: float) -> None:
        self.faults.append(Fault(kind, round(self.clock, 2), round(time.time(), 3), due_s))


def rank1_pid(run_dir: Path) -> int | None:
    return next((pid for rank, pid in training_workers(run_dir) if rank == 1), None)


def drive(run_dir: Path, job: str) -> Schedule:
    """Send the faults on the schedule until the run ends (or the cap)."""
    schedule = Schedule()
    last = time.monotonic()
    while True:
        time.sleep(POLL_S)
        now = time.monotonic()
        state = queue_state(job)
        schedule.tick(now - last, state == "RUNNING")
        last = now
        if run_state(run_dir) in RUN_ENDED and state != "RUNNING":
            return schedule
        if state is None and run_state(run_dir) not in ("requeued", "restarting", "running", None):
            return schedule
        if schedule.clock >= CAP_S:
            subprocess.run(["scancel", job], check=False)
            schedule.sent("cap", CAP_S)
            return schedule
        if state != "RUNNING":
            continue
        if schedule.clock >= schedule.next_preempt:
            preempt(job)
            schedule.sent("preempt", schedule.next_preempt)
            schedule.next_preempt += PREEMPT_EVERY_S
        if schedule.clock >= schedule.next_crash and (pid := rank1_pid(run_dir)) is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                schedule.sent("crash", schedule.next_crash)
                schedule.next_crash += CRASH_EVERY_S


def sacct_rows(job: str) -> list[dict[str, str]]:
    fields = ("JobID", "Submit", "Start", "End", "ElapsedRaw", "AllocNodes", "State")
    argv = ["sacct", "-D", "-X", "-n", "-P", "-j", job, "-o", ",".join(fields)]
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line.strip()]


def status_ledger(run_dir: Path) -> dict[str, Any]:
    done = swiftslurm("status", str(run_dir), "--json", cwd=run_dir.parent)
    if done.returncode != 0:
        raise RuntimeError(f"status --json failed: {done.stderr[-2000:]}")
    ledger: dict[str, Any] = json.loads(done.stdout)["runs"][0]["ledger"]
    return ledger


@contextlib.contextmanager
def cluster_lock(path: Path | None) -> Iterator[None]:
    """The shared cluster's lock for one run (other sessions measure on it between our runs)."""
    if path is None:
        yield
        return
    with open(path, "a") as held:  # opened close-on-exec: the daemons a run starts do not inherit it
        fcntl.flock(held, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(held, fcntl.LOCK_UN)


def one_arm(name: str, run_root: Path, lock: Path | None) -> dict[str, Any]:
    run_dir = Path(tempfile.mkdtemp(dir=run_root, prefix=f"{name}-")) / "run"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    overrides = (*COMMON, *ARMS[name])
    with cluster_lock(lock):
        started = time.time()
        job = submit(run_dir, *overrides)
        schedule = drive(run_dir, job)
        final = wait_for_job(job, timeout_s=300)
        wall = time.time() - started
    rows = sacct_rows(job)
    allocated = sum(int(r["ElapsedRaw"]) * int(r["AllocNodes"]) for r in rows)
    ledger = status_ledger(run_dir)
    keys = ("attempt", "reason", "decision", "resume_step", "committed_step", "last_step")
    return {
        "arm": name,
        "overrides": list(overrides),
        "run_dir": str(run_dir),
        "job": job,
        "state": final,
        "wall_s": round(wall, 1),
        "allocation_clock_s": round(schedule.clock, 1),
        "faults": [asdict(f) for f in schedule.faults],
        "attempts": [{k: a.get(k) for k in keys} for a in attempts(run_dir)],
        "sacct": rows,
        "sacct_allocated_s": allocated,
        "ledger": ledger,
    }


def describe(result: dict[str, Any]) -> str:
    ledger = result["ledger"]
    spent = ", ".join(f"{k} {v:.0f}" for k, v in ledger["spent_s"].items() if v)
    kinds = [f["kind"] for f in result["faults"]]
    return (
        f"{result['arm']}: job {result['job']} {result['state']}, {result['wall_s']:.0f} s wall; faults {kinds}; "
        f"attempts {[(a['reason'], a['decision']) for a in result['attempts']]}; allocated "
        f"{ledger['allocated_s']:.0f} (sacct {result['sacct_allocated_s']}); goodput {ledger['goodput']}; {spent}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--out", type=Path, required=True, help="JSON file of the arms' results (rewritten per arm)")
    parser.add_argument("--run-root", type=Path, help="where the run dirs go (kept: the report reads them)")
    parser.add_argument("--lock", type=Path, help="flock this file around each run (a shared cluster)")
    parser.add_argument("--costs", action="store_true", help="add per-event costs to --out from its run dirs")
    parser.add_argument("--report", action="store_true", help="print the tables of --out (no run)")
    args = parser.parse_args()
    if args.costs:
        args.out.write_text(json.dumps([add_costs(r) for r in json.loads(args.out.read_text())], indent=1) + "\n")
    if args.report or args.costs:
        print(report(args.out))
        return
    if shutil.which("sbatch") is None:
        sys.exit("no SLURM here: start the local cluster with `bash scripts/slurm-local.sh up`")
    run_root = (args.run_root or Path(tempfile.mkdtemp(prefix="swiftslurm-goodput-"))).resolve()
    run_root.mkdir(parents=True, exist_ok=True)
    print(f"run root: {run_root}", flush=True)
    results: list[dict[str, Any]] = json.loads(args.out.read_text()) if args.out.exists() else []
    for name in args.arms:
        result = add_costs(one_arm(name, run_root, args.lock))
        print(describe(result), flush=True)
        results.append(result)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


# ---------------------------------------------------------------------------------------------
# Per-event costs, read back from a run dir: the ledger's split, attempt by attempt
# ---------------------------------------------------------------------------------------------


def job_runs(rows: list[dict[str, str]]) -> list[tuple[float, float, int]]:
    """(Start, End, nodes) of each run of the job, from sacct's rows."""
    runs = []
    for row in rows:
        if row["Start"] in ("", "Unknown", "None") or row["End"] in ("", "Unknown", "None"):
            continue
        runs.append((local_time(row["Start"]), local_time(row["End"]), int(row["AllocNodes"])))
    return sorted(runs)


def local_time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def attempt_splits(run_dir: Path, rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Each attempt's share of the ledger (wall seconds per category; the ledger's own marks and split, cut at
    the next attempt of the same job run), with its reason, decision and trainer timeline. A job run's
    start-up before its first attempt is that attempt's; a later attempt's preparation is its restart."""
    records = read_attempts(run_dir)
    marked = [
        (r, ledger.attempt_marks(r, read_timeline(trainer_timeline(attempt_dir(run_dir, r.attempt))))) for r in records
    ]
    out = []
    for start, end, _ in job_runs(rows):
        inside = sorted(
            ((r, m) for r, m in marked if start - ledger.SLACK_S <= m.began <= end + ledger.SLACK_S),
            key=lambda pair: pair[1].began,
        )
        for n, (record, marks) in enumerate(inside):
            own = [ledger.Mark(x.at, "restart") if n and x.category == "startup" else x for x in marks.marks]
            begin = start if n == 0 else marks.began
            until = inside[n + 1][1].began if n + 1 < len(inside) else end
            lead = [ledger.Mark(start, "startup")] if n == 0 else []
            out.append(
                {
                    "attempt": record.attempt,
                    "reason": record.reason,
                    "decision": record.decision,
                    "first_in_job_run": n == 0,
                    "spent_s": ledger.split(sorted([*lead, *own], key=lambda m: m.at), begin, until),
                    "events": read_timeline(trainer_timeline(attempt_dir(run_dir, record.attempt))),
                }
            )
    return out


def event_costs(splits: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Seconds per event of each kind, over the attempts of one run (lists: one value per event)."""
    costs: dict[str, list[float]] = {
        k: []
        for k in (
            "startup",
            "restore",
            "load",
            "requeue",
            "crash_restart",
            "stop_save",
            "save",
            "first_start",
            "finish",
            "lost_per_crash",
            "lost_per_preemption",
        )
    }
    for n, split in enumerate(splits):
        spent: dict[str, float] = split["spent_s"]
        if split["first_in_job_run"]:
            costs["startup"].append(spent.get("startup", 0.0))
        if n == 0:
            costs["first_start"].append(spent.get("startup", 0.0) + spent.get("restore", 0.0) + spent.get("load", 0.0))
        costs["restore"].append(spent.get("restore", 0.0))
        costs["load"].append(spent.get("load", 0.0))
        saves = [e for e in split["events"] if e.get("event") == "save"]
        ends = [e for e in split["events"] if e.get("event") == "train_end"]
        stopped = split["reason"] == "preempted"
        if stopped and saves and ends:
            costs["stop_save"].append(saves[-1]["t"] - saves[-1]["started"] + ends[-1]["t"] - ends[-1]["started"])
            saves = saves[:-1]
        costs["save"] += [e["t"] - e["started"] for e in saves]
        if stopped:
            costs["requeue"].append(spent.get("restart", 0.0))
            costs["lost_per_preemption"].append(spent.get("lost", 0.0))
        if split["reason"] == "infra":
            following = splits[n + 1]["spent_s"].get("restart", 0.0) if n + 1 < len(splits) else 0.0
            in_place = split["decision"] == "restart"
            costs["crash_restart"].append(spent.get("restart", 0.0) + (following if in_place else 0.0))
            costs["lost_per_crash"].append(spent.get("lost", 0.0))
        if split["decision"] in ledger.FINAL_DECISIONS:
            costs["finish"].append(spent.get("finish", 0.0))
    return {k: [round(v, 3) for v in values] for k, values in costs.items()}


def recorded_ledger(result: dict[str, Any]) -> dict[str, Any]:
    """The run's ledger as `status --json` computes it, from the sacct rows the bench recorded when the job
    ended: `status` asks sacct again, and on this shared cluster another session may restart it (a new
    accounting database, job ids from 1 again) between the job's end and that question."""
    rows = [
        {
            "job_id": result["job"],
            "raw_id": result["job"],
            "state": r["State"],
            "submit": local_time(r["Submit"]),
            "start": start,
            "end": end,
            "nodes": nodes,
        }
        for r, (start, end, nodes) in zip(result["sacct"], job_runs(result["sacct"]), strict=True)
    ]
    run_dir = Path(result["run_dir"])
    return accounting.run_ledger(run_dir, PlanGlance.read(run_dir), {result["job"]: rows}).as_dict()


def add_costs(result: dict[str, Any]) -> dict[str, Any]:
    """The result with its run's per-event costs and its ledger from the recorded sacct rows (the run dir must
    still be there)."""
    splits = attempt_splits(Path(result["run_dir"]), result["sacct"])
    return {
        **result,
        "status_ledger": result.get("status_ledger", result["ledger"]),
        "ledger": recorded_ledger(result),
        "costs": event_costs(splits),
        "splits": [{k: v for k, v in s.items() if k != "events"} for s in splits],
    }


# ---------------------------------------------------------------------------------------------
# Report: the measured arms, the model against them, the model at real scale
# ---------------------------------------------------------------------------------------------

SAVE_STEPS = {"save60": 120, "save15": 30, "save15-requeue": 30, "save15-lead1": 30}
CATEGORY_ORDER = ("startup", "restore", "load", "committed", "lost", "save", "restart", "finish")
REAL_HORIZON_S = 24 * 3600.0  # a day of allocation: the first start and the finish are spread over it
# Checkpoint sizes at real scale, seconds (docs/resilience.md "Save budget"): a periodic save is the write
# (the commit runs beside training); a stop save is signal -> committed.
REAL_SAVES = {
    "tiny LoRA (as measured)": None,
    "1 GB checkpoint (save 3 s, stop save 4 s)": (3.0, 4.0),
    "1.6B full, ZeRO-3, 22.6 GB (save 31 s, stop save 52 s)": (31.0, 52.0),
}


def pooled(results: list[dict[str, Any]], key: str, arms: tuple[str, ...] | None = None) -> list[float]:
    return [v for r in results if arms is None or r["arm"] in arms for v in r["costs"][key]]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def measured_costs(results: list[dict[str, Any]]) -> Costs:
    """Medians over every arm's events; a crash's restart from the arms that restart in place."""
    in_place = tuple(r["arm"] for r in results if "requeue" not in r["arm"])
    return Costs(
        startup_s=median(pooled(results, "startup")),
        restore_s=median(pooled(results, "restore")),
        load_s=median(pooled(results, "load")),
        requeue_s=median(pooled(results, "requeue", in_place)),
        crash_restart_s=median(pooled(results, "crash_restart", in_place)),
        stop_save_s=median(pooled(results, "stop_save", tuple(a for a in in_place if "lead1" not in a))),
        save_s=median(pooled(results, "save")),
        first_start_s=median(pooled(results, "first_start")),
        finish_s=median(pooled(results, "finish")),
    )


LEAD_S = {"save15-lead1": 1.0}  # cluster.signal_lead_s of each arm; 60 s otherwise (not compressed: a setting)


def arm_settings(arm: str, step_s: float, costs: Costs, k: float = 1.0) -> Settings:
    """The arm's settings. The 1 s lead is short: in its run the stop save (the step in progress, the stop vote,
    the save, the commit) did not commit within it and the trainer was killed (measured, not modelled)."""
    lead = LEAD_S.get(arm, 60.0)
    return Settings(
        save_every_s=SAVE_STEPS[arm] * step_s,
        preempt_every_s=PREEMPT_EVERY_S * k,
        crash_every_s=CRASH_EVERY_S * k,
        restart_in_place="requeue" not in arm,
        warned=arm not in LEAD_S,
        lead_s=lead,
    )


def arm_costs(result: dict[str, Any], everyone: Costs) -> Costs:
    """The run's own means per event (the check of the model against the run's ledger: a mean times the count is
    the run's total); the pooled medians for a kind of event it did not have."""
    own = {
        "startup_s": "startup",
        "restore_s": "restore",
        "load_s": "load",
        "requeue_s": "requeue",
        "crash_restart_s": "crash_restart",
        "stop_save_s": "stop_save",
        "save_s": "save",
        "first_start_s": "first_start",
        "finish_s": "finish",
    }
    values = result["costs"]
    return replace(everyone, **{f: statistics.fmean(values[k]) for f, k in own.items() if values[k]})


def cost_table(results: list[dict[str, Any]]) -> str:
    lines = ["| per event, seconds (per node) | n | min | median | max |", "| --- | ---: | ---: | ---: | ---: |"]
    for key in (
        "startup",
        "restore",
        "load",
        "first_start",
        "stop_save",
        "save",
        "requeue",
        "crash_restart",
        "lost_per_crash",
        "lost_per_preemption",
        "finish",
    ):
        values = pooled(results, key)
        if values:
            lines.append(f"| {key} | {len(values)} | {min(values):.2f} | {median(values):.2f} | {max(values):.2f} |")
    return "\n".join(lines)


def arm_table(results: list[dict[str, Any]], costs: Costs) -> str:
    head = "| arm | faults (preempt/crash) | attempts | allocated s (sacct) | " + " | ".join(CATEGORY_ORDER)
    lines = [head + " | share (ledger) | model | model ÷ ledger |", "|" + " --- |" * (len(CATEGORY_ORDER) + 7)]
    for r in results:
        led, nodes = r["ledger"], 2  # local-slurm: 2 nodes of 1 CPU process: device-seconds ÷ 2 = per node
        per_node = {c: led["spent_s"].get(c, 0.0) / nodes for c in CATEGORY_ORDER}
        step_s = per_node["committed"] / MAX_STEPS
        kinds = [f["kind"] for f in r["faults"]]
        preempts, crashes = kinds.count("preempt"), kinds.count("crash")
        own = arm_costs(r, costs)
        model = project(own, arm_settings(r["arm"], step_s, own), led["allocated_s"] / nodes, preempts, crashes)
        shares = " | ".join(f"{per_node[c]:.0f}" for c in CATEGORY_ORDER)
        lines.append(
            f"| {r['arm']} | {preempts}/{crashes} | {len(r['attempts'])} | {r['sacct_allocated_s']} | {shares} | "
            f"{led['goodput']:.3f} | {model.share:.3f} | {model.share / led['goodput']:.3f} |"
        )
    return "\n".join(lines)


def real_table(results: list[dict[str, Any]], costs: Costs) -> str:
    """Each arm's settings at real scale (step, save interval and fault intervals × K; start-up, load, restart
    as measured), with three checkpoint sizes; and the best save interval with restart in place."""
    step_s = STEP_S * K
    lines = [
        "| arm, real scale | checkpoint | save every | share | start-up + load per relaunch for 0.95 |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    arms = [r["arm"] for r in results]
    for name, saves in REAL_SAVES.items():
        sized = costs if saves is None else replace(costs, save_s=saves[0], stop_save_s=saves[1])
        rate = replace(sized, first_start_s=0.0, finish_s=0.0)
        for arm in [*dict.fromkeys(arms), "best"]:
            base = arm_settings("save15" if arm == "best" else arm, step_s, sized, K)
            if arm == "best":
                every = best_save_every(rate, base, REAL_HORIZON_S, [float(s) for s in range(10, 3601, 5)])
                base = replace(base, save_every_s=every)
            share = project(rate, base, REAL_HORIZON_S).share
            budget = relaunch_budget(rate, base, REAL_HORIZON_S, 0.95)
            shown = f"{budget:.0f} s" if budget >= 0 else "unreachable"
            label = "best interval, restart in place" if arm == "best" else arm
            lines.append(f"| {label} | {name} | {base.save_every_s:.0f} s | {share:.3f} | {shown} |")
    return "\n".join(lines)


def report(path: Path) -> str:
    results = [r for r in json.loads(path.read_text()) if "costs" in r]
    costs = measured_costs(results)
    return (
        f"measured per-event costs (all arms):\n\n{cost_table(results)}\n\nmodel inputs (medians): {costs}\n\n"
        f"compressed runs (k = {K}), seconds per node:\n\n{arm_table(results, costs)}\n\n"
        f"real scale (k = 1: step {STEP_S * K:.0f} s, preempt every {PREEMPT_EVERY_S * K:.0f} s, crash every "
        f"{CRASH_EVERY_S * K:.0f} s, {REAL_HORIZON_S / 3600:.0f} h of allocation):\n\n{real_table(results, costs)}"
    )


if __name__ == "__main__":
    main()
