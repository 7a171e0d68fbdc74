"""`megatron sft` through swiftslurm's node wrapper on H200s: trained, signalled mid-run, committed, requeued,
resumed at the saved iteration + 1, finished; final loss against an uninterrupted run of the same plan. And
the wrapper's cost: iterations/s under swiftslurm ÷ the same command run directly. See docs/gpu.md.

    python -m tests.gpu.gpu_megatron --assets DIR --out OUT matrix [--cases full,lora,moe] [--gpus 1]
    python -m tests.gpu.gpu_megatron --assets DIR --out OUT overhead [--pairs 3] [--case full] [--warmup]
        [--first-pair K] [--partial-arms plugin,callbacks] [--concurrent]

The assets are ../shared/gpu-megatron's random Qwen3 (make_assets.py: DIR/model, DIR/train.jsonl) and
Qwen3-MoE (make_moe.py: DIR/moe). Jobs are emulated as in tests/gpu/gpu_matrix.py (gpu_common.FakeJob: srun's
environment per node, scontrol stand-in, SIGUSR2 as SLURM's `--signal`, TERM + KILL at a requeue).
Progress is read where the engine adapter reads it (output/logging.jsonl: Megatron's last rank writes it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import tarfile
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swiftslurm.engines.megatron import MegatronEngine
from swiftslurm.plan import JobPlan
from swiftslurm.render import swift_command
from swiftslurm.rundir.layout import METRICS
from swiftslurm.slurm_env import SlurmEnv, rank_env
from swiftslurm.testing.gpu import (
    REPO,
    FakeJob,
    committed_steps,
    hosts_for,
    plain_swift_argv,
    plan_run,
    read_jsonl,
    spread,
)

ENGINE = MegatronEngine()


@dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]
    gpus: int = 1
    moe: bool = False


CASES = {
    "full": Case("full", ("strategy.tuner_type=full",)),
    "lora": Case("lora", ("strategy.tuner_type=lora",)),
    "moe": Case("moe", ("strategy.tuner_type=full",), moe=True),
    # 2 GPUs (nvidia-h200-x2)
    "tp2": Case("tp2", ("strategy.tuner_type=full", "strategy.tp=2"), gpus=2),
    "pp2": Case("pp2", ("strategy.tuner_type=full", "strategy.pp=2"), gpus=2),
    "ep2": Case("ep2", ("strategy.tuner_type=full", "strategy.ep=2"), gpus=2, moe=True),
    "tp2_lora": Case("tp2_lora", ("strategy.tuner_type=lora", "strategy.tp=2"), gpus=2),
}


def overrides(args: argparse.Namespace, case: Case, run_name: str, save_steps: int) -> list[str]:
    assets = Path(args.assets)
    model = ["model.id=" + str(assets / "moe"), "swift.model_type=qwen3_moe"] if case.moe else []
    return [
        "+cluster=h200x2",
        f"cluster.gpus_per_node={case.gpus}",
        "task=megatron_sft",
        "strategy=megatron",
        "model=qwen3-0.5b-random",
        f"model.id={assets / 'model'}",
        f"dataset=['{assets / 'train.jsonl'}']",
        # The HF-Trainer spellings of the model group's defaults are not Megatron arguments.
        "~model.swift.report_to",
        "~model.swift.learning_rate",
        "swift.lr=1e-4",
        "swift.attention_backend=fused",  # the default (flash) needs flash-attn, absent here
        "swift.bf16=true",
        f"swift.train_iters={args.iters}",
        f"swift.save_steps={save_steps}",
        "swift.logging_steps=1",
        f"micro_batch_size={args.micro_batch}",
        f"global_batch_size={args.micro_batch * 4}",
        f"run_name={run_name}",
        *model,
        *case.overrides,
        *args.override,
    ]


# Megatron-SWIFT's progress line, `"iteration": "K/N"`, which its last rank writes to output/logging.jsonl.
ITERATION = re.compile(r'"iteration": "(\d+)/(\d+)"')


def progress(run_dir: Path, offset: int = 0) -> list[tuple[int, int]]:
    """(iteration, planned last) of every progress line after byte ``offset`` of output/logging.jsonl."""
    path = run_dir / "output" / METRICS
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except FileNotFoundError:
        return []
    return [(int(k), int(n)) for k, n in ITERATION.findall(text)]


def size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else 0


def losses(run_dir: Path) -> dict[int, float]:
    return {
        int(str(e["iteration"]).split("/")[0]): float(e["loss"])
        for e in read_jsonl(run_dir / "output" / "logging.jsonl")
        if "loss" in e and "iteration" in e
    }


def run_job(
    args: argparse.Namespace, case: Case, root: Path, job_id: int, preempt: bool, save_steps: int = 0
) -> dict[str, Any]:
    """One emulated job, preempted once at `--preempt-at` if asked; returns what the run dir says."""
    started = time.time()
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run_dir = root / "run"
    result: dict[str, Any] = {"case": case.name, "preempt": preempt, "ok": False}
    job: FakeJob | None = None
    try:
        saves = save_steps or args.save_steps
        plan_run(run_dir, overrides(args, case, f"mg-{case.name}", saves), os.environ, root / "plan.log")
        job = FakeJob(job_id, hosts_for(["gpu-n0"]), [list(range(case.gpus))], root / "slurm", dict(os.environ))
        job.start(run_dir, root)
        signalled, offset = False, 0
        while time.time() < started + args.case_timeout_s:
            time.sleep(0.2)
            steps = progress(run_dir)
            if preempt and not signalled and steps and steps[-1][0] >= args.preempt_at:
                job.signal(signal.SIGUSR2)
                result["usr2_at_iteration"], result["usr2_at_s"] = steps[-1][0], round(time.time() - started, 1)
                signalled = True
            if job.requeued():
                job.end_for_requeue()
                offset = size(run_dir / "output" / "logging.jsonl")
                result["requeued_at_s"] = round(time.time() - started, 1)
                job.start(run_dir, root)
                continue
            if not job.running():
                break
        else:
            result["error"] = f"timed out after {args.case_timeout_s:.0f} s"
            job.kill()
        result["exit_codes"] = job.exit_codes()
        resumed = progress(run_dir, offset) if offset else []
        result["resumed_first_iteration"] = resumed[0][0] if resumed else None
        result |= check(run_dir, args.iters, preempt)
    except Exception as err:  # one case's failure must not end the others
        result["error"] = f"{err!r}\n{traceback.format_exc()[-1500:]}"
        if job is not None:
            job.kill()
    result["seconds"] = round(time.time() - started, 1)
    return result


def check(run_dir: Path, iters: int, preempt: bool) -> dict[str, Any]:
    attempts = read_jsonl(run_dir / "attempts.jsonl")
    status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").is_file() else {}
    committed = sorted(
        {step for log in run_dir.glob("logs/*/node*.log") for step in committed_steps(log.read_text(errors="replace"))}
    )
    found: dict[str, Any] = {
        "status": status.get("state"),
        "attempts": [
            {k: a.get(k) for k in ("attempt", "reason", "exit_code", "resume_step", "last_step", "committed_step")}
            for a in attempts
        ],
        "committed_steps": committed,
        "final_loss": losses(run_dir).get(iters),
        "losses": losses(run_dir),
    }
    problems = []
    if preempt:
        if len(attempts) != 2:
            problems.append(f"{len(attempts)} attempts, expected 2")
        else:
            first, second = attempts
            found["saved_step"] = first.get("committed_step")
            if first.get("reason") != "preempted":
                problems.append(f"attempt 1 ended {first.get('reason')}: {first.get('why')}")
            if second.get("resume_step") != first.get("committed_step"):
                problems.append(f"attempt 2 resumed from {second.get('resume_step')}")
    if iters not in committed:
        problems.append(f"no commit of checkpoint-{iters}")
    if status.get("state") != "finished":
        problems.append(f"status {status.get('state')}: {status.get('why')}")
    found["ok"], found["why"] = not problems, "; ".join(problems)
    return found


def matrix(args: argparse.Namespace) -> list[dict[str, Any]]:
    names = [n for n in args.cases.split(",") if n]
    jobs = [(CASES[n], preempt) for n in names for preempt in (True, False)]

    def one(item: tuple[int, tuple[Case, bool]]) -> dict[str, Any]:
        index, (case, preempt) = item
        root = Path(args.runs) / f"{case.name}-{'preempted' if preempt else 'reference'}"
        return run_job(args, case, root, 8100 + index, preempt)

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        results = list(pool.map(one, enumerate(jobs)))
    for case in names:
        hit = next(r for r in results if r["case"] == case and r["preempt"])
        ref = next(r for r in results if r["case"] == case and not r["preempt"])
        a, b = hit.get("final_loss"), ref.get("final_loss")
        hit["reference_final_loss"] = b
        hit["loss_abs_diff"] = abs(a - b) if a is not None and b is not None else None
        common = sorted(set(hit.get("losses", {})) & set(ref.get("losses", {})))
        hit["max_loss_abs_diff_all_iterations"] = max(
            (abs(hit["losses"][i] - ref["losses"][i]) for i in common), default=None
        )
        ok = hit["ok"] and ref["ok"] and (hit.get("resumed_first_iteration") or 0) == (hit.get("saved_step") or -1) + 1
        print(
            f"[megatron] {case:8s} ok={ok} saved={hit.get('saved_step')} "
            f"resumed_at={hit.get('resumed_first_iteration')}"
            f" commits={hit.get('committed_steps')} loss@{args.iters}={a} reference={b} "
            f"max|diff|={hit['max_loss_abs_diff_all_iterations']} {hit.get('why', '')}{hit.get('error', '')[:400]}",
            flush=True,
        )
    return results


TIMER = REPO / "tests" / "gpu" / "megatron_call_timer.py"  # both arms get it: the per-callback breakdown
CALL_TIMES_ENV = "SWIFTSLURM_BENCH_CALL_TIMES"
# The arms besides the two the pairs compare: what swiftslurm adds, a part at a time.
#   plugin:    the direct command plus swiftslurm's plugin imported (signal masks, stack dump), no callbacks
#   callbacks: the plan's own command (plugin and callbacks) without the wrapper
#   blocks:    the wrapper, swiftslurm's parts switched off and on in blocks inside one run (megatron_call_timer)
PARTIAL_ARMS = ("plugin", "callbacks", "blocks")


def arm_argv(plan_argv: list[str], arm: str) -> list[str]:
    """The command an arm runs without the wrapper: ``direct`` has neither swiftslurm's plugin nor its callbacks,
    ``plugin`` the plugin only, ``callbacks`` both (the plan's argv as the wrapper would start it)."""
    if arm == "callbacks":
        return list(plan_argv)
    plain = plain_swift_argv(plan_argv, ENGINE)
    if arm == "direct":
        return plain
    if "--external_plugins" in plain:  # the timer's: swiftslurm's goes beside it
        at = plain.index("--external_plugins") + 1
        return [*plain[:at], str(ENGINE.plugin), *plain[at:]]
    return [*plain, "--external_plugins", str(ENGINE.plugin)]


def unwrapped_run(args: argparse.Namespace, case: Case, root: Path, job_id: int, arm: str) -> dict[str, Any]:
    """The same plan's command without the wrapper (`arm_argv`), with the wrapper's environment for the rank."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run_dir = root / "run"
    plan_run(run_dir, overrides(args, case, f"mg-{case.name}", args.iters), os.environ, root / "plan.log")
    plan = JobPlan.load(run_dir / "plan.json")
    job = FakeJob(job_id, hosts_for(["gpu-n0"]), [list(range(case.gpus))], root / "slurm", dict(os.environ))
    node_env = job.node_env(0)
    env = {**node_env, **dict(plan.env), **rank_env(SlurmEnv.from_environ(node_env), plan)}
    env[CALL_TIMES_ENV] = str(root / "call-times.json")
    argv = arm_argv(list(swift_command(plan)), arm)
    started = time.time()
    with open(root / f"{arm}.log", "wb") as log:
        code = subprocess.call(argv, env=env, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT)
    return {"exit_code": code, "wall_s": round(time.time() - started, 1), **speed(run_dir)}


def wrapped_run(args: argparse.Namespace, case: Case, root: Path, job_id: int, toggle_block: int = 0) -> dict[str, Any]:
    """The node wrapper, saved only at the end as the other arms: no save inside the window measured. With
    ``toggle_block``, swiftslurm's parts are switched off and on in blocks inside the run (megatron_call_timer)."""
    added = {CALL_TIMES_ENV: str(root / "call-times.json")}  # FakeJob copies os.environ into each node
    if toggle_block:
        added[TOGGLE_ENV] = str(toggle_block)
    os.environ.update(added)
    try:
        row = run_job(args, case, root, job_id, preempt=False, save_steps=args.iters) | speed(root / "run")
    finally:
        for name in added:
            del os.environ[name]
    row.pop("losses", None)
    row["wrapper_cpu"] = wrapper_cpu_lines(root)  # the wrappers' own logs (FakeJob: root/wrapperN.rK.log)
    return row


def wrapper_cpu_lines(run_dir: Path) -> list[str]:
    """The wrapper's own account of its CPU time while training ran (watch.py's line in each node log)."""
    return [
        line.strip()
        for log in sorted(run_dir.rglob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if "[swiftslurm] wrapper:" in line
    ]


TOGGLE_ENV = "SWIFTSLURM_BENCH_TOGGLE_BLOCK"
PHASES = ("all on", "wrapper stopped", "swiftslurm callbacks skipped", "both")


def phase_paces(durations: list[tuple[int, float]], phases: dict[int, int]) -> dict[str, Any]:
    """Median iteration time per phase of a toggled run, and each phase's pace ÷ the all-on phase's (above 1:
    that part costs). The first iteration of each block is left out: the switch happens inside it."""
    by_phase: dict[int, list[float]] = {}
    for k, d in durations:
        if k in phases and phases.get(k - 1) == phases[k]:
            by_phase.setdefault(phases[k], []).append(d)
    medians = {p: statistics.median(v) for p, v in by_phase.items()}
    base = medians.get(0)
    return {
        PHASES[p]: {
            "median_s": round(m, 5),
            "iterations": len(by_phase[p]),
            "pace_vs_all_on": round(base / m, 4) if base else None,
        }
        for p, m in sorted(medians.items())
    }


def speed(run_dir: Path) -> dict[str, Any]:
    """Iterations/s from train begin to the last iteration: Megatron's own `train_speed(s/it)` at the last
    logged iteration, so start-up and saving are outside the window in both arms alike. And the steady pace:
    the median of the single iterations after the first WARM_ITERATIONS (a warm-up kernel choice or one slow
    iteration of the shared host moves the window's mean, not this)."""
    rows = [e for e in read_jsonl(run_dir / "output" / "logging.jsonl") if "train_speed(s/it)" in e]
    if not rows:
        return {"error": "no speed"}
    durations = [d for _, d in iteration_durations(rows)]
    steady = durations[WARM_ITERATIONS:] or durations
    return {
        "it_per_s": round(1 / float(rows[-1]["train_speed(s/it)"]), 4),
        "steady_it_per_s": round(1 / statistics.median(steady), 4) if steady else None,
        "iteration_s": [round(d, 5) for d in durations],
    }


WARM_ITERATIONS = 5


def iteration_durations(rows: list[dict[str, Any]]) -> list[tuple[int, float]]:
    """(iteration, its duration) of each logged iteration, from Megatron-SWIFT's progress rows (logging_steps=1)
    of the last trainer run in them: its `train_speed(s/it)` is the time since train begin over the iterations
    since then, so iteration K's elapsed time is pace × (K - first + 1), and the differences are the single
    iterations.
    Rows without a pace (an evaluation's) are skipped; a row that goes back starts another run (resumed from an
    older checkpoint). A run resumed right after the last row cannot be told from its rows: the bench's are fresh."""
    points: list[tuple[int, float]] = []
    for row in rows:
        done = str(row.get("iteration", "")).split("/")[0]
        if done.isdigit() and row.get("train_speed(s/it)") is not None:
            if points and int(done) <= points[-1][0]:
                points = []
            points.append((int(done), float(row["train_speed(s/it)"])))
    if not points:
        return []
    start = points[0][0] - 1  # the iteration the loop began after (0 on a fresh run)
    elapsed = [(k, pace * (k - start)) for k, pace in points]
    return [(k, (t - t0) / (k - k0)) for (k0, t0), (k, t) in itertools.pairwise(elapsed) if k > k0]


def overhead(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Interleaved pairs (the order alternates, so drift on the shared host hits both arms alike), after a
    discarded warm-up run; with `--partial-arms`, one run of each partial arm after each pair. Every run is
    appended to OUT/megatron-overhead.jsonl as it ends, so a call cut short keeps what it measured, and
    `--first-pair` continues the numbering in a later call on the same warm machine. With `--concurrent`, a
    pair's two arms train at the same time on the one GPU and are compared over the seconds both trained
    (`side_by_side`): the machine's state between runs (one lent H100 ran either near 230 or near 390 ms an
    iteration, switching mid-run) is then the same for both arms."""
    case, rows = CASES[args.case], list[dict[str, Any]]()
    args.override = [*args.override, f"swift.external_plugins=['{TIMER}']"]
    log = Path(args.out) / "megatron-overhead.jsonl"
    plan: list[tuple[int, str]] = [(-1, "warmup")] if args.warmup else []
    for pair in range(args.first_pair, args.first_pair + args.pairs):
        plan += [(pair, arm) for arm in (("swiftslurm", "direct") if pair % 2 == 0 else ("direct", "swiftslurm"))]
        plan += [(pair, arm) for arm in args.partial_arms.split(",") if arm]
    if args.concurrent:
        plan = [item for item in plan if item[1] in ("warmup", "swiftslurm", "direct")]
    steps = [[item] for item in plan if item[1] == "warmup"]
    for pair in sorted({p for p, _ in plan if p >= 0}):
        arms = [item for item in plan if item[0] == pair]
        steps += [arms[:2], *[[item] for item in arms[2:]]] if args.concurrent else [[item] for item in arms]
    for step in steps:
        # Distinct job ids: the master port is derived from it, and side-by-side arms share the host.
        ids = [8200 + len(rows) + k for k in range(len(step))]
        with ThreadPoolExecutor(max_workers=len(step)) as pool:
            done = list(pool.map(lambda item, job: overhead_run(args, case, item[0], item[1], job), step, ids))
        if len(done) == 2:
            side_by_side(done)
        for row in done:
            rows.append(row)
            with open(log, "a") as f:
                f.write(json.dumps(row) + "\n")
            pace = f"{row.get('it_per_s')} it/s, steady {row.get('steady_it_per_s')}"
            pace += f", side by side {row.get('overlap_it_per_s')}"
            print(f"[overhead] pair {row['pair']} {row['arm']}: {pace}", flush=True)
    summary = pair_ratios(rows)
    print(f"[overhead] swiftslurm / direct: {json.dumps(summary)}", flush=True)
    return [*rows, summary]


def overhead_run(args: argparse.Namespace, case: Case, pair: int, arm: str, job_id: int) -> dict[str, Any]:
    """One run of one arm: its speed, and its per-callback times and iteration ends (megatron_call_timer)."""
    root = Path(args.runs) / f"overhead-{pair}-{arm}"
    began = time.time()
    if arm == "swiftslurm":
        row = wrapped_run(args, case, root, job_id)
    elif arm == "blocks":
        planned, args.iters = args.iters, args.blocks_iters
        try:
            row = wrapped_run(args, case, root, job_id, toggle_block=args.toggle_block)
        finally:
            args.iters = planned
    else:
        row = unwrapped_run(args, case, root, job_id, "direct" if arm == "warmup" else arm)
    times = root / "call-times.json"
    row |= {"pair": pair, "arm": arm, "began": round(began, 1)}
    row["call_times"] = json.loads(times.read_text()) if times.is_file() else None
    if arm == "blocks" and row["call_times"]:
        progress_rows = read_jsonl(root / "run" / "output" / "logging.jsonl")
        phases = {int(k): v for k, v in row["call_times"].pop("phases", {}).items()}
        row["phases"] = phase_paces(iteration_durations(progress_rows), phases)
    if not args.keep_runs:
        shutil.rmtree(root / "run" / "output", ignore_errors=True)
    return row


def side_by_side(pair: list[dict[str, Any]]) -> None:
    """Two arms that trained at the same time on the one GPU: each one's median iteration over the seconds both
    were past their first WARM_ITERATIONS and not yet done (their iteration ends, megatron_call_timer's "ends").
    Whatever state the machine is in then, both arms are in it: its drift between runs cancels in the ratio."""
    ends = [{int(k): t for k, t in ((row.get("call_times") or {}).get("ends") or {}).items()} for row in pair]
    if not all(len(e) > WARM_ITERATIONS + 2 for e in ends):
        return
    lo = max(e[min(e) + WARM_ITERATIONS] for e in ends)
    hi = min(e[max(e) - 1] for e in ends)  # the last iteration's end runs into the final save's preparations
    for row, e in zip(pair, ends, strict=True):
        inside = [e[k] - e[k - 1] for k in sorted(e) if k - 1 in e and e[k - 1] >= lo and e[k] <= hi]
        row["overlap_s"], row["overlap_iterations"] = round(max(0.0, hi - lo), 1), len(inside)
        if len(inside) >= 5:
            row["overlap_it_per_s"] = round(1 / statistics.median(inside), 4)


def pair_ratios(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """swiftslurm ÷ direct per pair, window and steady pace, with min/median/max."""
    out: dict[str, Any] = {}
    for key in ("it_per_s", "steady_it_per_s", "overlap_it_per_s"):
        ratios = []
        for pair in sorted({r["pair"] for r in rows if r["pair"] >= 0}):
            by_arm: dict[str, float] = {r["arm"]: r[key] for r in rows if r["pair"] == pair and r.get(key)}
            if "swiftslurm" in by_arm and "direct" in by_arm:
                ratios.append(round(by_arm["swiftslurm"] / by_arm["direct"], 4))
        out[key] = {"ratios": ratios, "spread": spread(ratios) if ratios else None}
    return out


def capture(runs: Path, out: Path) -> None:
    """What the adapter's unit tests replay (tests/data/megatron/): logs, logging.jsonl, checkpoint listings."""
    with tarfile.open(out / "megatron-runs.tgz", "w:gz") as tar:
        for path in sorted(runs.rglob("*")):
            big = path.suffix in (".distcp", ".safetensors", ".pt", ".bin") or "quarantine" in path.parts
            if path.is_file() and not big and path.stat().st_size < 4 << 20:
                tar.add(path, arcname=str(path.relative_to(runs)))
    listing = [
        f"{p.relative_to(runs)}\t{p.stat().st_size if p.is_file() else 'dir'}"
        for p in sorted(runs.rglob("*"))
        if "output" in p.parts
    ]
    (out / "megatron-layout.txt").write_text("\n".join(listing) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=("matrix", "overhead"))
    parser.add_argument("--assets", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", default="/var/tmp/gpu-megatron")
    parser.add_argument("--cases", default="full,lora,moe")
    parser.add_argument("--case", default="full", help="overhead: the case measured")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--first-pair", type=int, default=0, help="overhead: the first pair's number")
    parser.add_argument("--warmup", action="store_true", help="overhead: one discarded direct run first")
    parser.add_argument(
        "--concurrent", action="store_true", help="overhead: a pair's two arms train at the same time on the GPU"
    )
    parser.add_argument("--toggle-block", type=int, default=8, help="the blocks arm: iterations per block")
    parser.add_argument("--blocks-iters", type=int, default=168, help="the blocks arm's iterations (8 + 4 × 8 × 5)")
    parser.add_argument("--partial-arms", default="", help=f"overhead: after each pair, one of {PARTIAL_ARMS}")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--save-steps", type=int, default=10)
    parser.add_argument("--preempt-at", type=int, default=5)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--case-timeout-s", type=float, default=420)
    parser.add_argument("--keep-runs", action="store_true")
    parser.add_argument("--override", action="append", default=[])
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = matrix(args) if args.what == "matrix" else overhead(args)
    (out / f"megatron-{args.what}.json").write_text(json.dumps(results, indent=1) + "\n")
    if args.what == "matrix":
        capture(Path(args.runs), out)
    print(f"[megatron] wrote {out} (repo {REPO})", flush=True)


if __name__ == "__main__":
    main()
