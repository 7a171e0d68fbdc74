"""What the user is told is true (issue 26), on the real local SLURM cluster with real ms-swift: `wait=true`
says what the run waits for and ends a failed run in one line with its reason and its logs (no submitit
traceback, never "running" for a job that has ended); a run that failed on a user error before committing
anything is planned again in place when the same command is rerun with the fix."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import attempts
from swiftslurm.testing.s3 import SeaweedServer, use_test_credentials
from tests.conftest import REPO

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


@pytest.mark.whole_cluster  # on a bug it would replace the cluster every job shares: run alone
def test_up_with_other_settings_refuses_to_replace_a_healthy_cluster(slurm_cluster: None) -> None:
    """A bare `up` (then 2 nodes) on the test suite's running cluster restarted it, wiping job ids and
    accounting. It refuses, naming the running cluster's node count and `--force`; the cluster runs on."""
    script = str(REPO / "scripts" / "slurm-local.sh")
    settings = dict(line.split("=", 1) for line in subprocess.check_output(["bash", script, "env"], text=True).split())
    pid_file = Path(settings["SWIFTSLURM_SLURM_STATE"]) / "pids" / "slurmctld.pid"
    controller = pid_file.read_text().split()[0]
    other = str(int(settings["SWIFTSLURM_SLURM_NODES"]) - 2)
    env = {**os.environ, "SWIFTSLURM_SLURM_NODES": other, "SWIFTSLURM_SLURM_GROUPS": "1"}
    done = subprocess.run(["bash", script, "up"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    nodes = settings["SWIFTSLURM_SLURM_NODES"]
    assert f"a healthy cluster of {nodes} nodes runs with other settings than these ({other} nodes" in done.stderr
    assert "up --force" in done.stderr
    assert pid_file.read_text().split()[0] == controller and Path(f"/proc/{controller}").exists()
    assert subprocess.run(["bash", script, "status"], capture_output=True).returncode == 0


def test_a_wrapper_that_fails_before_training_ends_the_wait_in_one_line_with_its_error(
    tmp_path: Path, slurm_cluster: None
) -> None:
    """The leader's wrapper raising before any trainer starts (here a phase observer, as a bug or a filesystem
    error would): wait=true printed a submitit traceback cut off mid-line and "state running: (0 attempt(s))".
    Node 0 alone raises: were node 1 to raise first, srun (--kill-on-bad-exit) would end node 0 before it
    records anything (a case of its own, not this one's)."""
    observer = tmp_path / "fail_at_start.py"
    observer.write_text(
        "def on_phase(event):\n"
        "    if event.where.node_id == 0:\n"
        "        raise RuntimeError('the wrapper broke at ' + event.phase)\n"
    )
    run_dir = tmp_path / "run"
    observers = {"SWIFTSLURM_PHASE_OBSERVERS": str(observer)}  # the job inherits the submitting environment
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *SHORT, cwd=tmp_path, env=observers)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    output = done.stdout + done.stderr
    assert "Traceback" not in output and "state            running" not in output, output[-3000:]
    [error] = [line for line in done.stderr.splitlines() if line.startswith("swiftslurm: error: ")]
    assert "failed in phase prepare of attempt" in error and "the wrapper broke at prepare" in error, error
    [record] = attempts(run_dir)
    assert (record["reason"], record["decision"]) == ("infra", "stop"), record


def test_another_nodes_wrapper_failing_first_ends_the_wait_with_that_nodes_error(
    tmp_path: Path, slurm_cluster: None
) -> None:
    """Node 1's wrapper raises before any trainer starts: srun ends the step, node 0 with it, before node 0 records
    anything. wait=true said only "job failed without a final record from the wrapper"; node 1's own record names
    its phase and error."""
    observer = tmp_path / "fail_on_node_1.py"
    observer.write_text(
        "def on_phase(event):\n"
        "    if event.where.node_id == 1:\n"
        "        raise RuntimeError('node 1 broke at ' + event.phase)\n"
    )
    run_dir = tmp_path / "run"
    observers = {"SWIFTSLURM_PHASE_OBSERVERS": str(observer)}
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *SHORT, cwd=tmp_path, env=observers)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    [error] = [line for line in done.stderr.splitlines() if line.startswith("swiftslurm: error: ")]
    assert "node 1's wrapper" in error and "failed in phase prepare of attempt" in error, error
    assert "node 1 broke at prepare" in error, error
    shown = swiftslurm("status", str(run_dir), cwd=tmp_path)
    assert shown.returncode == 0 and "node 1's wrapper" in shown.stdout, shown.stdout + shown.stderr
