"""`megatron sft` through swiftslurm's node wrapper on H200s: trained, signalled mid-run, committed, requeued,
resumed at the saved iteration + 1, finished; final loss against an uninterrupted run of the same plan. And
the wrapper's cost: iterations/s under swiftslurm ÷ the same command run directly. See docs/gpu.md.

    python -m tests.gpu.gpu_megatron --assets DIR --out OUT matrix [--cases full,lora,moe] [--gpus 1]
    python -m tests.gpu.gpu_megatron --assets DIR --out OUT overhead [--pairs 3] [--case full]

The assets are ../shared/gpu-megatron's random Qwen3 (make_assets.py: DIR/model, DIR/train.jsonl) and
Qwen3-MoE (make_moe.py: DIR/moe). Jobs are emulated as in tests/gpu/gpu_matrix.py (gpu_common.FakeJob: srun's
environment per node, scontrol stand-in, SIGUSR2 as SLURM's `--signal`, TERM + KILL at a requeue).
Progress is read where the engine adapter reads it (output/logging.jsonl: Megatron's last rank writes it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
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


def direct_run(args: argparse.Namespace, case: Case, root: Path, job_id: int) -> dict[str, Any]:
    """The same plan's command without swiftslurm: no wrapper, no plugin, no callbacks."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run_dir = root / "run"
    plan_run(run_dir, overrides(args, case, f"mg-{case.name}", args.iters), os.environ, root / "plan.log")
    plan = JobPlan.load(run_dir / "plan.json")
    job = FakeJob(job_id, hosts_for(["gpu-n0"]), [list(range(case.gpus))], root / "slurm", dict(os.environ))
    node_env = job.node_env(0)
    env = {**node_env, **dict(plan.env), **rank_env(SlurmEnv.from_environ(node_env), plan)}
    argv = plain_swift_argv(swift_command(plan), ENGINE)
    started = time.time()
    with open(root / "direct.log", "wb") as log:
        code = subprocess.call(argv, env=env, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT)
    return {"exit_code": code, "wall_s": round(time.time() - started, 1), **speed(run_dir)}


def speed(run_dir: Path) -> dict[str, Any]:
    """Iterations/s from train begin to the last iteration (Megatron's own `train_speed(s/it)`, logged before
    the final save), so start-up and saving are outside the window in both arms alike."""
    rows = [e for e in read_jsonl(run_dir / "output" / "logging.jsonl") if "train_speed(s/it)" in e]
    return {"it_per_s": round(1 / float(rows[-1]["train_speed(s/it)"]), 3)} if rows else {"error": "no speed"}


def overhead(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Interleaved pairs (the order alternates, so drift on the shared host hits both arms alike)."""
    case, rows = CASES[args.case], []
    for pair in range(args.pairs):
        arms = ("swiftslurm", "direct") if pair % 2 == 0 else ("direct", "swiftslurm")
        for arm in arms:
            root = Path(args.runs) / f"overhead-{pair}-{arm}"
            job_id = 8200 + pair * 2 + arms.index(arm)
            if arm == "direct":
                row = direct_run(args, case, root, job_id)
            else:
                # Saved only at the end, as the direct arm: the window measured holds no save in either.
                row = run_job(args, case, root, job_id, preempt=False, save_steps=args.iters) | speed(root / "run")
                row.pop("losses", None)
            rows.append({"pair": pair, "arm": arm, **row})
            print(f"[overhead] pair {pair} {arm}: {rows[-1].get('it_per_s')} it/s", flush=True)
            if not args.keep_runs:
                shutil.rmtree(root / "run" / "output" / f"checkpoint-{args.iters}", ignore_errors=True)
    ratios = []
    for pair in range(args.pairs):
        by_arm = {r["arm"]: r.get("it_per_s") for r in rows if r["pair"] == pair}
        if by_arm.get("swiftslurm") and by_arm.get("direct"):
            ratios.append(by_arm["swiftslurm"] / by_arm["direct"])
    if ratios:
        print(f"[overhead] swiftslurm / direct iterations/s: {spread(ratios)}", flush=True)
    return [*rows, {"ratios": ratios, "spread": spread(ratios) if ratios else None}]


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
