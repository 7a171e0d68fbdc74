"""Shared pieces of the GPU runs (tests/gpu/gpu_matrix.py, bench/gpu_overhead.py; see docs/gpu.md).

Where no SLURM runs (the lent GPU machine), a job is emulated the way srun would start it: one
`python -m swiftslurm.node RUN_DIR` per node, each with the environment srun gives that task
(`srun_env`), and `tests/gpu/fake_slurm/scontrol` standing in for slurmctld's answers. A requeue is played
the way SLURM plays it: TERM to every task, KILL after KillWait, then the same job id again with
SLURM_RESTART_COUNT one higher.

The pure functions (environment, ms-swift log arithmetic, statistics) are unit-tested in
tests/unit/test_gpu_bench.py; the rest starts and stops processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from swiftslurm.engines.base import Engine
from swiftslurm.signals import descendants

REPO = Path(__file__).resolve().parents[2]  # the checkout: swiftslurm/testing/gpu.py
FAKE_SLURM_BIN = Path(__file__).resolve().parent / "fake_slurm"
KILL_WAIT_S = 2.0  # SLURM's KillWait between the TERM and the KILL of a requeued job's tasks


# ------------------------------------------------------------------------------------------ pure


def srun_env(
    *,
    job_id: int,
    nodelist: str,
    hosts: Sequence[str],
    node_id: int,
    gpus: Sequence[int],
    restart_count: int = 0,
    partition: str = "gpu",
    cpus_on_node: int = 16,
    job_name: str = "swiftslurm",
) -> dict[str, str]:
    """The environment srun gives task `node_id` of a batch job run as `srun --ntasks-per-node=1` with
    `--gpus-per-node=len(gpus)`: SLURM_* as SLURM 23-25 sets them, and CUDA_VISIBLE_DEVICES as the GPU
    plugin sets it without device cgroups (the indices of this node's GPUs)."""
    n = len(hosts)
    gpu_list = ",".join(str(g) for g in gpus)
    per_node = "1" if n == 1 else f"1(x{n})"
    env = {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "SLURM_JOB_NAME": job_name,
        "SLURM_JOB_PARTITION": partition,
        "SLURM_JOB_NODELIST": nodelist,
        "SLURM_NODELIST": nodelist,
        "SLURM_JOB_NUM_NODES": str(n),
        "SLURM_NNODES": str(n),
        "SLURM_NTASKS": str(n),
        "SLURM_NPROCS": str(n),
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_TASKS_PER_NODE": per_node,
        "SLURM_JOB_CPUS_PER_NODE": str(cpus_on_node) if n == 1 else f"{cpus_on_node}(x{n})",
        "SLURM_CPUS_ON_NODE": str(cpus_on_node),
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_STEP_NUM_NODES": str(n),
        "SLURM_STEP_NUM_TASKS": str(n),
        "SLURM_STEP_TASKS_PER_NODE": per_node,
        "SLURM_NODEID": str(node_id),
        "SLURM_PROCID": str(node_id),
        "SLURM_LOCALID": "0",
        "SLURMD_NODENAME": hosts[node_id],
        "SLURM_TOPOLOGY_ADDR": hosts[node_id],
        "SLURM_TOPOLOGY_ADDR_PATTERN": "node",
        "SLURM_GPUS_ON_NODE": str(len(gpus)),
        "SLURM_GPUS_PER_NODE": str(len(gpus)),
        "SLURM_JOB_GPUS": gpu_list,
        "SLURM_STEP_GPUS": gpu_list,
        "CUDA_VISIBLE_DEVICES": gpu_list,
        "GPU_DEVICE_ORDINAL": gpu_list,
    }
    if restart_count:
        env["SLURM_RESTART_COUNT"] = str(restart_count)
    return env


def plain_swift_argv(argv: Sequence[str], engine: Engine) -> list[str]:
    """The `swift sft` / `megatron sft` command a user would run without swiftslurm: the plan's argv without
    the callbacks and the plugin the engine adapter adds (`--callbacks swiftslurm_...`, `--external_plugins`)."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token in ("--callbacks", "--external_plugins"):
            values = []
            i += 1
            while i < len(argv) and not argv[i].startswith("--"):
                values.append(argv[i])
                i += 1
            dropped = {*engine.callbacks, str(engine.plugin)}
            kept = [v for v in values if v not in dropped]
            if kept:
                out += [token, *kept]
            continue
        out.append(token)
        i += 1
    return out


def replace_arg(argv: Sequence[str], name: str, value: str) -> list[str]:
    """argv with `--name`'s (single) value replaced."""
    out = list(argv)
    index = out.index(f"--{name}")
    out[index + 1] = value
    return out


_COMMITTED = re.compile(r"\[swiftslurm\] committed checkpoint-(\d+)")


def committed_steps(log_text: str) -> list[int]:
    """The steps the commit hook reported in a node log (a progress bar may precede the line, after a `\r`)."""
    return [int(s) for s in _COMMITTED.findall(log_text)]


def step_of(entry: Mapping[str, Any]) -> int:
    return int(str(entry["global_step/max_steps"]).split("/")[0])


def step_entries(entries: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """ms-swift's per-step log lines (the end-of-training summary, which has `train_runtime`, excluded)."""
    return [e for e in entries if "loss" in e and "global_step/max_steps" in e and "train_runtime" not in e]


_VOTE = re.compile(r"\[swiftslurm\] stop vote: (\d+) steps, (\d+) us per step on average, (\d+) us at most")
_WRAPPER = re.compile(r"\[swiftslurm\] wrapper: ([\d.]+) CPU-s while training ran (\d+) s")


def direct_costs(trainer_log: str, wrapper_log: str = "") -> dict[str, float]:
    """What swiftslurm itself spent, from the lines it logs: the stop vote's time inside the training loop
    (mean and worst microseconds per step, rank 0) and the wrapper's CPU seconds while training ran."""
    costs: dict[str, float] = {}
    if vote := _VOTE.search(trainer_log):
        costs |= {"vote_steps": int(vote[1]), "vote_us_mean": int(vote[2]), "vote_us_max": int(vote[3])}
    if wrapper := _WRAPPER.search(wrapper_log or trainer_log):
        costs |= {"wrapper_cpu_s": float(wrapper[1]), "wrapper_wall_s": int(wrapper[2])}
    return costs


def final_summary(entries: Iterable[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    found = [e for e in entries if "train_runtime" in e and "global_step/max_steps" in e]
    return found[-1] if found else None


@dataclass(frozen=True)
class Throughput:
    """Training throughput over a window of logged steps."""

    first_step: int
    last_step: int
    seconds: float
    samples_per_s: float
    tokens_per_s: float | None


def elapsed_at(entry: Mapping[str, Any], start_step: int) -> float:
    """Seconds since training began at a logged step. ms-swift logs `elapsed_time` in whole seconds only,
    but `train_speed(s/it)` as elapsed / steps since the start to the microsecond: multiply back."""
    return float(entry["train_speed(s/it)"]) * (step_of(entry) - start_step)


def window_throughput(
    entries: Sequence[Mapping[str, Any]], global_batch: int, from_step: int, start_step: int = 0
) -> Throughput:
    """Samples/s and tokens/s between the first logged step >= `from_step` and the last logged step.

    Tokens come from `num_input_tokens_seen` (`--include_num_input_tokens_seen true`: counted over all
    ranks), None if it was not logged. Skipping the first steps leaves out CUDA/NCCL warm-up."""
    steps = step_entries(entries)
    later = [e for e in steps if step_of(e) >= from_step]
    if len(later) < 2:
        raise ValueError(f"need two logged steps from step {from_step}, found {len(later)}")
    a, b = later[0], later[-1]
    seconds = elapsed_at(b, start_step) - elapsed_at(a, start_step)
    samples = (step_of(b) - step_of(a)) * global_batch
    tokens = None
    if "num_input_tokens_seen" in a and "num_input_tokens_seen" in b:
        tokens = (float(b["num_input_tokens_seen"]) - float(a["num_input_tokens_seen"])) / seconds
    return Throughput(step_of(a), step_of(b), seconds, samples / seconds, tokens)


def peak_memory_gib(entries: Iterable[Mapping[str, Any]]) -> float | None:
    """ms-swift's `memory(GiB)`: the most memory torch reserved on this rank's GPU so far (rank 0)."""
    values = [float(e["memory(GiB)"]) for e in entries if "memory(GiB)" in e]
    return max(values) if values else None


def spread(values: Sequence[float]) -> dict[str, float]:
    """min / median / max, as the docs report every repeated figure."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "n": len(values)}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            rows.append(json.loads(line))
    return rows


# --------------------------------------------------------------------------------------- processes


def hosts_for(names: Sequence[str]) -> list[str]:
    """Host names that resolve here, for a nodelist: `names` if they do (adding them to /etc/hosts as
    loopback addresses if needed and allowed), else loopback IP addresses 127.0.0.1, 127.0.0.2, ..."""
    import socket

    def resolves(name: str) -> bool:
        try:
            socket.gethostbyname(name)
            return True
        except OSError:
            return False

    missing = [n for n in names if not resolves(n)]
    if missing:
        with contextlib.suppress(OSError), open("/etc/hosts", "a") as hosts:
            for i, name in enumerate(missing):
                hosts.write(f"127.0.0.{i + 1} {name}\n")
    if all(resolves(n) for n in names):
        return list(names)
    return [f"127.0.0.{i + 1}" for i in range(len(names))]


def kill_tree(proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
    """Send `sig` to a process and everything it started (SLURM ends a step's whole cgroup)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def python() -> str:
    return os.environ.get("SWIFTSLURM_PYTHON", sys.executable)


def plan_run(run_dir: Path, overrides: Sequence[str], env: Mapping[str, str], log: Path) -> dict[str, Any]:
    """`python -m swiftslurm OVERRIDES dry_run=true run_dir=RUN_DIR`: writes the run dir; returns plan.json."""
    argv = [python(), "-m", "swiftslurm", *overrides, "dry_run=true", f"run_dir={run_dir}"]
    with open(log, "ab") as out:
        done = subprocess.run(argv, cwd=REPO, env=dict(env), stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"planning failed ({done.returncode}); see {log}")
    plan: dict[str, Any] = json.loads((run_dir / "plan.json").read_text())
    return plan


@dataclass
class FakeJob:
    """One emulated SLURM job: its id, nodes and GPUs, and the scontrol stand-in's state directory."""

    job_id: int
    hosts: list[str]
    gpus_per_node: list[list[int]]
    state_dir: Path
    base_env: dict[str, str]
    nodelist: str = ""
    restart_count: int = 0
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        import hostlist

        self.nodelist = self.nodelist or hostlist.collect_hostlist(self.hosts)
        self.state_dir.mkdir(parents=True, exist_ok=True)

    def node_env(self, node_id: int) -> dict[str, str]:
        env = dict(self.base_env)
        env["PATH"] = f"{FAKE_SLURM_BIN}:{env.get('PATH', '')}"
        env["FAKE_SLURM_DIR"] = str(self.state_dir)
        # NCCL tells nodes apart by a hash of the host; on one machine, give each "node" its own, so NCCL
        # connects them over the network transport as it would connect two hosts.
        env["NCCL_HOSTID"] = self.hosts[node_id]
        env |= srun_env(
            job_id=self.job_id,
            nodelist=self.nodelist,
            hosts=self.hosts,
            node_id=node_id,
            gpus=self.gpus_per_node[node_id],
            restart_count=self.restart_count,
        )
        return env

    def start(self, run_dir: Path, log_dir: Path) -> None:
        """srun: one wrapper per node (StartTime recorded for `scontrol show job`)."""
        (self.state_dir / "start_time").write_text(datetime.now().strftime("%Y-%m-%dT%H:%M:%S"))
        self.procs = []
        for node in range(len(self.hosts)):
            log = open(log_dir / f"wrapper{node}.r{self.restart_count}.log", "ab")  # noqa: SIM115 (lives with the proc)
            argv = [python(), "-m", "swiftslurm.node", str(run_dir)]
            self.procs.append(
                subprocess.Popen(argv, cwd=REPO, env=self.node_env(node), stdout=log, stderr=subprocess.STDOUT)
            )

    def signal(self, sig: int) -> None:
        """`scancel --signal=SIG` / SLURM's `--signal`: every task of the step gets it."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)

    def requeued(self) -> bool:
        return (self.state_dir / f"requeue.{self.job_id}").exists()

    def end_for_requeue(self) -> None:
        """What SLURM does to a requeued job: TERM to the tasks, KILL (whole cgroup) after KillWait."""
        self.signal(signal.SIGTERM)
        time.sleep(KILL_WAIT_S)
        for proc in self.procs:
            kill_tree(proc)
            proc.wait()
        (self.state_dir / f"requeue.{self.job_id}").unlink()
        self.restart_count += 1

    def kill(self) -> None:
        for proc in self.procs:
            kill_tree(proc)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)

    def running(self) -> bool:
        return any(p.poll() is None for p in self.procs)

    def exit_codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]


class GpuMemorySampler:
    """Peak memory used per GPU index (MiB), from `nvidia-smi` every `interval_ms`, while the context is open."""

    def __init__(self, interval_ms: int = 500) -> None:
        self.interval_ms = interval_ms
        self.peak: dict[str, int] = {}  # keys as JSON writes them
        self._proc: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuMemorySampler:
        try:
            self._proc = subprocess.Popen(
                [
                    "nvidia-smi",
                    "--query-gpu=index,memory.used",
                    "--format=csv,noheader,nounits",
                    f"-lms={self.interval_ms}",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
        except FileNotFoundError:
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            with contextlib.suppress(ValueError):
                index, used = (x.strip() for x in line.split(","))
                self.peak[index] = max(self.peak.get(index, 0), int(used))

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()
        if self._thread is not None:
            self._thread.join(2)


def package_versions(names: Iterable[str]) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "-"
    return found


VERSIONED = (
    "torch",
    "transformers",
    "ms-swift",
    "deepspeed",
    "peft",
    "trl",
    "accelerate",
    "datasets",
    "modelscope",
    "bitsandbytes",
    "nvidia-nccl-cu13",
    "hydra-core",
)
