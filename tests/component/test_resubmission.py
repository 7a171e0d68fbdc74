"""Re-running a command on a run that finished: nothing is submitted, so nothing in its run dir is written."""

from __future__ import annotations

import json
from pathlib import Path

from swiftslurm.rundir import layout as rundir
from swiftslurm.rundir.records import record_submission
from swiftslurm.testing.cli import swiftslurm


def finish(run_dir: Path) -> None:
    """What a run dir holds once its job finished: the submission and the leader's final status."""
    record_submission(run_dir, "4242", "local")
    (run_dir / rundir.STATUS).write_text(json.dumps({"state": "finished", "why": "trained to max_steps"}))


def files_of(run_dir: Path) -> dict[str, tuple[int, bytes]]:
    """Every file's inode and bytes: a rewrite (temp file + rename) changes the inode even with equal bytes."""
    return {str(p.relative_to(run_dir)): (p.stat().st_ino, p.read_bytes()) for p in run_dir.rglob("*") if p.is_file()}


def planned_and_finished(tmp_path: Path, *args: str) -> Path:
    planned = swiftslurm(*args, "dry_run=true", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    [run_dir] = [line.split(": ", 1)[1] for line in planned.stdout.splitlines() if "Run directory written" in line]
    finish(Path(run_dir))
    return Path(run_dir)


def test_a_finished_run_given_by_run_dir_is_not_rewritten_and_the_hint_names_run_dir(tmp_path: Path) -> None:
    run_dir = planned_and_finished(tmp_path, f"run_dir={tmp_path / 'r'}")
    before = files_of(run_dir)
    done = swiftslurm(f"run_dir={run_dir}", "run_name=other", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert files_of(run_dir) == before  # plan.json still names the finished run, not `other`
    assert "already finished (job 4242); not submitted again. HINT: a new run_dir=PATH trains anew." in done.stdout


def test_a_finished_run_named_by_run_name_hints_a_new_run_name(tmp_path: Path) -> None:
    run_dir = planned_and_finished(tmp_path, "run_name=first")
    before = files_of(run_dir)
    done = swiftslurm("run_name=first", cwd=tmp_path)
    assert "HINT: a new run_name=NAME (or run_dir=PATH) trains anew." in done.stdout, done.stdout + done.stderr
    assert files_of(run_dir) == before


def test_a_dry_run_on_a_finished_run_writes_nothing_and_says_so(tmp_path: Path) -> None:
    run_dir = planned_and_finished(tmp_path, f"run_dir={tmp_path / 'r'}")
    before = files_of(run_dir)
    done = swiftslurm(f"run_dir={run_dir}", "run_name=other", "dry_run=true", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"nothing written: {run_dir} is already finished" in done.stdout
    assert files_of(run_dir) == before


def test_a_sweep_over_finished_points_rewrites_none_of_them(tmp_path: Path) -> None:
    sweep = ("-m", "swift.learning_rate=1e-3,2e-3")
    planned = swiftslurm(*sweep, "dry_run=true", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    run_dirs = sorted(p for p in (tmp_path / "runs").iterdir() if p.name != "sweeps")
    assert len(run_dirs) == 2
    for run_dir in run_dirs:
        finish(run_dir)
    before = {run_dir: files_of(run_dir) for run_dir in run_dirs}
    done = swiftslurm(*sweep, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("already finished") == 2
    assert {run_dir: files_of(run_dir) for run_dir in run_dirs} == before
