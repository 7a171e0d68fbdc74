"""Peak GPU memory of each strategy that runs on one GPU, against the planner's estimate (docs/memory.md).

    python -m tests.gpu.gpu_memory --assets DIR --out OUT [--cases ddp,lora,...] [--lengths 512,2048] [--concurrency 4]

Each case is planned as a user would plan it (`python -m swiftslurm ... dry_run=true`, one GPU), then its
`swift sft` argv (without swiftslurm's callbacks: this measures ms-swift, not the wrapper) runs a few steps
under torchrun with one process, through `PROBE` below: at exit the trainer process writes
torch.cuda.max_memory_allocated / max_memory_reserved. nvidia-smi is sampled at the same time (per process
where the runtime lists processes, else the whole GPU). Every sample is cut to exactly `max_length` tokens
(a generated dataset of long answers, `--truncation_strategy right`), so the measured peak is the planned
shape's. Cases run `--concurrency` at a time on the one GPU (torch's numbers are per process). Writes
OUT/memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from swiftslurm.engines.registry import engine_for
from swiftslurm.testing.gpu import REPO, package_versions, plain_swift_argv, plan_run, python, read_jsonl

CASES = {
    "ddp": ("strategy=ddp", "strategy.tuner_type=full"),
    "lora": ("strategy=ddp", "strategy.tuner_type=lora"),
    "lora_nogc": ("strategy=ddp", "strategy.tuner_type=lora", "swift.gradient_checkpointing=false"),
    "zero2": ("strategy=zero2", "strategy.tuner_type=full"),
    "zero3": ("strategy=zero3", "strategy.tuner_type=full"),
    "zero3_offload": ("strategy=zero3_offload", "strategy.tuner_type=full"),
    "fsdp2": ("strategy=fsdp2", "strategy.tuner_type=full"),
    "qlora": ("strategy=qlora",),
}
PROBE = """
import atexit, json, os, runpy, sys
def _dump():
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out = {"pid": os.getpid(), "allocated": torch.cuda.max_memory_allocated(),
               "reserved": torch.cuda.max_memory_reserved()}
        with open(os.environ["MEM_PROBE_OUT"], "w") as f:
            json.dump(out, f)
atexit.register(_dump)
sys.argv[0] = "swift.cli.sft"
runpy.run_module("swift.cli.sft", run_name="__main__")
"""


def write_dataset(path: Path, samples: int, words: int = 4000) -> None:
    """Chats whose answer alone is longer than any max_length measured: truncated, every sample is max_length."""
    rng = random.Random(7)
    vocab = ["apple", "river", "stone", "cloud", "green", "tiger", "piano", "lemon", "house", "night"]
    with open(path, "w") as f:
        for _ in range(samples):
            answer = " ".join(rng.choice(vocab) for _ in range(words))
            row = {"messages": [{"role": "user", "content": "Say words."}, {"role": "assistant", "content": answer}]}
            f.write(json.dumps(row) + "\n")


def overrides_for(args: argparse.Namespace, case: str, length: int, data: Path) -> list[str]:
    return [
        "+cluster=h200x2",
        "cluster.gpus_per_node=1",
        "model=qwen3-0.5b-random",
        f"model.id={Path(args.assets) / 'model'}",
        f"dataset=['{data}']",
        *CASES[case],
        f"micro_batch_size={args.micro_batch}",
        f"swift.max_length={length}",
        "swift.truncation_strategy=right",
        f"swift.max_steps={args.max_steps}",
        "swift.logging_steps=1",
        "swift.dataloader_num_workers=0",
        f"run_name=mem-{case}-{length}",
        *args.override,
    ]


def run_case(args: argparse.Namespace, case: str, length: int, index: int, data: Path) -> dict[str, Any]:
    started = time.time()
    root = Path(args.runs) / f"{case}-{length}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    result: dict[str, Any] = {"case": case, "max_length": length, "micro_batch": args.micro_batch, "ok": False}
    try:
        plan = plan_run(root / "run", overrides_for(args, case, length, data), os.environ, root / "plan.log")
        argv = [*plain_swift_argv(plan["swift_argv"], engine_for("swift")), "--save_strategy", "no"]
        result["swift_argv"] = " ".join(argv)
        probe_out = root / "probe.json"
        (root / "probe.py").write_text(PROBE)
        env = dict(os.environ) | dict(plan["env"]) | {"MEM_PROBE_OUT": str(probe_out), "CUDA_VISIBLE_DEVICES": "0"}
        cmd = [python(), "-m", "torch.distributed.run", "--nproc_per_node", "1", "--master_port", str(29600 + index)]
        with open(root / "train.log", "wb") as log:
            done = subprocess.run(
                [*cmd, str(root / "probe.py"), *argv],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=args.case_timeout_s,
                check=False,
            )
        result["exit_code"] = done.returncode
        if probe_out.is_file():
            probe = json.loads(probe_out.read_text())
            result |= {
                "pid": probe["pid"],
                "allocated_gib": probe["allocated"] / 2**30,
                "reserved_gib": probe["reserved"] / 2**30,
            }
        logged = read_jsonl(root / "run" / "output" / "logging.jsonl")
        mem = [float(e["memory(GiB)"]) for e in logged if "memory(GiB)" in e]
        result["swift_memory_gib"] = max(mem) if mem else None
        result["ok"] = done.returncode == 0 and probe_out.is_file()
        if not result["ok"]:
            result["log_tail"] = (root / "train.log").read_text(errors="replace")[-3000:]
    except Exception as err:  # one case's failure must not end the others
        result["error"] = repr(err)
    result["seconds"] = round(time.time() - started, 1)
    shutil.rmtree(root / "run" / "output", ignore_errors=True)
    print(
        f"[memory] {case} {length}: {'ok' if result['ok'] else 'FAILED'} "
        f"{result.get('allocated_gib', 0):.2f} GiB alloc, {result['seconds']} s",
        flush=True,
    )
    return result


class ProcessMemorySampler:
    """Peak nvidia-smi memory per process (MiB) and of the whole GPU, sampled every `interval_s`."""

    def __init__(self, interval_s: float = 0.5) -> None:
        self.interval_s, self.per_pid, self.gpu_peak_mib, self._stop = interval_s, {}, 0, False

    def sample(self) -> None:
        import threading

        def loop() -> None:
            while not self._stop:
                self._once()
                time.sleep(self.interval_s)

        threading.Thread(target=loop, daemon=True).start()

    def _once(self) -> None:
        query = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]
        gpu = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        try:
            for line in subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.splitlines():
                pid, used = (x.strip() for x in line.split(","))
                self.per_pid[int(pid)] = max(self.per_pid.get(int(pid), 0), int(used))
            used = int(subprocess.run(gpu, capture_output=True, text=True, timeout=10).stdout.split()[0])
            self.gpu_peak_mib = max(self.gpu_peak_mib, used)
        except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
            pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--assets", required=True, help="a swiftslurm.tiny preset's cache dir")
    parser.add_argument("--preset", default="qwen3-0.5b", help="its name, recorded in the results")
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", default="/var/tmp/gpu-memory")
    parser.add_argument("--cases", default="ddp,lora,lora_nogc,zero2,zero3,zero3_offload,fsdp2")
    parser.add_argument("--lengths", default="512,2048")
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--case-timeout-s", type=float, default=400)
    parser.add_argument("--override", action="append", default=[], help="one more plan override (repeatable)")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.runs) / "calibration.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    write_dataset(data, samples=args.micro_batch * args.max_steps * 2 + 16)
    todo = [(c, int(n)) for n in args.lengths.split(",") for c in args.cases.split(",")]
    sampler = ProcessMemorySampler()
    sampler.sample()
    with ThreadPoolExecutor(args.concurrency) as pool:
        results = list(pool.map(lambda item: run_case(args, item[0], item[1], todo.index(item), data), todo))
    sampler._stop = True
    for r in results:
        r["nvidia_smi_process_mib"] = sampler.per_pid.get(r.get("pid", -1))
    report = {
        "preset": args.preset,
        "model_config": json.loads((Path(args.assets) / "model" / "config.json").read_text()),
        "gpu_peak_mib_all_cases": sampler.gpu_peak_mib,
        "concurrency": args.concurrency,
        "versions": package_versions(["torch", "transformers", "ms-swift", "deepspeed", "peft", "accelerate"]),
        "results": results,
    }
    (out / f"memory-{args.preset}.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
