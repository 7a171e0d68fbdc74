"""Every strategy that fits two GPUs, through swiftslurm's own node wrapper: trains, commits, is preempted
(USR2 mid-run), is requeued and resumes with the step count carried on. See docs/gpu.md.

    python -m tests.gpu.gpu_matrix --assets DIR --out OUT [--cases ddp,zero3,...] [--concurrency 9]

Each case is planned with `python -m swiftslurm ... dry_run=true run_dir=DIR` and run as an emulated SLURM
job (swiftslurm/testing/gpu.py): one `python -m swiftslurm.node DIR` per node with srun's environment, a
1-node × 2-GPU job or a 2-node × 1-GPU job (one GPU per "node", NCCL over sockets). Once node 0 has
logged step `--preempt-at`, every task gets USR2 (SLURM's `--signal`); the wrapper saves, commits and
requeues the job through `scontrol` (tests/gpu/fake_slurm), the job's tasks are ended as SLURM ends them, and
started again with SLURM_RESTART_COUNT=1. Checked per case: attempt 1 ended `preempted` with a committed
checkpoint of the step it was stopped at; attempt 2 resumed from exactly that checkpoint, logged steps
after it (not from 1), ended `finished` at max_steps, and committed the final checkpoint. Cases run
concurrently (they share the GPUs: this is a correctness run, not a timing run). Writes OUT/matrix.json.

On a CPU machine the same driver runs the tiny model: `--cpu` (plans with +cluster=local-slurm).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import newest_checkpoint
from swiftslurm.testing.gpu import (
    FakeJob,
    committed_steps,
    final_summary,
    hosts_for,
    plan_run,
    read_jsonl,
    step_entries,
    step_of,
)

_STEP = re.compile(r"'global_step/max_steps': '(\d+)/(\d+)'")
_STOP_SAVE = re.compile(r"\[swiftslurm\] stop signal: saving step (\d+)")
_NCCL_NET = re.compile(r"via NET/(\w+)")


@dataclass(frozen=True)
class Case:
    name: str
    overrides: tuple[str, ...]
    nodes: int = 1  # 1: one node with every GPU; 2: two "nodes" with one GPU each


GPU_CASES = {
    "ddp": Case("ddp", ("strategy=ddp", "strategy.tuner_type=full")),
    "zero2": Case("zero2", ("strategy=zero2", "strategy.tuner_type=full")),
    "zero3": Case("zero3", ("strategy=zero3", "strategy.tuner_type=full")),
    "zero3_offload": Case("zero3_offload", ("strategy=zero3_offload", "strategy.tuner_type=full")),
    "fsdp2": Case("fsdp2", ("strategy=fsdp2", "strategy.tuner_type=full")),
    "lora": Case("lora", ("strategy=ddp", "strategy.tuner_type=lora")),
    "qlora": Case("qlora", ("strategy=qlora",)),
    "2node_zero3": Case("2node_zero3", ("strategy=zero3", "strategy.tuner_type=full"), nodes=2),
    "2node_fsdp2": Case("2node_fsdp2", ("strategy=fsdp2", "strategy.tuner_type=full"), nodes=2),
    "2node_lora": Case("2node_lora", ("strategy=ddp", "strategy.tuner_type=lora"), nodes=2),
    # ZeRO-3 offload without DeepSpeedCPUAdam (which is compiled at first use and needs g++ and Python.h): torch's
    # AdamW steps the offloaded fp32 partitions on the CPU. Run only when named.
    "zero3_offload_torch_adam": Case(
        "zero3_offload_torch_adam",
        (
            "strategy=zero3_offload",
            f"strategy.deepspeed={Path(__file__).resolve().parent / 'ds_zero3_offload_torch_adam.json'}",
            "strategy.tuner_type=full",
        ),
    ),
}
DEFAULT_GPU_CASES = [name for name in GPU_CASES if name != "zero3_offload_torch_adam"]
CPU_CASES = {
    "ddp": Case("ddp", ("strategy=ddp",)),
    "zero2": Case("zero2", ("strategy=zero2",)),
    "2node_ddp": Case("2node_ddp", ("strategy=ddp",), nodes=2),
}


def cluster_overrides(args: argparse.Namespace, case: Case) -> list[str]:
    if args.cpu:
        base = ["+cluster=local-slurm", "cluster.signal_lead_s=120"]
        return base + (["cluster.nodes=1", "cluster.cpu_procs_per_node=2"] if case.nodes == 1 else [])
    base = ["+cluster=h200x2"]
    if case.nodes == 2:
        # Two hosts with one GPU each, connected by sockets only (no NVLink, no shared memory between them).
        base += [
            "cluster.nodes=2",
            "cluster.gpus_per_node=1",
            "cluster.nccl.socket_ifname=lo",
            "cluster.nccl.debug=INFO",
            "cluster.env.NCCL_P2P_DISABLE=1",
            "cluster.env.NCCL_SHM_DISABLE=1",
        ]
    return base


def model_overrides(args: argparse.Namespace) -> list[str]:
    samples = args.max_steps * args.micro_batch * 2 + 64  # what the run reads, plus a margin
    if args.cpu:
        return ["model=tiny", "swift.dataloader_num_workers=0"]
    assets = Path(args.assets)
    return [
        "model=qwen3-0.5b-random",  # the preset's shape comes from the assets' config.json
        f"model.params_b={args.params_b}",
        f"model.id={assets / 'model'}",
        f"dataset=['{assets / 'data' / 'train.jsonl'}#{samples}']",
    ]


def overrides_for(args: argparse.Namespace, case: Case) -> list[str]:
    return [
        *cluster_overrides(args, case),
        *model_overrides(args),
        *case.overrides,
        f"micro_batch_size={args.micro_batch}",
        f"swift.max_steps={args.max_steps}",
        f"swift.save_steps={args.save_steps}",
        "swift.logging_steps=1",
        "keep_checkpoints=1",
        f"run_name=gpu-{case.name}",
        *args.override,
    ]


def node0_step(log: Path) -> int:
    try:
        found = _STEP.findall(log.read_text(errors="replace"))
    except FileNotFoundError:
        return 0
    return int(found[-1][0]) if found else 0


def first_step(log: Path) -> int | None:
    try:
        found = _STEP.findall(log.read_text(errors="replace"))
    except FileNotFoundError:
        return None
    return int(found[0][0]) if found else None


def attempt_dirs(run_dir: Path) -> list[Path]:
    return sorted((run_dir / "logs").glob("*/"))  # JOB, JOB.r1, ...


def run_case(args: argparse.Namespace, case: Case, index: int) -> dict[str, Any]:
    started = time.time()
    root = Path(args.runs) / case.name
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    run_dir = root / "run"
    env = dict(os.environ)
    result: dict[str, Any] = {"case": case.name, "nodes": case.nodes, "ok": False}
    job: FakeJob | None = None
    try:
        plan = plan_run(run_dir, overrides_for(args, case), env, root / "plan.log")
        result["swift_argv"] = " ".join(plan["swift_argv"])
        if args.cpu:  # loopback addresses as host names: nothing to add to this machine's /etc/hosts
            hosts, gpus = [f"127.0.0.{i + 1}" for i in range(case.nodes)], [[] for _ in range(case.nodes)]
        elif case.nodes == 1:
            hosts, gpus = hosts_for(["gpu-n0"]), [list(range(args.gpus))]
        else:
            hosts, gpus = hosts_for([f"gpu-n{i}" for i in range(case.nodes)]), [[i] for i in range(case.nodes)]
        job = FakeJob(args.job_base + index, hosts, gpus, root / "slurm", env)
        result["hosts"] = hosts
        job.start(run_dir, root)
        deadline = started + args.case_timeout_s
        signalled = False
        while time.time() < deadline:
            time.sleep(0.2)
            if not signalled and job.restart_count == 0:
                logs = attempt_dirs(run_dir)
                if logs and node0_step(logs[-1] / "node0.log") >= args.preempt_at:
                    job.signal(signal.SIGUSR2)  # SLURM: `--signal=USR2@N` or `scancel --signal=USR2`
                    result["usr2_at"] = time.time() - started
                    signalled = True
            if signalled and "signal_to_commit_s" not in result and job.restart_count == 0:
                _note_stop_commit(result, run_dir, started)
            if job.requeued():
                job.end_for_requeue()
                result["requeued_at"] = time.time() - started
                job.start(run_dir, root)
                continue
            if not job.running():
                break
        else:
            result["error"] = f"timed out after {args.case_timeout_s:.0f} s"
            job.kill()
        result["exit_codes"] = job.exit_codes()
        result |= check(run_dir, args.max_steps)
    except Exception as err:  # one case's failure must not end the others
        result["error"] = f"{err!r}\n{traceback.format_exc()[-1500:]}"
        if job is not None:
            job.kill()
    result["seconds"] = round(time.time() - started, 1)
    if not args.keep_runs:
        shutil.rmtree(run_dir / "output", ignore_errors=True)  # checkpoints are GBs; logs stay
    print(f"[matrix] {case.name}: {'ok' if result['ok'] else 'FAILED'} {result.get('why', '')}", flush=True)
    return result


def _note_stop_commit(result: dict[str, Any], run_dir: Path, started: float) -> None:
    """The save budget: how long from SLURM's signal to the commit of the stop step's checkpoint, and its size."""
    log = _read(attempt_dirs(run_dir)[-1] / "node0.log")
    stop = _STOP_SAVE.search(log)
    if stop and int(stop.group(1)) in committed_steps(log):
        result["signal_to_commit_s"] = round(time.time() - started - result["usr2_at"], 2)
        result["checkpoint_gb"] = round(_newest_checkpoint_bytes(run_dir) / 1e9, 2)


def _read(log: Path) -> str:
    try:
        return log.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _newest_checkpoint_bytes(run_dir: Path) -> int:
    newest = newest_checkpoint(run_dir / "output")
    return sum(p.stat().st_size for p in newest.rglob("*") if p.is_file()) if newest else 0


def check(run_dir: Path, max_steps: int) -> dict[str, Any]:
    """What the run directory says about train -> preempt -> commit -> requeue -> resume -> finish."""
    attempts = read_jsonl(run_dir / "attempts.jsonl")
    status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").is_file() else {}
    logs = {d.name: d for d in attempt_dirs(run_dir)}
    facts: dict[str, Any] = {
        "status": status.get("state"),
        "attempts": [
            {k: a.get(k) for k in ("attempt", "reason", "exit_code", "resume_step", "last_step", "committed_step")}
            for a in attempts
        ],
    }
    committed, nets = [], set()
    for attempt in logs.values():
        for node_log in sorted(attempt.glob("node*.log")):
            text = node_log.read_text(errors="replace")
            committed += committed_steps(text)
            nets |= set(_NCCL_NET.findall(text))
    facts["committed_steps"] = sorted(set(committed))
    facts["nccl_net_transports"] = sorted(nets)
    entries = read_jsonl(run_dir / "output" / "logging.jsonl")
    steps = step_entries(entries)
    if steps:
        facts["loss_first"], facts["loss_last"] = steps[0]["loss"], steps[-1]["loss"]
        facts["memory_gib"] = max((float(e.get("memory(GiB)", 0)) for e in steps), default=None)
    summary = final_summary(entries)
    facts["final_step"] = step_of(summary) if summary else None
    problems = []
    if len(attempts) != 2:
        problems.append(f"{len(attempts)} attempt records, expected 2")
    else:
        first, second = attempts
        saved = first.get("committed_step")
        facts["saved_step"] = saved
        second_log = logs.get(str(second.get("attempt")))
        facts["resumed_first_logged_step"] = first_step(second_log / "node0.log") if second_log else None
        if first.get("reason") != "preempted":
            problems.append(f"attempt 1 ended {first.get('reason')}: {first.get('why')}")
        if not saved or saved >= max_steps:
            problems.append(f"attempt 1 committed step {saved}")
        if second.get("resume_step") != saved:
            problems.append(f"attempt 2 resumed from step {second.get('resume_step')}, not {saved}")
        if (facts["resumed_first_logged_step"] or 0) <= (saved or 0):
            problems.append(f"attempt 2's first logged step is {facts['resumed_first_logged_step']}")
        if second.get("reason") != "finished":
            problems.append(f"attempt 2 ended {second.get('reason')}: {second.get('why')}")
        if second.get("quarantined"):
            problems.append(f"quarantined {second.get('quarantined')}")
    facts["preflight"] = preflight_reports(run_dir)
    problems += [f"preflight {r['attempt']} failed: {r['failed']}" for r in facts["preflight"] if not r["ok"]]
    if max_steps not in facts["committed_steps"]:
        problems.append(f"no commit of checkpoint-{max_steps}")
    if status.get("state") != "finished":
        problems.append(f"status {status.get('state')}")
    facts["ok"] = not problems
    facts["why"] = "; ".join(problems)
    return facts


def preflight_reports(run_dir: Path) -> list[dict[str, Any]]:
    """The preflight of each attempt that ran one (`preflight=true`: the first attempt of a job): its verdict,
    every check as `node: name` with what it saw, and the GPU topology node 0 captured."""
    found = []
    for path in sorted(run_dir.glob("preflight/*/report.json")):
        report = json.loads(path.read_text())
        checks = [(n["host"], c) for n in report["nodes"] for c in n["checks"]]
        found.append(
            {
                "attempt": report["attempt"],
                "ok": report["ok"],
                "checks": [
                    f"{host}: {c['name']}: {'ok' if c['ok'] else 'FAILED'}: {c['detail']}" for host, c in checks
                ],
                "failed": [f"{host}: {c['name']}" for host, c in checks if not c["ok"]],
                "topology": report["nodes"][0].get("topology", "") if report["nodes"] else "",
            }
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--assets", default="", help="python -m swiftslurm.tiny --preset qwen3-0.5b --cache-dir DIR")
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", default="/tmp/gpu-matrix")
    parser.add_argument("--cases", default="")
    parser.add_argument("--cpu", action="store_true", help="the tiny model on CPU processes (driver test)")
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--save-steps", type=int, default=30)
    parser.add_argument("--preempt-at", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--case-timeout-s", type=float, default=480)
    parser.add_argument("--job-base", type=int, default=7000)
    parser.add_argument("--keep-runs", action="store_true")
    parser.add_argument("--params-b", type=float, default=0.44, help="the assets' parameter count (billions)")
    parser.add_argument("--override", action="append", default=[], help="more overrides for every plan")
    args = parser.parse_args()
    table = CPU_CASES if args.cpu else GPU_CASES
    names = [n for n in args.cases.split(",") if n] or (list(table) if args.cpu else DEFAULT_GPU_CASES)
    cases = [table[n] for n in names]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()

    def one(item: tuple[int, Case]) -> None:
        result = run_case(args, item[1], item[0])
        with lock:
            results.append(result)
            (out / "matrix.json").write_text(json.dumps(results, indent=1) + "\n")

    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        list(pool.map(one, enumerate(cases)))
    print("\ncase            ok    saved  resumed-at  final  commits           seconds  memory(GiB)  why")
    for r in sorted(results, key=lambda r: names.index(r["case"])):
        print(
            f"{r['case']:15s} {r['ok']!s:5s} {r.get('saved_step')!s:6s} {r.get('resumed_first_logged_step')!s:11s} "
            f"{r.get('final_step')!s:6s} {','.join(map(str, r.get('committed_steps', []))):17s} "
            f"{r['seconds']:7.1f}  {r.get('memory_gib')!s:11s}  {r.get('why') or r.get('error', '')[:300]}"
        )
    for r in results:
        if "signal_to_commit_s" in r:
            print(f"save budget {r['case']}: signal -> committed {r['signal_to_commit_s']} s, {r['checkpoint_gb']} GB")
    for r in results:
        for report in r.get("preflight", []):
            print(f"\npreflight of {r['case']} ({report['attempt']}): {'passed' if report['ok'] else 'FAILED'}")
            print("\n".join(f"  {line}" for line in report["checks"]))


if __name__ == "__main__":
    main()
