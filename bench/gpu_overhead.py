"""Benchmark: training throughput under swiftslurm's node wrapper versus the same `swift sft` run directly.

    python -m bench.gpu_overhead --assets DIR --out OUT [--strategies ddp,zero3] [--pairs 3]
                                 [--deadline-at EPOCH_S] [--first-pair 0]

Per strategy and pair, two runs on the same GPUs, one after the other, in alternating order (ABBA):

- **swiftslurm**: `python -m swiftslurm.node RUN_DIR` with srun's environment (1 node × all GPUs; see
  swiftslurm/testing/gpu.py), which starts `swift sft` with swiftslurm's callbacks (stop, commit) and
  plugin, watches it, and commits every checkpoint (checksums, manifest).
- **direct**: the `swift sft` command a user would type for the same plan, i.e. the same arguments without
  swiftslurm's callbacks and plugin, with the same environment the wrapper gives its trainer (srun's, the
  plan's, the rank variables), started directly.
- **direct-callbacks** (only with `--arms`): the plan's exact command, callbacks and plugin included, started
  directly: swiftslurm ÷ this is the wrapper process alone, this ÷ direct the callbacks (the stop
  callback's per-step vote, the commit's barrier and checksums).

Both read ms-swift's own log (`output/logging.jsonl`): samples/s and tokens/s over the steps after
warm-up up to the mid-run save (`train`), over the same start to the last step (`train+save`: the mid-run
save and, for swiftslurm, its commit), ms-swift's `train_samples_per_second` for the whole run, wall time
from start to exit, and peak GPU memory (ms-swift's `memory(GiB)` on rank 0; nvidia-smi's per-GPU peak).
Each run appends a JSON line to OUT/overhead.jsonl; `--summarize FILE...` prints the ratio table from
such files (min / median / max over pairs of swiftslurm ÷ direct).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from swiftslurm.engines.registry import engine_for
from swiftslurm.plan import JobPlan
from swiftslurm.render import swift_command
from swiftslurm.slurm_env import SlurmEnv, rank_env
from swiftslurm.testing.gpu import (
    VERSIONED,
    FakeJob,
    GpuMemorySampler,
    direct_costs,
    final_summary,
    hosts_for,
    package_versions,
    peak_memory_gib,
    plain_swift_argv,
    plan_run,
    read_jsonl,
    spread,
    step_entries,
    window_throughput,
)

STRATEGIES = {
    "ddp": ("strategy=ddp", "strategy.tuner_type=full"),
    "zero3": ("strategy=zero3", "strategy.tuner_type=full"),
}
ARMS = ("swiftslurm", "direct", "direct-callbacks")
FIRST_GUESS_S = 150.0  # a run's length before one has been measured


def overrides(args: argparse.Namespace, strategy: str, run_name: str) -> list[str]:
    if args.cpu:  # a test of this driver: the tiny model on 2 CPU processes
        where = ["+cluster=local-slurm", "cluster.nodes=1", "cluster.cpu_procs_per_node=2", "model=tiny"]
    else:
        assets = Path(args.assets)
        samples = args.max_steps * args.micro_batch * args.gpus + 64
        where = [
            "+cluster=h200x2",
            "model=qwen3-0.5b-random",
            f"model.id={assets / 'model'}",
            f"dataset=['{assets / 'data' / 'train.jsonl'}#{samples}']",
        ]
    return [
        *where,
        *STRATEGIES[strategy],
        f"micro_batch_size={args.micro_batch}",
        f"swift.max_steps={args.max_steps}",
        f"swift.save_steps={args.max_steps // 2}",
        "swift.logging_steps=5",
        "swift.include_num_input_tokens_seen=true",
        f"run_name={run_name}",
        *args.override,
    ]


def run_one(args: argparse.Namespace, strategy: str, arm: str, pair: int, job_id: int) -> dict[str, Any]:
    root = Path(args.runs) / f"{strategy}-{pair}-{arm}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run_dir = root / "run"
    env = dict(os.environ)
    plan_run(run_dir, overrides(args, strategy, f"bench-{strategy}"), env, root / "plan.log")
    plan = JobPlan.load(run_dir / "plan.json")
    hosts = ["127.0.0.1"] if args.cpu else hosts_for(["gpu-n0"])
    gpus = [] if args.cpu else list(range(args.gpus))
    record: dict[str, Any] = {"strategy": strategy, "arm": arm, "pair": pair, "job_id": job_id}
    job = FakeJob(job_id, hosts, [gpus], root / "slurm", env)
    started = time.time()
    with GpuMemorySampler() as sampler:
        if arm == "swiftslurm":
            job.start(run_dir, root)
            codes = [p.wait() for p in job.procs]
        else:
            # Exactly what the wrapper gives its trainer (node/watch.py: trainer_env), from the same srun environment.
            node_env = job.node_env(0)
            where = SlurmEnv.from_environ(node_env)
            argv = swift_command(plan)
            if arm == "direct":
                argv = plain_swift_argv(argv, engine_for(plan.launcher))
            trainer_env = {
                **node_env,
                **dict(plan.env),
                **rank_env(where, plan),
                "SWIFTSLURM_RUN_DIR": str(run_dir),
                "SWIFTSLURM_KEEP_CHECKPOINTS": str(plan.keep_checkpoints),
            }
            with open(root / "direct.log", "wb") as log:
                codes = [subprocess.call(argv, env=trainer_env, cwd=run_dir, stdout=log, stderr=subprocess.STDOUT)]
            record["argv"] = argv
    record["wall_s"] = round(time.time() - started, 2)
    record["exit_codes"] = codes
    record["gpu_peak_mib"] = sampler.peak
    entries = read_jsonl(run_dir / "output" / "logging.jsonl")
    record |= measure(entries, plan.batch.global_, args.warmup_steps, args.max_steps)
    record |= direct_costs(*_logs(root, arm))
    if not args.keep_runs:
        shutil.rmtree(run_dir / "output", ignore_errors=True)
    return record


def _logs(root: Path, arm: str) -> tuple[str, str]:
    """(the trainer's output, the wrapper's own output) of one run."""
    if arm != "swiftslurm":
        return (root / "direct.log").read_text(errors="replace"), ""
    trainer = "".join(p.read_text(errors="replace") for p in sorted((root / "run" / "logs").glob("*/node0.log")))
    wrapper = "".join(p.read_text(errors="replace") for p in sorted(root.glob("wrapper0*.log")))
    return trainer, wrapper


def measure(entries: list[dict[str, Any]], global_batch: int, warmup: int, max_steps: int) -> dict[str, Any]:
    found: dict[str, Any] = {"memory_gib": peak_memory_gib(entries)}
    steps = step_entries(entries)
    if steps:
        found["loss_last"] = steps[-1]["loss"]
    try:
        train = window_throughput([e for e in steps if _step(e) <= max_steps // 2], global_batch, warmup)
        both = window_throughput(steps, global_batch, warmup)
    except ValueError as err:
        found["error"] = str(err)
        return found
    for name, tp in (("train", train), ("train_save", both)):
        found[name] = {
            "steps": [tp.first_step, tp.last_step],
            "seconds": round(tp.seconds, 3),
            "samples_per_s": round(tp.samples_per_s, 3),
            "tokens_per_s": round(tp.tokens_per_s, 1) if tp.tokens_per_s else None,
        }
    summary = final_summary(entries)
    if summary:
        found["run"] = {
            "train_runtime": summary.get("train_runtime"),
            "samples_per_s": summary.get("train_samples_per_second"),
        }
    return found


def _step(entry: dict[str, Any]) -> int:
    return int(str(entry["global_step/max_steps"]).split("/")[0])


def order(pair: int, arms: list[str]) -> list[str]:
    """ABBA: the arms in the given order in even pairs, reversed in odd ones, so drift hits all alike."""
    return list(arms) if pair % 2 == 0 else list(reversed(arms))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--assets", help="python -m swiftslurm.tiny --preset qwen3-0.5b --cache-dir DIR")
    parser.add_argument("--out", default=".")
    parser.add_argument("--runs", default="/tmp/gpu-overhead")
    parser.add_argument("--strategies", default="ddp,zero3")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--arms", default="swiftslurm,direct", help=f"from {', '.join(ARMS)}; swiftslurm first")
    parser.add_argument("--first-pair", type=int, default=0, help="index of the first pair (ABBA order, job ids)")
    parser.add_argument("--deadline-at", type=float, default=0.0, help="start no pair that would end after this")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=40)
    parser.add_argument("--warmup-steps", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=32)
    parser.add_argument("--keep-runs", action="store_true")
    parser.add_argument("--cpu", action="store_true", help="the tiny model on CPU processes (driver test)")
    parser.add_argument("--override", action="append", default=[], help="more overrides for every plan")
    parser.add_argument("--summarize", nargs="*", help="print the table from these overhead.jsonl files; run nothing")
    args = parser.parse_args()
    if args.summarize is not None:
        print(summarize([json.loads(line) for f in args.summarize for line in Path(f).read_text().splitlines()]))
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "versions.json").write_text(json.dumps(package_versions(VERSIONED), indent=1) + "\n")
    strategies = args.strategies.split(",")
    arms = args.arms.split(",")
    longest: dict[str, float] = {}
    records = []
    for pair in range(args.first_pair, args.first_pair + args.pairs):
        for strategy in strategies:
            need = len(arms) * longest.get(strategy, FIRST_GUESS_S)
            if args.deadline_at and time.time() + need > args.deadline_at:
                print(f"[overhead] skipping {strategy} pair {pair}: {need:.0f} s would pass the deadline", flush=True)
                continue
            for arm in order(pair, arms):
                job_id = 9000 + 10 * pair + len(ARMS) * strategies.index(strategy) + ARMS.index(arm)
                record = run_one(args, strategy, arm, pair, job_id)
                longest[strategy] = max(longest.get(strategy, 0.0), record["wall_s"])
                records.append(record)
                with open(out / "overhead.jsonl", "a") as f:
                    f.write(json.dumps(record) + "\n")
                print(f"[overhead] {json.dumps(record)[:600]}", flush=True)
    print(summarize(records))


def summarize(records: list[dict[str, Any]]) -> str:
    """Ratio table (swiftslurm ÷ each other arm, per pair; min / median / max) and the absolute figures."""
    lines = [
        "| strategy | versus | metric | pairs | ratio min | ratio median | ratio max "
        "| swiftslurm median | other median |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for strategy in sorted({r["strategy"] for r in records}):
        by_pair: dict[int, dict[str, dict[str, Any]]] = {}
        for r in records:
            if r["strategy"] == strategy and all(c == 0 for c in r["exit_codes"]):
                by_pair.setdefault(r["pair"], {})[r["arm"]] = r
        for other in ARMS[1:]:
            pairs = [p for p in by_pair.values() if "swiftslurm" in p and other in p]
            for label, path in METRICS:
                values = [(_get(p["swiftslurm"], path), _get(p[other], path)) for p in pairs]
                values = [(a, b) for a, b in values if a is not None and b is not None and b != 0]
                if not values:
                    continue
                ratios = spread([a / b for a, b in values])
                ours, theirs = spread([a for a, _ in values]), spread([b for _, b in values])
                lines.append(
                    f"| {strategy} | {other} | {label} | {ratios['n']} | {ratios['min']:.3f} | "
                    f"{ratios['median']:.3f} | {ratios['max']:.3f} | {ours['median']:.4g} | {theirs['median']:.4g} |"
                )
    return "\n".join([*lines, "", *cost_lines(records)])


def cost_lines(records: list[dict[str, Any]]) -> list[str]:
    """swiftslurm's own time, measured where it is spent: the stop vote inside each training step (against
    the step time of the same run) and the wrapper's CPU while training ran (on cores the trainer does not use
    unless the node is full). A bound that the run-to-run noise of the throughput ratio does not blur."""
    lines = [
        "| strategy | arm | pair | step ms (train window) | vote us/step mean / max | vote share of a step "
        "| wrapper CPU-s / training s |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in records:
        if "vote_us_mean" not in r or "train" not in r:
            continue
        first, last = r["train"]["steps"]
        step_ms = 1000 * r["train"]["seconds"] / (last - first)
        share = r["vote_us_mean"] / 1000 / step_ms
        wrapper = f"{r['wrapper_cpu_s']:.2f} / {r['wrapper_wall_s']}" if "wrapper_cpu_s" in r else "-"
        lines.append(
            f"| {r['strategy']} | {r['arm']} | {r['pair']} | {step_ms:.0f} | {r['vote_us_mean']} / {r['vote_us_max']} "
            f"| {share:.5%} | {wrapper} |"
        )
    return lines if len(lines) > 2 else []


METRICS = (
    ("samples/s, train", ("train", "samples_per_s")),
    ("tokens/s, train", ("train", "tokens_per_s")),
    ("samples/s, train+save", ("train_save", "samples_per_s")),
    ("tokens/s, train+save", ("train_save", "tokens_per_s")),
    ("samples/s, whole run (ms-swift)", ("run", "samples_per_s")),
    ("wall s, start to exit", ("wall_s",)),
    ("peak memory GiB (ms-swift, rank 0)", ("memory_gib",)),
    ("peak memory MiB (nvidia-smi, GPU 0)", ("gpu_peak_mib", "0")),
    ("peak memory MiB (nvidia-smi, GPU 1)", ("gpu_peak_mib", "1")),
)


def _get(record: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = record
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, (int, float)) else None


if __name__ == "__main__":
    main()
