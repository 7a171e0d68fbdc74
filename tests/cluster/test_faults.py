"""Faults on the real local SLURM cluster (scripts/slurm-local.sh): training processes killed with -9 at
random moments (at least once in the middle of a save), and a whole node lost. Whatever happens, the run
resumes only from committed, intact checkpoints and finishes.

Reproduce a failure with the seed it printed: SWIFTSLURM_FAULT_SEED=N (and SWIFTSLURM_FAULT_KILLS=K).
"""

from __future__ import annotations

import itertools
import os
import random
import time
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import MANIFEST, checkpoint_dirs, checkpoint_step, problems, read_manifest
from swiftslurm.rundir.records import read_status
from swiftslurm.testing.checkpoints import ResumeSeen, inspect_resume_point, quarantined_folders, saving_checkpoint
from swiftslurm.testing.cluster import (
    FAST_RETRIES,
    alive,
    attempts,
    cancel_if_active,
    describe,
    job_hosts,
    job_instances,
    kill_9,
    logged_step,
    next_attempt,
    recorded_attempts,
    run_over,
    run_state,
    submit,
    training_workers,
    wait_for_run_end,
    wait_for_training,
    wait_gone,
    wait_until,
    workers_of,
)
from swiftslurm.testing.nodes import cluster_state_dir, excluded_nodes, lose_node, other_jobs_on, restore_node

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SEED = int(os.environ.get("SWIFTSLURM_FAULT_SEED", "20251129"))
KILLS = int(os.environ.get("SWIFTSLURM_FAULT_KILLS", "4"))
SAVE_POLL_S = 0.02
MAX_STEPS = 300  # of the run in the kill test
LOST_NODE_STEPS = 400  # of the run that loses a node


# ---------------------------------------------------------------- kills


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
    kills: list[str] = []  # attempts killed
    try:
        # One kill mid-save is required; if the commit wins the race, the next kill tries again (3 extra at most).
        # A run that reaches its last step before the kills are used up has nothing left to kill.
        over = run_over(run_dir, job)
        while len(kills) < KILLS or (not mid_save and len(kills) < KILLS + 3):
            assert len(seen) <= KILLS + 8, f"too many attempts ended on their own: {seen}"
            attempt = next_attempt(run_dir, [s.attempt for s in seen], over=over)
            if attempt is None:
                print(f"the run ended after {len(kills)} of {KILLS} kills")
                break
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
        if (last := next_attempt(run_dir, [s.attempt for s in seen], over=over)) is not None:
            seen.append(inspect_resume_point(run_dir, last))
        state = wait_for_run_end(run_dir, job)
    finally:
        cancel_if_active(job)
    assert state == "COMPLETED", (state, read_status(run_dir))
    assert mid_save, f"no kill landed in the middle of a save ({len(kills)} kills: {kills})"
    assert_kill_history(run_dir, seen, kills, mid_save, keep)


def assert_kill_history(
    run_dir: Path, seen: list[ResumeSeen], kills: list[str], mid_save: dict[str, Path], keep: int
) -> None:
    output = run_dir / "output"
    records = attempts(run_dir)
    for record in records:
        print(describe(record))
    assert run_state(run_dir) == "finished", read_status(run_dir)
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
            attempt = next_attempt(run_dir, known, over=run_over(run_dir, job))
            assert attempt is not None, f"the run ended before a node could be lost: {read_status(run_dir)}"
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
        next_attempt(run_dir, known, timeout_s=600, over=run_over(run_dir, job))
        restore_node(lost, state_dir)
        state = wait_for_run_end(run_dir, job, timeout_s=600)
    finally:
        cancel_if_active(job)
        if lost is not None:
            restore_node(lost, state_dir)
    assert lost is not None and victim is not None
    assert_run_finished_without(run_dir, job, state, victim, lost)


def assert_run_finished_without(run_dir: Path, job: str, state: str, victim: str, lost: str) -> None:
    records = attempts(run_dir)
    instances = job_instances(job)
    for record in records:
        print(describe(record))
    print("sacct:", instances, "| ExcNodeList:", excluded_nodes(job))
    assert state == "COMPLETED", (state, read_status(run_dir), records)
    assert run_state(run_dir) == "finished", read_status(run_dir)
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
