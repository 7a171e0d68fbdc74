"""Faults on the real local SLURM cluster (scripts/slurm-local.sh): training processes killed with -9 at
random moments (at least once in the middle of a save), and a whole node lost. Whatever happens, the run
resumes only from committed, intact checkpoints and finishes.

Reproduce a failure with the seed it printed: SWIFTSLURM_FAULT_SEED=N (and SWIFTSLURM_FAULT_KILLS=K).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import re
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from swiftslurm.node.checkpoint import (
    MANIFEST,
    QUARANTINE,
    checkpoint_dirs,
    checkpoint_step,
    problems,
    read_manifest,
)
from swiftslurm.node.records import read_attempts, read_status
from tests.conftest import REPO
from tests.integration.conftest import TERMINAL, job_state, swiftslurm

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

T = TypeVar("T")
SEED = int(os.environ.get("SWIFTSLURM_FAULT_SEED", "20251129"))
KILLS = int(os.environ.get("SWIFTSLURM_FAULT_KILLS", "4"))
FAST_RETRIES = ("resilience.backoff_base_s=1", "resilience.max_consecutive_failures=20")
STEP_LINE = re.compile(r"'global_step/max_steps': '(\d+)/(\d+)'")
EXEC_LINE = "[swiftslurm] exec: "
RESUME_ARG = re.compile(r"--resume_from_checkpoint (\S+)")
RUN_ENDED = {"finished", "failed", "cancelled"}
NODE_READY = {"idle", "mixed", "allocated", "completing"}
SAVE_POLL_S = 0.02


# ---------------------------------------------------------------- runs, attempts, logs


def submit(run_dir: Path, *overrides: str) -> str:
    """Submit a run on the local cluster without waiting; return its SLURM job id."""
    done = swiftslurm("+cluster=local-slurm", f"run_dir={run_dir}", *overrides, cwd=run_dir.parent, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    match = re.search(r"submitted job (\d+)", done.stdout)
    assert match, done.stdout
    return match.group(1)


def wait_until(probe: Callable[[], T | None], timeout_s: float, what: str, poll_s: float = 0.5) -> T:
    """Poll ``probe`` until it returns something truthy, and return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(poll_s)


def attempt_ids(run_dir: Path) -> list[str]:
    """The attempts that have a log folder, oldest first: '<job>', '<job>.r1', '<job>.r2', ..."""
    logs = run_dir / "logs"
    names = [p.name for p in logs.iterdir() if p.is_dir()] if logs.is_dir() else []
    return sorted(names, key=lambda name: int(name.partition(".r")[2] or 0))


def node_log(run_dir: Path, attempt: str, node: int) -> str:
    try:
        return (run_dir / "logs" / attempt / f"node{node}.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def exec_line(run_dir: Path, attempt: str, node: int) -> str | None:
    """The command line the node's wrapper started ms-swift with (written once it chose the resume point)."""
    return next((line for line in node_log(run_dir, attempt, node).splitlines() if line.startswith(EXEC_LINE)), None)


def next_attempt(run_dir: Path, known: list[str], timeout_s: float = 400) -> str:
    """Wait for an attempt not in ``known`` whose two nodes have both started ms-swift; return its id."""

    def started() -> str | None:
        new = [a for a in attempt_ids(run_dir) if a not in known]
        if new and all(exec_line(run_dir, new[-1], node) for node in (0, 1)):
            return new[-1]
        return None

    return wait_until(started, timeout_s, f"a new attempt of {run_dir} (known: {known})")


def wait_for_training(run_dir: Path, attempt: str, timeout_s: float = 300) -> None:
    wait_until(lambda: STEP_LINE.search(node_log(run_dir, attempt, 0)), timeout_s, f"attempt {attempt} to train")


def job_hosts(job_id: str) -> list[str]:
    """The nodes the job runs on now, first (the batch host, node 0) first."""
    nodelist = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True).stdout
    return expand_hostlist(nodelist.strip())


def expand_hostlist(nodelist: str) -> list[str]:
    if not nodelist or nodelist == "None assigned":
        return []
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def job_instances(job_id: str) -> list[tuple[str, list[str]]]:
    """(state, nodes) of every run of the job, requeued ones included, oldest first (sacct --duplicates)."""
    out = subprocess.run(
        ["sacct", "-j", job_id, "-D", "-X", "-n", "-P", "-o", "State,NodeList"], capture_output=True, text=True
    ).stdout
    rows = [line.split("|") for line in out.splitlines() if line.strip()]
    return [(state.split()[0], expand_hostlist(nodes)) for state, nodes in rows]


def wait_for_run_end(run_dir: Path, job_id: str, timeout_s: float = 600) -> str:
    """The job's final state once the run has ended. A requeued job passes through states that look final
    (REQUEUED, NODE_FAIL), so the run's own status.json decides; a job that stays in a final state for a
    minute without the run saying it ended (e.g. killed and never requeued) ends the wait too."""
    final_since: list[float] = []

    def ended() -> str | None:
        state = job_state(job_id)
        if state not in TERMINAL:
            final_since.clear()
            return None
        if (read_status(run_dir) or {}).get("state") in RUN_ENDED:
            return state
        final_since[:] = final_since or [time.monotonic()]
        return state if time.monotonic() - final_since[0] > 60 else None

    return wait_until(ended, timeout_s, f"job {job_id} ({run_dir}) to end", poll_s=2)


def cancel_if_active(job_id: str) -> None:
    if job_state(job_id) not in TERMINAL or (squeue_state(job_id) or "COMPLETED") not in TERMINAL:
        subprocess.run(["scancel", job_id], capture_output=True)


def squeue_state(job_id: str) -> str | None:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.strip()
    return out or None


# ---------------------------------------------------------------- training processes


def training_workers(run_dir: Path) -> list[tuple[int, int]]:
    """(rank, PID) of the run's ms-swift training processes, rank 0 first. torchrun's command line names
    sft.py too, so only a process running sft.py as its script counts."""
    output = str(run_dir / "output")
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if not any(arg.endswith("swift/cli/sft.py") for arg in argv[1:3]) or output not in argv:
                continue
            env = (entry / "environ").read_bytes().decode(errors="replace").split("\0")
            rank = next((int(v.split("=", 1)[1]) for v in env if v.startswith("RANK=")), -1)
            found.append((rank, int(entry.name)))
    return sorted(found)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def kill_9(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def wait_gone(pids: list[int], timeout_s: float = 30) -> None:
    wait_until(lambda: not any(alive(p) for p in pids), timeout_s, f"PIDs {pids} to die", poll_s=0.1)


def newest_committed_step(output: Path) -> int:
    steps = [step for step, path in checkpoint_dirs(output) if (path / MANIFEST).is_file()]
    return max(steps, default=0)


def saving_checkpoint(output: Path, above: int) -> Path | None:
    """A checkpoint newer than step ``above`` and every committed one that has no manifest yet: a save in
    progress (an older folder without manifest is one being pruned, not saved)."""
    dirs = checkpoint_dirs(output)
    committed = max((step for step, path in dirs if (path / MANIFEST).is_file()), default=0)
    return next((path for step, path in dirs if step > max(above, committed) and not (path / MANIFEST).is_file()), None)


def kill_during_next_save(run_dir: Path, pids: list[int], above: int, timeout_s: float = 120) -> Path | None:
    """Poll the output dir every 20 ms; kill -9 ``pids`` the moment a new checkpoint exists without its
    manifest. Return that checkpoint if it is still uncommitted once they are dead (the kill landed
    mid-save), None if the commit won the race."""
    deadline = time.monotonic() + timeout_s
    while (folder := saving_checkpoint(run_dir / "output", above)) is None:
        assert time.monotonic() < deadline, f"no save started within {timeout_s} s"
        time.sleep(SAVE_POLL_S)
    kill_9(pids)
    wait_gone(pids)
    return None if (folder / MANIFEST).exists() else folder


# ---------------------------------------------------------------- resume points


@dataclass(frozen=True)
class ResumeSeen:
    """The checkpoint an attempt resumed from, as found on disk when the attempt started."""

    attempt: str
    checkpoint: Path | None
    committed_at: float | None  # its manifest's, None if it had none
    problems: tuple[str, ...]  # problems(deep=True) at that moment
    inode: int | None


def inspect_resume_point(run_dir: Path, attempt: str) -> ResumeSeen:
    """Read the checkpoint both nodes pass to ms-swift, and verify it at once (before training can touch or
    prune anything)."""
    lines = [exec_line(run_dir, attempt, node) or "" for node in (0, 1)]
    chosen = [m.group(1) if (m := RESUME_ARG.search(line)) else None for line in lines]
    assert chosen[0] == chosen[1], f"attempt {attempt}: node 0 resumes from {chosen[0]}, node 1 from {chosen[1]}"
    if chosen[0] is None:
        return ResumeSeen(attempt, None, None, (), None)
    path = Path(chosen[0])
    manifest = read_manifest(path)
    inode = path.stat().st_ino if path.is_dir() else None
    return ResumeSeen(attempt, path, manifest and manifest["committed_at"], tuple(problems(path, deep=True)), inode)


def quarantined_folders(output: Path) -> list[Path]:
    folder = output / QUARANTINE
    return sorted(folder.iterdir()) if folder.is_dir() else []


# ---------------------------------------------------------------- test 1: kill -9 at random moments


def test_kill_9_at_random_moments_always_resumes_from_a_committed_checkpoint(
    tmp_path: Path, slurm_cluster: None
) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}, {KILLS} kills")
    run_dir = tmp_path / "run"
    keep = 3
    job = submit(run_dir, "swift.max_steps=300", "swift.save_steps=15", f"keep_checkpoints={keep}", *FAST_RETRIES)
    save_kill_turn = rng.randrange(KILLS)
    seen: list[ResumeSeen] = []
    mid_save: dict[str, Path] = {}  # attempt -> the checkpoint it was killed in the middle of saving
    try:
        kills = 0
        # One kill mid-save is required; if the commit wins the race, the next kill tries again (3 extra at most).
        while kills < KILLS or (not mid_save and kills < KILLS + 3):
            attempt = next_attempt(run_dir, [s.attempt for s in seen])
            seen.append(inspect_resume_point(run_dir, attempt))
            wait_for_training(run_dir, attempt)
            workers = wait_until(lambda: training_workers(run_dir), 30, "the training workers")
            pids = [pid for _, pid in workers]
            if kills >= save_kill_turn and not mid_save:
                resume_step = checkpoint_step(seen[-1].checkpoint) or 0 if seen[-1].checkpoint else 0
                folder = kill_during_next_save(run_dir, pids, resume_step)
                print(f"{attempt}: kill -9 {pids} during the save of {folder} (None: the commit won)")
                if folder is not None:
                    mid_save[attempt] = folder
            else:
                delay = rng.uniform(0.0, 3.0)
                victims = pids if rng.random() < 0.5 else [rng.choice(pids)]
                time.sleep(delay)
                print(f"{attempt}: kill -9 {victims} {delay:.2f} s after training started")
                kill_9(victims)
            kills += 1
        seen.append(inspect_resume_point(run_dir, next_attempt(run_dir, [s.attempt for s in seen])))
        state = wait_for_run_end(run_dir, job)
    finally:
        cancel_if_active(job)
    assert state == "COMPLETED", (state, read_status(run_dir))
    assert mid_save, "no kill landed in the middle of a save"
    assert_kill_history(run_dir, seen, mid_save, keep)


def assert_kill_history(run_dir: Path, seen: list[ResumeSeen], mid_save: dict[str, Path], keep: int) -> None:
    output = run_dir / "output"
    records = read_attempts(run_dir)
    for record in records:
        print({k: record.get(k) for k in ("attempt", "reason", "decision", "resume_step", "committed_step", "why")})
    assert (read_status(run_dir) or {}).get("state") == "finished", read_status(run_dir)
    assert [r["attempt"] for r in records] == [s.attempt for s in seen]
    for record in records[:-1]:
        assert (record["reason"], record["decision"]) == ("infra", "requeue"), record
        assert record["exit_code"] != 0 and record["rejected"] == [], record
    assert (records[-1]["reason"], records[-1]["decision"], records[-1]["committed_step"]) == ("finished", "done", 300)
    for before, after in itertools.pairwise(records):  # each attempt resumes from the newest commit of the last
        assert after["resume_step"] == before["committed_step"], (before, after)
    for record, resume in zip(records, seen, strict=True):
        assert record["resumed_from"] == (str(resume.checkpoint) if resume.checkpoint else None), record
        if resume.checkpoint:
            assert resume.committed_at is not None, f"{record['attempt']} resumed from an uncommitted {resume}"
            assert resume.problems == (), resume
            assert_still_there_or_pruned(output, resume, keep)
    for folder in quarantined_folders(output):
        assert not (folder / MANIFEST).exists(), f"a committed checkpoint was quarantined: {folder}"
    for attempt, folder in mid_save.items():
        after = records[[r["attempt"] for r in records].index(attempt) + 1]
        assert any(Path(q).name.startswith(f"{folder.name}.") for q in after["quarantined"]), (folder, after)
    final = output / "checkpoint-300"
    assert read_manifest(final) is not None and problems(final, deep=True) == []


def assert_still_there_or_pruned(output: Path, resume: ResumeSeen, keep: int) -> None:
    """A checkpoint resumed from is never quarantined: it is still committed and intact, or it was pruned
    (deleted because `keep` newer committed checkpoints exist)."""
    assert resume.checkpoint is not None
    moved = [q for q in quarantined_folders(output) if q.stat().st_ino == resume.inode]
    assert not moved, f"{resume.attempt} resumed from {resume.checkpoint}, now in quarantine as {moved}"
    if resume.checkpoint.exists():
        manifest = read_manifest(resume.checkpoint)
        assert manifest and manifest["committed_at"] == resume.committed_at, (resume, manifest)
        assert problems(resume.checkpoint, deep=True) == []
        return
    step = checkpoint_step(resume.checkpoint) or 0
    newer = [s for s, path in checkpoint_dirs(output) if s > step and read_manifest(path) is not None]
    assert len(newer) >= keep, f"{resume.checkpoint} vanished, but only {newer} are newer and committed"


# ---------------------------------------------------------------- test 2: a node lost


def cluster_state_dir() -> Path:
    env = subprocess.run(
        ["bash", str(REPO / "scripts" / "slurm-local.sh"), "env"], capture_output=True, text=True
    ).stdout
    found = re.search(r"^SWIFTSLURM_SLURM_STATE=(\S+)$", env, re.MULTILINE)
    return Path(found.group(1) if found else "/tmp/swiftslurm-slurm")


def slurmd_pid(node: str) -> int | None:
    """The PID of `slurmd -D -N NODE` (how scripts/slurm-local.sh starts each node's daemon)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                argv = (entry / "cmdline").read_bytes().decode().split("\0")
                if Path(argv[0]).name == "slurmd" and argv[1:4] == ["-D", "-N", node] and alive(int(entry.name)):
                    return int(entry.name)
    return None


def namespace_pids(node: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", f"sslurm-{node}"], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def node_state(node: str) -> str:
    out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-p", "debug", "-o", "%T"], capture_output=True, text=True)
    return out.stdout.strip()


def other_jobs_on(node: str, job_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-w", node, "-o", "%i"], capture_output=True, text=True).stdout
    return [j for j in out.split() if j != job_id]


def lose_node(node: str) -> None:
    """As if the node lost power: kill -9 its slurmd, then everything in its network namespace (slurmstepd,
    the wrapper, swift, torchrun, the worker), until nothing is left there."""
    daemon = slurmd_pid(node)
    assert daemon is not None, f"slurmd of {node} is not running"
    kill_9([daemon])
    for _ in range(50):
        left = [pid for pid in namespace_pids(node) if alive(pid)]
        if not left:
            return
        kill_9(left)
        time.sleep(0.2)
    raise AssertionError(f"processes in {node}'s namespace survive kill -9: {left}")


def START_SLURMD_IN_NAMESPACE(node: str) -> list[str]:
    return []


def restore_node(node: str, state_dir: Path) -> None:
    """Start the node's slurmd again as scripts/slurm-local.sh's start_slurmd does, record its PID where the
    script's status/up look for it, and return the node to service."""
    if slurmd_pid(node) is None:
        with open(state_dir / "log" / f"slurmd-{node}.out", "ab") as out:
            daemon = subprocess.Popen(
                [*START_SLURMD_IN_NAMESPACE(node)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=state_dir,
            )
        # nsenter, unshare and sh all exec: the PID is slurmd's, as `start_daemon` records it.
        (state_dir / "pids" / f"slurmd-{node}.pid").write_text(f"{daemon.pid} slurmd\n")
        wait_until(lambda: slurmd_pid(node) == daemon.pid, 30, f"slurmd of {node} to start")
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
    wait_until(lambda: node_state(node) in NODE_READY, 120, f"{node} back in service (sinfo: {node_state(node)})")


def test_lost_node_is_excluded_and_the_run_finishes_on_the_others(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    job = submit(run_dir, "swift.max_steps=400", "swift.save_steps=20", *FAST_RETRIES)
    state_dir = cluster_state_dir()
    lost: str | None = None
    try:
        first = next_attempt(run_dir, [])
        wait_for_training(run_dir, first)
        hosts = job_hosts(job)
        assert len(hosts) == 2, hosts
        lost = hosts[1]
        # Be kind to concurrent tests: give their jobs on that node a little time to leave it.
        with contextlib.suppress(AssertionError):
            wait_until(lambda: not other_jobs_on(lost, job), 20, f"other jobs to leave {lost}", poll_s=2)
        print(f"job {job} on {hosts}: losing {lost} (other jobs there: {other_jobs_on(lost, job)})")
        lose_node(lost)
        state = wait_for_run_end(run_dir, job, timeout_s=600)
    finally:
        cancel_if_active(job)
        if lost is not None:
            restore_node(lost, state_dir)
    assert lost is not None
    assert_run_finished_without(run_dir, job, state, first, lost)


def assert_run_finished_without(run_dir: Path, job: str, state: str, first: str, lost: str) -> None:
    records = read_attempts(run_dir)
    instances = job_instances(job)
    for record in records:
        print({k: record.get(k) for k in ("attempt", "hosts", "reason", "decision", "failed_host", "exclude_hosts")})
        print("   why:", record.get("why"))
    print("sacct:", instances)
    assert state == "COMPLETED", (state, read_status(run_dir), records)
    assert (read_status(run_dir) or {}).get("state") == "finished", read_status(run_dir)
    lost_attempt = records[0]
    assert lost_attempt["attempt"] == first and lost in lost_attempt.get("hosts", [lost]), lost_attempt
    assert (lost_attempt["reason"], lost_attempt["decision"]) == ("infra", "requeue"), lost_attempt
    if "ended without a record" not in lost_attempt["why"]:  # the leader's wrapper wrote it: it named the node
        assert lost_attempt["failed_host"] == lost and lost in lost_attempt["exclude_hosts"], lost_attempt
    later = records[1:]
    assert later and (later[-1]["reason"], later[-1]["decision"]) == ("finished", "done"), later
    for record in later:
        assert record.get("hosts") is None or lost not in record["hosts"], record
    assert lost in instances[0][1], instances
    assert instances[-1][0] == "COMPLETED", instances
    for _, nodes in instances[1:]:
        assert lost not in nodes, instances
    final = run_dir / "output" / "checkpoint-400"
    assert read_manifest(final) is not None and problems(final, deep=True) == []
