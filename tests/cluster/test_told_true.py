"""What the user is told is true (issue 26), on the real local SLURM cluster with real ms-swift: `wait=true`
says what the run waits for and ends a failed run in one line with its reason and its logs (no submitit
traceback, never "running" for a job that has ended); a run that failed on a user error before committing
anything is planned again in place when the same command is rerun with the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts
from swiftslurm.testing.s3 import SeaweedServer, use_test_credentials

pytestmark = [pytest.mark.slurm]

NARRATED = re.compile(r"^\d\d:\d\d:\d\d  (.*)$")  # a line of ops/waiting.py's narrator
SHORT = ("swift.max_steps=10", "swift.save_steps=10")


def test_a_user_error_ends_the_wait_in_one_line_and_the_fixed_rerun_replans_the_run_dir_in_place(
    tmp_path: Path, slurm_cluster: None
) -> None:
    run_dir = tmp_path / "run"
    args = ("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *SHORT)
    failed = swiftslurm(*args, "swift.target_modules=[no_such_module]", cwd=tmp_path, timeout=600)
    assert failed.returncode == 1, failed.stdout[-3000:] + failed.stderr[-3000:]
    output = failed.stdout + failed.stderr
    assert "Traceback" not in output and "TrainingFailed" not in output, output[-3000:]
    [error] = [line for line in failed.stderr.splitlines() if line.startswith("swiftslurm: error: ")]
    assert "failed: user error" in error and f"python -m swiftslurm logs {run_dir}" in error, error
    assert "_0_log.out" in error  # the wrapper's own output, named
    assert "state            failed: user error" in failed.stderr and "state            running" not in output
    said = [m.group(1) for line in failed.stdout.splitlines() if (m := NARRATED.match(line))]
    assert said, failed.stdout  # the wait was not silent
    [record] = attempts(run_dir)
    assert (record["reason"], record["decision"]) == ("user_error", "stop"), record

    fixed = swiftslurm(*args, "swift.target_modules=[all-linear]", cwd=tmp_path, timeout=600)
    assert fixed.returncode == 0, fixed.stdout[-3000:] + fixed.stderr[-3000:]
    assert "(--target_modules no_such_module → all-linear) that committed no checkpoint" in fixed.stderr
    assert "planned again in place" in fixed.stderr
    narrated = [m.group(1) for line in fixed.stdout.splitlines() if (m := NARRATED.match(line))]
    first_step = next(i for i, line in enumerate(fixed.stdout.splitlines()) if line.startswith("  step "))
    assert any(NARRATED.match(line) for line in fixed.stdout.splitlines()[:first_step]), fixed.stdout
    assert narrated, fixed.stdout
    assert "state            finished" in fixed.stdout
    [record] = attempts(run_dir)  # the replaced run's attempt is kept aside, not in this run's history
    assert (record["reason"], record["decision"]) == ("finished", "done"), record
    [kept] = (run_dir / "replaced").iterdir()
    assert "no_such_module" in (kept / "plan.json").read_text()


def test_a_store_the_login_node_reaches_and_the_nodes_do_not_stops_the_run_with_that_reason(
    tmp_path: Path, slurm_cluster: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint is 127.0.0.1: the submit-time check passes (the store listens on this machine's loopback),
    the nodes (network namespaces) reach nothing there. The run must stop at its first attempt saying so, not
    fail "without a final record" (and be recorded later as a lost attempt, "requeued in 30s")."""
    use_test_credentials(monkeypatch)
    with SeaweedServer(host="127.0.0.1") as server:
        server.create_bucket("unreached")
        run_dir = tmp_path / "run"
        storage = ("storage=s3", "storage.bucket=unreached", f"storage.endpoint_url={server.endpoint_url}")
        storage += ("storage.addressing_style=path", "storage.region=us-east-1")
        done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *SHORT, *storage, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    assert "127.0.0.1 is each node's own loopback" in done.stderr  # said when planned, before submitting
    [error] = [line for line in done.stderr.splitlines() if line.startswith("swiftslurm: error: ")]
    assert "cannot reach the object store" in error and "node" in error, error
    [record] = attempts(run_dir)
    assert (record["reason"], record["decision"]) == ("user_error", "stop"), record
    shown = swiftslurm("status", str(run_dir), cwd=tmp_path)
    assert "cannot reach the object store" in shown.stdout and "without a final record" not in shown.stdout
