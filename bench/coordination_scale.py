"""Benchmark: swiftslurm's coordination layer at 2, 4, 8 and 16 nodes (issue 29, part 2), on the local cluster.

    SWIFTSLURM_SLURM_NODES=16 SWIFTSLURM_SLURM_GROUPS=1 bash scripts/slurm-local.sh up --force
    .venv/bin/python -m bench.coordination_scale [--nodes 2 4 8 16] [--repeats 2] [--control] [--real-trainers K]
        [--out FILE]

Every node runs the real wrapper and a real ms-swift trainer (the tiny Qwen3 LoRA run, `+cluster=local-slurm
cluster.nodes=N`). Each repeat submits the run, lets it train, counts the run dir's file traffic for WINDOW_S
of steady training, asks `swiftslurm status` once, sends `scancel --signal=USR2` (SLURM's warning ahead of a
preemption), waits until every node of the requeued job has launched its trainer again and node 0 logs a
resumed step, then cancels the job. Node counts alternate inside each repeat (2, 4, 8, 16, 2, ...), so that
a drift of the shared machine falls on all of them alike.

What is read, and from where:
  start, own share      max over nodes of (trainer launched - wrapper up): the wrapper's "wrapper start-up"
                        line (watch.py: its CPU seconds and the launch time) and submitit's "Starting with
                        JobEnvironment" line, both in submitit/<job>_<node>_log.out. It covers the lease, the
                        preflight, the agreement on the resume point and the wrapper's own imports after
                        submitit's; not SLURM's launch of the batch script and srun (before "wrapper up").
  resume, own share     (requeued - stop checkpoint written) + the resumed attempt's start own share: the
                        commit (manifest `committed_at`), every node's trainer ended and its result written,
                        node 0's decision and `scontrol requeue` (slurmctld's "Requeuing" line). Not in it:
                        ms-swift's save, SLURM's requeue delay and relaunch, ms-swift's start-up.
  wrapper CPU-s         the wrapper's own utime+stime (getrusage RUSAGE_SELF) up to its trainer's launch, per
                        node: what swiftslurm costs whatever the load; its preflight's child processes are
                        not in it.
  controller calls      a PATH shim for scontrol, sacct, squeue, sinfo, srun, sbatch, scancel that logs each
                        call and execs the real one; the submission's PATH (sbatch --export=ALL) carries it to
                        every node. Per attempt: node-side calls before slurmctld's requeue (attempt 1) and
                        after it (attempt 2, up to the bench's scancel). `status`: calls of one invocation.
  run-dir traffic       inotifywait -r on the run dir during WINDOW_S of training: files opened (reads and
                        directory listings) and written (close_write, moved_to, create), per second, split into
                        swiftslurm's files and the trainer's own (output/, ms-swift's node*.log). A stat()
                        without an open is invisible to inotify and not counted.

--real-trainers K: nodes 0..K-1 run the real ms-swift trainer, as one torch.distributed world of K nodes
(torchrun's NNODES=K), and every other node runs the real wrapper with a TRAINER STAND-IN in place of ms-swift:
`sleep` (named `swiftslurm-bench-trainer-stand-in` in ps, with a line saying so in its node log), which uses no
CPU, never trains and ends when its wrapper ends it: on the stop checkpoint's commit (written by the real
world's global rank 0 on node 0), as the wrapper ends a real trainer. Both go through `cluster.python`: a
`python` that execs the venv's, beside a `swift` that chooses per node (NODE_RANK) between the real `swift` and
the stand-in, so the plan and the allocation keep N nodes and every wrapper does all it does for a real one
(lease, preflight, resume point, stop signal, result, requeue). What the stand-ins leave out is the extra
trainers' load on the shared cores: their start-up, steps and tear-down. The JSON says `real_trainers` and
`trainer_stand_ins` per run.

--control repeats the 2-node run with the machine loaded like the 16-node one: 14 CPU-busy stand-in
processes (`python -c 'while True: pass'`, named as such), started before the submission and ended after
the repeat. The 16-node run's extra load is 14 more trainers (and wrappers) competing for the 2 cores under
the same scheduler; busy loops take the same share of the cores that they take, so the 2 nodes' wrappers see
the run queue they would see at 16 nodes. A cgroup limit of 2/16 of the machine would instead throttle
them in 100 ms periods, a pattern the 16-node run does not have.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.preemption import requeue_marks, written_at
from swiftslurm.ckpt.checkpoint import MANIFEST
from swiftslurm.testing.cluster import attempts, preempt, queue_state, wait_until

REPO = Path(__file__).resolve().parents[1]
PYTHON = REPO / ".venv" / "bin" / "python"
SHIMMED = ("scontrol", "sacct", "squeue", "sinfo", "srun", "sbatch", "scancel")
CALLER_ENV = "SWIFTSLURM_BENCH_CALLER"  # the shim names the caller by it (else the job id, else "login")
SIGNAL_AT_STEP = 3
WINDOW_S = 10.0
MAX_STEPS = 2000  # never reached: the job is cancelled once it resumed
TIMEOUT_S = 600.0
CONTROL_STAND_INS = 14

_UP = re.compile(r"submitit INFO \((\S+ \S+)\) - Starting with JobEnvironment")
_STARTUP = re.compile(r"\[swiftslurm\] wrapper start-up: ([\d.]+) CPU-s; trainer launched at ([\d.]+)")
_STEP = re.compile(r"'global_step/max_steps': '(\d+)/(\d+)'")

# The `swift` of --real-trainers K (see the module's docstring): NODE_RANK < K runs the real one in a K-node world.
TRAINER_SHIM = """#!/bin/bash
# bench/coordination_scale.py --real-trainers REAL_NODES: nodes 0..REAL_NODES-1 train, the others run a stand-in
if [ "${NODE_RANK:-0}" -lt REAL_NODES ]; then
    export NNODES=REAL_NODES
    exec REAL_SWIFT "$@"
fi
echo "[bench] TRAINER STAND-IN on node ${NODE_RANK}: not ms-swift (bench.coordination_scale --real-trainers \
REAL_NODES); it trains nothing, uses no CPU and runs until its wrapper ends it"
exec -a swiftslurm-bench-trainer-stand-in sleep infinity
"""
PYTHON_SHIM = """#!/bin/bash
exec REAL_PYTHON "$@"
"""
STAND_IN_NAME = "swiftslurm-bench-trainer-stand-in"

SHIM = """#!/bin/bash
printf '%s %s %s %s\\n' "$EPOCHREALTIME" "${CALLER:-${SLURM_JOB_ID:-login}}" "$(basename "$0")" "$*" >>LOG
exec /usr/bin/$(basename "$0") "$@"
"""


# --------------------------------------------------------------------------------------------- pure parts


def wrapper_ups(text: str) -> list[float]:
    """When submitit's process started the wrapper, each run of the job in one node's log, oldest first."""
    return [datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp() for m in _UP.finditer(text)]


def startups(text: str) -> list[tuple[float, float]]:
    """(wrapper CPU-s, trainer launched at) for each launch in one node's wrapper log, oldest first."""
    return [(float(m[1]), float(m[2])) for m in _STARTUP.finditer(text)]


def own_start(ups: Sequence[float], launches: Sequence[float]) -> float:
    """The slowest node's time from its wrapper up to its trainer launched (node i: ups[i], launches[i])."""
    return max(launch - up for up, launch in zip(ups, launches, strict=True))


# `scontrol show hostnames` expands the list in the scontrol process itself, with no message to slurmctld: with
# SlurmctldHost set to an unreachable address it still printed the hosts, in 4 ms. Counted apart from the
# controller's calls.
LOCAL_HOSTNAMES = "scontrol show hostnames (local)"


def calls_by_phase(lines: Iterable[str], job: str, requeued: float, cancelled: float) -> dict[str, Counter[str]]:
    """Controller calls from the shim's log: the job's node-side calls before slurmctld requeued it (attempt 1)
    and from then until the bench cancelled it (attempt 2), and every other caller's by name."""
    found: dict[str, Counter[str]] = {"attempt 1": Counter(), "attempt 2": Counter()}
    for line in lines:
        at, caller, command, *rest = line.split(" ", 3)
        if command == "scontrol" and rest and rest[0].startswith("show hostnames"):
            command = LOCAL_HOSTNAMES
        if caller == job:
            if float(at) < requeued:
                found["attempt 1"][command] += 1
            elif float(at) < cancelled:
                found["attempt 2"][command] += 1
        else:
            found.setdefault(caller, Counter())[command] += 1
    return found


def traffic(lines: Iterable[str], seconds: float) -> dict[str, float]:
    """inotifywait lines (`EVENTS PATH`, path relative to the run dir) -> opens and writes per second, for
    swiftslurm's files and for the trainer's (output/ and ms-swift's output in node*.log)."""
    counts: Counter[str] = Counter()
    for line in lines:
        events, _, path = line.partition(" ")
        owner = "trainer" if path.startswith("output/") or re.search(r"/node\d+\.log$", path) else "swiftslurm"
        kinds = set(events.split(","))
        if "OPEN" in kinds:
            counts[f"{owner} opens"] += 1
        if kinds & {"CLOSE_WRITE", "MOVED_TO", "CREATE"}:
            counts[f"{owner} writes"] += 1
    keys = ("swiftslurm opens", "swiftslurm writes", "trainer opens", "trainer writes")
    return {key: round(counts[key] / seconds, 2) for key in keys}


def spread(values: Sequence[float]) -> str:
    """min / median / max."""
    return f"{min(values):.2f} / {statistics.median(values):.2f} / {max(values):.2f}"


def real_trainers(trainer_python: Path | None, nodes: int) -> int:
    """How many nodes train for real: those below the shim's REAL_NODES, or all without shims."""
    if trainer_python is None:
        return nodes
    match = re.search(r"-lt (\d+) \]", (trainer_python.parent / "swift").read_text())
    return min(nodes, int(match[1])) if match else nodes


def stand_ins_seen(run_dir: Path, job: str, nodes: int) -> int:
    """Node logs of the job's first attempt in which a trainer stand-in said it ran (the check that it did)."""
    logs = (run_dir / "logs" / job / f"node{n}.log" for n in range(nodes))
    return sum(1 for log in logs if log.exists() and "TRAINER STAND-IN" in log.read_text(errors="replace"))


# --------------------------------------------------------------------------------------------- one repeat


def make_shim(root: Path) -> tuple[Path, Path]:
    shim, log = root / "shim", root / "slurm-calls.log"
    shim.mkdir(parents=True, exist_ok=True)
    for name in SHIMMED:
        path = shim / name
        path.write_text(SHIM.replace("LOG", str(log)).replace("CALLER", CALLER_ENV))
        path.chmod(0o755)
    return shim, log


def make_trainer_shims(root: Path, real_nodes: int, python: Path = PYTHON) -> Path:
    """`python` and `swift` for --real-trainers (`cluster.python=` the returned path): the plan's `swift` is the
    one beside its Python, so this `swift` is the trainer every wrapper starts."""
    folder = root / "trainers"
    folder.mkdir(parents=True, exist_ok=True)
    shims = {
        "python": PYTHON_SHIM.replace("REAL_PYTHON", str(python)),
        "swift": TRAINER_SHIM.replace("REAL_SWIFT", str(python.parent / "swift")).replace(
            "REAL_NODES", str(real_nodes)
        ),
    }
    for name, text in shims.items():
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder / "python"


def step_of(log: Path) -> int:
    try:
        steps = _STEP.findall(log.read_text(errors="replace"))
    except FileNotFoundError:
        return 0
    return int(steps[-1][0]) if steps else 0


def node_logs(run_dir: Path, job: str, nodes: int) -> list[str]:
    texts = []
    for node in range(nodes):
        path = run_dir / "submitit" / f"{job}_{node}_log.out"
        texts.append(path.read_text(errors="replace") if path.exists() else "")
    return texts


def launches_seen(run_dir: Path, job: str, nodes: int) -> int:
    return min(len(startups(text)) for text in node_logs(run_dir, job, nodes))


def stand_ins(count: int) -> list[subprocess.Popen[bytes]]:
    """CPU-busy stand-ins for the load of 14 more nodes (--control); named so in ps."""
    code = "# cpu-busy stand-in (bench.coordination_scale --control)\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(count)]


def one_repeat(
    root: Path,
    nodes: int,
    tag: str,
    shim: Path,
    calls_log: Path,
    load: int = 0,
    trainer_python: Path | None = None,
    partition: str | None = None,
) -> dict[str, Any]:
    """One submission of ``nodes`` nodes, signalled and resumed; ``trainer_python``: make_trainer_shims' (stand-ins
    for the nodes past --real-trainers), else every node trains for real."""
    run_dir = root / f"{tag}-n{nodes}"
    # PYTHONPATH: the nodes (sbatch --export=ALL) run this checkout's swiftslurm, not the one the venv installed.
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "PYTHONPATH": str(REPO)}
    busy = stand_ins(load)
    watcher = None
    try:
        submitted = time.time()
        argv = [str(PYTHON), "-m", "swiftslurm", "+cluster=local-slurm", f"cluster.nodes={nodes}", f"run_dir={run_dir}"]
        argv += [f"swift.max_steps={MAX_STEPS}", "swift.save_steps=1000"]
        argv += [f"cluster.python={trainer_python}"] if trainer_python else []
        argv += [f"cluster.partition={partition}"] if partition else []
        done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300)
        match = re.search(r"submitted job (\d+)", done.stdout)
        if not match:
            raise RuntimeError(f"submission failed: {done.stdout[-1500:]} {done.stderr[-1500:]}")
        job = match[1]
        node0 = run_dir / "logs" / job / "node0.log"
        wait_until(lambda: step_of(node0) >= SIGNAL_AT_STEP, TIMEOUT_S, f"step {SIGNAL_AT_STEP}", poll_s=0.2)
        events = root / f"{tag}-n{nodes}.inotify"
        with events.open("w") as out:
            watcher = subprocess.Popen(
                [
                    "inotifywait",
                    "-m",
                    "-r",
                    "-q",
                    "--format",
                    "%e %w%f",
                    "-e",
                    "open,close_write,moved_to,create",
                    str(run_dir),
                ],
                stdout=out,
            )
            time.sleep(1.0)  # inotifywait sets its watches
            with events.open() as reader:
                reader.seek(0, os.SEEK_END)
                start = reader.tell()
                time.sleep(WINDOW_S)
                reader.seek(start)
                window = [line.strip().replace(f"{run_dir}/", "", 1) for line in reader.readlines()]
            status_at = time.time()
            status = subprocess.run(
                [str(PYTHON), "-m", "swiftslurm", "status", str(run_dir)],
                env={**env, CALLER_ENV: f"status-{job}"},
                capture_output=True,
                text=True,
                timeout=120,
            )
            status_s = time.time() - status_at
            watcher.terminate()
        preempt(job)
        wait_until(lambda: launches_seen(run_dir, job, nodes) >= 2, TIMEOUT_S, "every node launched again", 0.5)
        resumed = max(
            (d for d in (run_dir / "logs").iterdir() if d.is_dir() and d.name != job), key=lambda d: d.stat().st_mtime
        )
        wait_until(lambda: step_of(resumed / "node0.log") > 0, TIMEOUT_S, "a resumed step", poll_s=0.2)
        first_resumed_step = time.time()
        cancelled = time.time()
        subprocess.run(["scancel", job], check=False)
        wait_until(lambda: queue_state(job) in (None, "CANCELLED", "COMPLETED"), 120, "the job gone", poll_s=1)
    finally:
        if watcher is not None and watcher.poll() is None:
            watcher.terminate()
        for process in busy:
            process.kill()
            process.wait()
    return measure(
        run_dir,
        job,
        nodes,
        {
            "submitted": submitted,
            "first_resumed_step_seen": first_resumed_step,
            "cancelled": cancelled,
            "window": window,
            "calls_log": calls_log,
            "status_ok": status.returncode == 0,
            "status_s": status_s,
            "load": load,
            "tag": tag,
            "real_trainers": real_trainers(trainer_python, nodes),
        },
    )


def stop_checkpoint(run_dir: Path, requeued: float) -> tuple[float, Path]:
    """(committed_at, folder) of the newest checkpoint committed before the requeue: the stop checkpoint. The
    bench's scancel of the resumed job commits another one later, which is not it."""
    committed = []
    for manifest in run_dir.glob("output/**/checkpoint-*/" + MANIFEST):
        at = float(json.loads(manifest.read_text())["committed_at"])
        if at < requeued:
            committed.append((at, manifest.parent))
    return max(committed)


def node_results(run_dir: Path, job: str, nodes: int) -> list[dict[str, Any]]:
    """The first attempt's node results (logs/<job>/node<i>.json), {} for a node that wrote none."""
    found = []
    for node in range(nodes):
        path = run_dir / "logs" / job / f"node{node}.json"
        found.append(json.loads(path.read_text()) if path.exists() else {})
    return found


def ended_after(results: Sequence[dict[str, Any]], committed: float) -> list[float | None]:
    """Per node, seconds from the stop checkpoint's commit to its trainer's end as its wrapper saw it."""
    return [round(r["ended_at"] - committed, 3) if r.get("ended_at") is not None else None for r in results]


def measure(run_dir: Path, job: str, nodes: int, seen: dict[str, Any]) -> dict[str, Any]:
    texts = node_logs(run_dir, job, nodes)
    ups = [wrapper_ups(text) for text in texts]
    launched = [startups(text) for text in texts]
    stopped = attempts(run_dir)[0]
    requeued, allocated = requeue_marks(job)
    committed, checkpoint = stop_checkpoint(run_dir, requeued)
    signalled = next(t for name, t in stopped["signals"] if name == "SIGUSR2")
    saved = written_at(checkpoint)
    start_own = own_start([u[0] for u in ups], [lc[0][1] for lc in launched])
    resume_start_own = own_start([u[-1] for u in ups], [lc[-1][1] for lc in launched])
    lines = Path(seen["calls_log"]).read_text().splitlines()
    calls = calls_by_phase(lines, job, requeued, seen["cancelled"])
    first_step = stopped.get("first_step_at")
    real = seen["real_trainers"]
    return {
        "nodes": nodes,
        "job": job,
        "tag": seen["tag"],
        "load_stand_ins": seen["load"],
        "real_trainers": real,
        "trainer_stand_ins": nodes - real,
        "trainer_stand_ins_seen": stand_ins_seen(run_dir, job, nodes),
        "start_own_s": round(start_own, 3),
        "start_cpu_s_per_node": [lc[0][0] for lc in launched],
        "submit_to_first_step_s": round(first_step - seen["submitted"], 3) if first_step else None,
        "resume_own_s": round((requeued - saved) + resume_start_own, 3),
        "resume_parts_s": {
            "commit (written -> committed)": round(committed - saved, 3),
            "committed -> requeued (trainers end, results, decision, scontrol requeue)": round(requeued - committed, 3),
            "resumed start own share": round(resume_start_own, 3),
            "ms-swift save (signal -> written)": round(saved - signalled, 3),
            "SLURM (requeued -> allocated)": round(allocated - requeued, 3),
        },
        # Each node's trainer ended (its wrapper's node result) after the commit: how soon every wrapper saw it.
        "trainer_ended_after_commit_s_per_node": ended_after(node_results(run_dir, job, nodes), committed),
        "resume_cpu_s_per_node": [lc[-1][0] for lc in launched],
        "signal_to_resumed_step_seen_s": round(seen["first_resumed_step_seen"] - signalled, 3),
        "calls": {k: dict(v) for k, v in calls.items()},
        "traffic_per_s": traffic(seen["window"], WINDOW_S),
        "status_ok": seen["status_ok"],
        "status_s": round(seen["status_s"], 3),
    }


# --------------------------------------------------------------------------------------------- tables


def calls_cell(runs: list[dict[str, Any]], attempt: str) -> str:
    """scontrol/sacct/squeue calls of one attempt, each distinct count over the repeats ("4/0/0")."""
    counts = {"/".join(str(r["calls"][attempt].get(c, 0)) for c in ("scontrol", "sacct", "squeue")) for r in runs}
    return " ; ".join(sorted(counts))


def load_cell(busy: int, trainer_stand_ins: int) -> str:
    """What ran beside the real nodes: CPU-busy stand-ins (--control), trainer stand-ins (--real-trainers)."""
    parts = [f"{busy} CPU-busy stand-ins"] if busy else []
    parts += [f"{trainer_stand_ins} trainer stand-ins"] if trainer_stand_ins else []
    return ", ".join(parts) or "-"


def table(results: list[dict[str, Any]]) -> str:
    """One row per (node count, load): min / median / max over the repeats."""
    rows = [
        "| nodes | load | start own (s) | wrapper CPU-s to launch (median node) | resume own (s) | resumed wrapper "
        "CPU-s | swiftslurm opens/s | swiftslurm writes/s | scontrol/sacct/squeue attempt 1 | attempt 2 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    groups: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["nodes"], r["load_stand_ins"], r.get("trainer_stand_ins", 0)), []).append(r)
    for (nodes, load, fake), runs in sorted(groups.items()):
        rows.append(
            f"| {nodes} | {load_cell(load, fake)} | {spread([r['start_own_s'] for r in runs])} | "
            f"{spread([statistics.median(r['start_cpu_s_per_node']) for r in runs])} | "
            f"{spread([r['resume_own_s'] for r in runs])} | "
            f"{spread([statistics.median(r['resume_cpu_s_per_node']) for r in runs])} | "
            f"{spread([r['traffic_per_s']['swiftslurm opens'] for r in runs])} | "
            f"{spread([r['traffic_per_s']['swiftslurm writes'] for r in runs])} | {calls_cell(runs, 'attempt 1')} | "
            f"{calls_cell(runs, 'attempt 2')} |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, nargs="+", default=[2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--control", action="store_true", help="also 2 nodes with 14 CPU-busy stand-ins")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "coordination-scale.json")
    parser.add_argument("--run-root", type=Path)
    parser.add_argument("--partition", help="the local cluster's partition (default: local-slurm's, debug)")
    parser.add_argument(
        "--real-trainers",
        type=int,
        help="nodes 0..K-1 train for real (a K-node world), the others run a trainer stand-in (see above)",
    )
    args = parser.parse_args()
    if shutil.which("inotifywait") is None:
        sys.exit("inotifywait is missing: apt-get install inotify-tools")
    root = args.run_root or Path(tempfile.mkdtemp(prefix="coord-scale-", dir="/tmp"))
    shim, calls_log = make_shim(root)
    trainer_python = make_trainer_shims(root, args.real_trainers) if args.real_trainers else None
    results: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        plan = [(n, 0) for n in args.nodes] + ([(2, CONTROL_STAND_INS)] if args.control else [])
        for nodes, load in plan:
            tag = f"r{repeat}{'-loaded' if load else ''}"
            try:
                result = one_repeat(root, nodes, tag, shim, calls_log, load, trainer_python, args.partition)
            except (AssertionError, RuntimeError, subprocess.SubprocessError, StopIteration, ValueError) as err:
                print(f"[bench] {tag} n={nodes}: unusable: {err}", flush=True)
                results.append({"nodes": nodes, "tag": tag, "load_stand_ins": load, "error": str(err)})
                args.out.write_text(json.dumps({"root": str(root), "results": results}, indent=1))
                continue
            results.append(result)
            print(f"[bench] {json.dumps(result)}", flush=True)
            args.out.write_text(json.dumps({"root": str(root), "results": results}, indent=1))
    print(table([r for r in results if "error" not in r]))


if __name__ == "__main__":
    main()
