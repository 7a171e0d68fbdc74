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

from swiftslurm.ckpt.checkpoint import (
    MANIFEST,
    checkpoint_dirs,
    checkpoint_step,
    problems,
    read_manifest,
)
from swiftslurm.rundir.jsonio import read_jsonl
from swiftslurm.rundir.layout import ATTEMPTS, QUARANTINE
from swiftslurm.rundir.records import read_status
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
MAX_STEPS = 300  # of the run in the kill test
LOST_NODE_STEPS = 400  # of the run that loses a node


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


ATTEMPT_ORDER = re.compile(r"^\d+(?:\.r(\d+))?(?:\.i(\d+))?$")


def attempt_ids(run_dir: Path) -> list[str]:
    """The attempts that have a log folder, oldest first: '<job>', '<job>.i1' (restarted in place),
    '<job>.r1' (requeued), '<job>.r1.i1', ..."""
    logs = run_dir / "logs"
    names = [p.name for p in logs.iterdir() if p.is_dir() and ATTEMPT_ORDER.match(p.name)] if logs.is_dir() else []
    return sorted(names, key=lambda name: tuple(int(n or 0) for n in ATTEMPT_ORDER.match(name).groups()))  # type: ignore[union-attr]


def node_log(run_dir: Path, attempt: str, node: int) -> str:
    try:
        return (run_dir / "logs" / attempt / f"node{node}.log").read_text(errors="replace")
    except FileNotFoundError:
        return ""


def exec_line(run_dir: Path, attempt: str, node: int) -> str | None:
    """The command line the node's wrapper started ms-swift with (written once it chose the resume point)."""
    return next((line for line in node_log(run_dir, attempt, node).splitlines() if line.startswith(EXEC_LINE)), None)


def next_attempt(run_dir: Path, known: list[str], timeout_s: float = 600) -> str:
    """Wait for the oldest attempt not in ``known`` whose two nodes have both started ms-swift; return its id."""

    def started() -> str | None:
        new = [a for a in attempt_ids(run_dir) if a not in known]
        return next((a for a in new if all(exec_line(run_dir, a, node) for node in (0, 1))), None)

    return wait_until(started, timeout_s, f"a new attempt of {run_dir} (known: {known})")


def recorded_attempts(run_dir: Path) -> set[str]:
    return {record["attempt"] for record in read_jsonl(run_dir / ATTEMPTS)}


def wait_for_training(run_dir: Path, attempt: str, timeout_s: float = 300) -> bool:
    """Wait until the attempt logs a training step (True), or ends before that (False: e.g. another test's
    urgent job preempted it)."""

    def trains_or_ended() -> str | None:
        if STEP_LINE.search(node_log(run_dir, attempt, 0)):
            return "trains"
        return "ended" if attempt in recorded_attempts(run_dir) else None

    return wait_until(trains_or_ended, timeout_s, f"attempt {attempt} to train") == "trains"


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


def queue_state(job_id: str) -> str | None:
    """The job's state as slurmctld has it now (PENDING, RUNNING, COMPLETED, ...); None once forgotten."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True, text=True).stdout.split()
    return out[0] if out else None


def wait_for_run_end(run_dir: Path, job_id: str, timeout_s: float = 600) -> str:
    """The job's final state (sacct) once the run has ended. A requeued job passes through states that look
    final (REQUEUED, NODE_FAIL), so the queue and the run's own status.json decide too; a job that stays in a
    final state for a minute without the run saying it ended (e.g. killed and not requeued) ends the wait."""
    final_since: list[float] = []
    gone_since: list[float] = []

    def ended() -> str | None:
        queued, state = queue_state(job_id), job_state(job_id)
        gone_since[:] = (gone_since or [time.monotonic()]) if queued is None and state == "UNKNOWN" else []
        assert not gone_since or time.monotonic() - gone_since[0] < 60, (
            f"job {job_id} is gone from squeue and sacct: was the cluster restarted (slurm-local.sh up) meanwhile?"
        )
        if state not in TERMINAL or (queued is not None and queued not in TERMINAL):
            final_since.clear()
            return None
        if (read_status(run_dir) or {}).get("state") in RUN_ENDED:
            return state
        final_since[:] = final_since or [time.monotonic()]
        return state if time.monotonic() - final_since[0] > 60 else None

    return wait_until(ended, timeout_s, f"job {job_id} ({run_dir}) to end", poll_s=2)


def cancel_if_active(job_id: str) -> None:
    """scancel a job that is still pending, running or requeued (a test that failed must not leave it behind)."""
    queued = queue_state(job_id)
    if queued is not None and queued not in TERMINAL:
        subprocess.run(["scancel", job_id], capture_output=True)


def describe(record: dict[str, object]) -> str:
    """One attempt record in a line, with its start-up and total seconds, for the test's output."""

    def since_start(key: str) -> str:
        start, at = record.get("start"), record.get(key)
        return f"{at - start:.0f}s" if isinstance(start, float) and isinstance(at, float) else "-"

    facts = ("hosts", "reason", "decision", "resume_step", "committed_step", "failed_host", "exclude_hosts")
    shown = ", ".join(f"{k}={record.get(k)}" for k in facts)
    return (
        f"{record.get('attempt')}: {shown}, first step {since_start('first_step_at')}, "
        f"ended {since_start('end')}\n    why: {record.get('why')}"
    )


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


def workers_of(run_dir: Path, attempt: str) -> list[int]:
    """PIDs of the attempt's two training workers, rank 0 first; [] if the attempt ended first."""

    def found() -> list[int] | str | None:
        pids = [pid for _, pid in training_workers(run_dir)]
        return pids if len(pids) == 2 else "ended" if attempt in recorded_attempts(run_dir) else None

    pids = wait_until(found, 60, f"the training workers of {attempt}")
    return pids if isinstance(pids, list) else []


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


def logged_step(run_dir: Path, attempt: str) -> int:
    """The newest training step node 0 has logged in this attempt (ms-swift logs every 5 steps here)."""
    steps = STEP_LINE.findall(node_log(run_dir, attempt, 0))
    return int(steps[-1][0]) if steps else 0


def kill_at_random_moment(run_dir: Path, attempt: str, pids: list[int], resume_step: int, rng: random.Random) -> bool:
    """kill -9 all workers or one of them, at a random moment: after a random number of steps past the resume
    point (so that runs make progress between kills, however loaded the machine), plus a random fraction of
    a second (so that some kills land between logged steps or during saves). False if the attempt ended
    first (e.g. another test's urgent job preempted it)."""
    target = min(resume_step + rng.randint(5, 45), MAX_STEPS - 10)
    delay = rng.uniform(0.0, 0.5)
    victims = pids if rng.random() < 0.5 else [rng.choice(pids)]

    def reached() -> bool:
        return logged_step(run_dir, attempt) >= target or not all(alive(p) for p in pids)

    wait_until(reached, 300, f"attempt {attempt} to reach step {target}", poll_s=0.05)
    time.sleep(delay)
    if not all(alive(p) for p in pids):
        print(f"{attempt}: ended on its own before step {target}")
        return False
    print(f"{attempt}: kill -9 {victims} (of {pids}) {delay:.2f} s after step {logged_step(run_dir, attempt)}")
    kill_9(victims)
    return True


def saving_checkpoint(output: Path, above: int) -> Path | None:
    """A checkpoint newer than step ``above`` and every committed one that has no manifest yet: a save in
    progress (an older folder without manifest is one being pruned, not saved)."""
    dirs = checkpoint_dirs(output)
    committed = max((step for step, path in dirs if (path / MANIFEST).is_file()), default=0)
    return next((path for step, path in dirs if step > max(above, committed) and not (path / MANIFEST).is_file()), None)


def kill_during_next_save(run_dir: Path, attempt: str, pids: list[int], above: int) -> tuple[bool, Path | None]:
    """Poll the output dir every 20 ms; kill -9 ``pids`` the moment a new checkpoint exists without its
    manifest. Return (killed, that checkpoint if it is still uncommitted once they are dead, i.e. the kill
    landed mid-save; None if the commit won the race). (False, None) if the attempt ended on its own first."""
    deadline = time.monotonic() + 300
    while (folder := saving_checkpoint(run_dir / "output", above)) is None:
        assert time.monotonic() < deadline, f"{attempt}: no save started within 300 s"
        if not all(alive(p) for p in pids):
            print(f"{attempt}: ended on its own before its next save")
            return False, None
        time.sleep(SAVE_POLL_S)
    kill_9(pids)
    wait_gone(pids)
    landed = not (folder / MANIFEST).exists()
    print(f"{attempt}: kill -9 {pids} during the save of {folder.name}: {'landed' if landed else 'the commit won'}")
    return True, folder if landed else None


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
    steps = (f"swift.max_steps={MAX_STEPS}", "swift.save_steps=15", f"keep_checkpoints={keep}")
    job = submit(run_dir, *steps, *FAST_RETRIES)
    save_kill_turn = rng.randrange(KILLS)
    seen: list[ResumeSeen] = []
    mid_save: dict[str, Path] = {}  # attempt -> the checkpoint it was killed in the middle of saving
    try:
        kills: list[str] = []  # attempts killed
        # One kill mid-save is required; if the commit wins the race, the next kill tries again (3 extra at most).
        while len(kills) < KILLS or (not mid_save and len(kills) < KILLS + 3):
            assert len(seen) <= KILLS + 8, f"too many attempts ended on their own: {seen}"
            attempt = next_attempt(run_dir, [s.attempt for s in seen])
            seen.append(inspect_resume_point(run_dir, attempt))
            resume_step = (checkpoint_step(seen[-1].checkpoint) or 0) if seen[-1].checkpoint else 0
            pids = workers_of(run_dir, attempt) if wait_for_training(run_dir, attempt) else []
            if not pids:
                continue
            if len(kills) >= save_kill_turn and not mid_save:
                killed, folder = kill_during_next_save(run_dir, attempt, pids, resume_step)
                if folder is not None:
                    mid_save[attempt] = folder
            else:
                killed = kill_at_random_moment(run_dir, attempt, pids, resume_step, rng)
            if killed:
                kills.append(attempt)
        seen.append(inspect_resume_point(run_dir, next_attempt(run_dir, [s.attempt for s in seen])))
        state = wait_for_run_end(run_dir, job)
    finally:
        cancel_if_active(job)
    assert state == "COMPLETED", (state, read_status(run_dir))
    assert mid_save, "no kill landed in the middle of a save"
    assert_kill_history(run_dir, seen, kills, mid_save, keep)


def assert_kill_history(
    run_dir: Path, seen: list[ResumeSeen], kills: list[str], mid_save: dict[str, Path], keep: int
) -> None:
    output = run_dir / "output"
    records = read_jsonl(run_dir / ATTEMPTS)
    for record in records:
        print(describe(record))
    assert (read_status(run_dir) or {}).get("state") == "finished", read_status(run_dir)
    by_attempt = {r["attempt"]: r for r in records}
    assert set(by_attempt) >= {s.attempt for s in seen}, (list(by_attempt), seen)
    for record in records[:-1]:
        if record["attempt"] in kills or not record.get("signals"):  # both nodes alive: restarted in place
            assert record["reason"] == "infra" and record["decision"] in ("restart", "requeue"), record
            assert record["exit_code"] != 0, record
        else:  # stopped by a signal from outside (another test's urgent job preempted it): not ours to judge
            assert record["decision"] == "requeue", record
        assert record["rejected"] == [], record
    last = records[-1]
    assert (last["reason"], last["decision"], last["committed_step"]) == ("finished", "done", MAX_STEPS), last
    for before, after in itertools.pairwise(records):  # each attempt resumes from the newest commit of the last
        assert after["resume_step"] == before["committed_step"], (before, after)
    for resume in seen:
        record = by_attempt[resume.attempt]
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
    final = output / f"checkpoint-{MAX_STEPS}"
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


def slurmd_command(node: str) -> list[str]:
    """scripts/slurm-local.sh's start_slurmd: the node's network namespace, a UTS namespace named after it."""
    namespace = ["nsenter", f"--net=/run/netns/sslurm-{node}", "--", "unshare", "--uts", "--"]
    return [*namespace, "sh", "-c", 'hostname "$1" && exec slurmd -D -N "$1"', "sh", node]


def restore_node(node: str, state_dir: Path) -> None:
    """Start the node's slurmd again as scripts/slurm-local.sh's start_slurmd does, record its PID where the
    script's status/up look for it, and return the node to service."""
    if slurmd_pid(node) is None:
        with open(state_dir / "log" / f"slurmd-{node}.out", "ab") as out:
            daemon = subprocess.Popen(
                slurmd_command(node),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=state_dir,
            )
        # nsenter, unshare and sh all exec: the PID is slurmd's, as `start_daemon` records it.
        (state_dir / "pids" / f"slurmd-{node}.pid").write_text(f"{daemon.pid} slurmd\n")
        wait_until(lambda: slurmd_pid(node) == daemon.pid, 30, f"slurmd of {node} to start")
    # ReturnToService=2 brings it back once slurmd registers; RESUME only if it stays down or drained.
    with contextlib.suppress(AssertionError):
        wait_until(lambda: node_state(node) in NODE_READY, 30, f"{node} back in service", poll_s=1)
    if node_state(node) not in NODE_READY:
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], capture_output=True)
    wait_until(lambda: node_state(node) in NODE_READY, 120, f"{node} back in service (sinfo: {node_state(node)})")


def excluded_nodes(job_id: str) -> str:
    """The job's ExcNodeList, as the wrapper set it when it requeued (scontrol show job), for the record."""
    out = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True).stdout
    found = re.search(r"\bExcNodeList=(\S+)", out)
    return found.group(1) if found else "?"


def wait_for_next_attempt_or_end(run_dir: Path, known: list[str]) -> None:
    """Wait until an attempt not in ``known`` has started ms-swift on both its nodes, or the run ended."""

    def moved_on() -> bool:
        new = [a for a in attempt_ids(run_dir) if a not in known]
        started = any(all(exec_line(run_dir, a, node) for node in (0, 1)) for a in new)
        return started or (read_status(run_dir) or {}).get("state") in RUN_ENDED

    wait_until(moved_on, 600, f"the run in {run_dir} to start another attempt (or end)", poll_s=1)


def still_training_on(run_dir: Path, job: str, hosts: list[str]) -> bool:
    """The job still runs on ``hosts`` and both training workers are alive."""
    return job_hosts(job) == hosts and len(training_workers(run_dir)) == 2


def let_other_jobs_leave(node: str, job: str, run_dir: Path, attempt: str) -> None:
    """Be kind to concurrent tests: while this run is in its first half, give their jobs time to leave."""

    def free_or_late() -> bool:
        half_done = logged_step(run_dir, attempt) >= LOST_NODE_STEPS // 2
        return not other_jobs_on(node, job) or half_done or attempt in recorded_attempts(run_dir)

    wait_until(free_or_late, 600, f"other jobs to leave {node}", poll_s=1)


def test_lost_node_is_excluded_and_the_run_finishes_on_the_others(tmp_path: Path, slurm_cluster: None) -> None:
    run_dir = tmp_path / "run"
    job = submit(run_dir, f"swift.max_steps={LOST_NODE_STEPS}", "swift.save_steps=20", *FAST_RETRIES)
    state_dir = cluster_state_dir()
    lost: str | None = None
    victim: str | None = None  # the attempt that was running on the lost node
    known: list[str] = []
    try:
        while victim is None:  # an attempt may end on its own first (another test's urgent job): take the next
            assert len(known) < 5, f"no attempt trained long enough to lose a node in it: {known}"
            attempt = next_attempt(run_dir, known)
            known.append(attempt)
            if not wait_for_training(run_dir, attempt):
                continue
            hosts = job_hosts(job)
            assert len(hosts) == 2, hosts
            let_other_jobs_leave(hosts[1], job, run_dir, attempt)
            if still_training_on(run_dir, job, hosts):
                print(f"{attempt} on {hosts}: losing {hosts[1]} (other jobs there: {other_jobs_on(hosts[1], job)})")
                lost, victim = hosts[1], attempt
                lose_node(lost)
        # While the node is lost, `slurm-local.sh status` fails (and a concurrent `up` would restart the whole
        # cluster): bring it back as soon as the run has moved on to the next attempt, on the other nodes.
        wait_for_next_attempt_or_end(run_dir, known)
        restore_node(lost, state_dir)
        state = wait_for_run_end(run_dir, job, timeout_s=600)
    finally:
        cancel_if_active(job)
        if lost is not None:
            restore_node(lost, state_dir)
    assert lost is not None and victim is not None
    assert_run_finished_without(run_dir, job, state, victim, lost)


def assert_run_finished_without(run_dir: Path, job: str, state: str, victim: str, lost: str) -> None:
    records = read_jsonl(run_dir / ATTEMPTS)
    instances = job_instances(job)
    for record in records:
        print(describe(record))
    print("sacct:", instances, "| ExcNodeList:", excluded_nodes(job))
    assert state == "COMPLETED", (state, read_status(run_dir), records)
    assert (read_status(run_dir) or {}).get("state") == "finished", read_status(run_dir)
    ids = [r["attempt"] for r in records]
    assert victim in ids, (victim, ids)
    hit, later = records[ids.index(victim)], records[ids.index(victim) + 1 :]
    assert lost in hit.get("hosts", [lost]), hit
    if hit.get("signals"):  # a stop signal from outside came first (another test's urgent job): it decides
        assert hit["decision"] == "requeue", hit
    else:
        assert (hit["reason"], hit["decision"]) == ("infra", "requeue"), hit
        if "ended without a record" not in hit["why"]:  # the leader's wrapper wrote it: it named the lost node
            assert hit["failed_host"] == lost and lost in hit["exclude_hosts"], hit
    assert later and (later[-1]["reason"], later[-1]["decision"]) == ("finished", "done"), later
    for record in later:
        assert lost not in record.get("hosts", []), f"{record['attempt']} ran on the lost {lost}: {record}"
    assert instances and instances[-1][0] == "COMPLETED" and lost not in instances[-1][1], instances
    final = run_dir / "output" / f"checkpoint-{LOST_NODE_STEPS}"
    assert read_manifest(final) is not None and problems(final, deep=True) == []
