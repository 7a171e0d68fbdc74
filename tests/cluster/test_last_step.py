"""A run stopped right after committing its last step ends there (issue 18): it is concluded `finished`, never
trains past its plan, and ends with the adapter of a run that was never stopped. On the real SLURM cluster
with real ms-swift; tests/cluster/last_step_plugin.py forces the moment (no timing involved).

Before the fix, both runs here were requeued and resumed from checkpoint-<last step>, started ms-swift again
and committed a checkpoint past the plan.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from swiftslurm.ckpt.checkpoint import checkpoint_step, newest_checkpoint, problems, read_manifest
from swiftslurm.rundir.layout import QUARANTINE
from swiftslurm.testing.cli import swiftslurm
from swiftslurm.testing.cluster import (
    TERMINAL,
    attempts,
    job_state,
    queue_state,
    status,
    submit,
    wait_for_run_end,
    wait_until,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

LAST_STEP = 20
SHORT = (f"swift.max_steps={LAST_STEP}", "swift.save_steps=10")
PLUGIN = Path(__file__).with_name("last_step_plugin.py")
EXEC_LINE = "[swiftslurm] exec: "
MARKER = "last_step_plugin.json"  # the plugin writes it into the run dir when it acts (importing it imports ms-swift)
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)")


def with_plugin(callback: str) -> tuple[str, ...]:
    return (f"swift.external_plugins=[{PLUGIN}]", f"swift.callbacks=[{callback}]")


@pytest.fixture(scope="module")
def uninterrupted_short(tmp_path_factory: pytest.TempPathFactory, slurm_cluster: None) -> bytes:
    """The final adapter of a SHORT run that is never stopped (same seed, same settings, no plugin)."""
    run_dir = tmp_path_factory.mktemp("uninterrupted-short") / "run"
    done = swiftslurm("+cluster=local-slurm", "wait=true", f"run_dir={run_dir}", *SHORT, cwd=run_dir.parent)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return final_adapter(run_dir)


def final_adapter(run_dir: Path) -> bytes:
    newest = newest_checkpoint(run_dir / "output")
    assert newest is not None, f"no committed checkpoint in {run_dir}"
    return (newest / "adapter_model.safetensors").read_bytes()


def plugin_acted(run_dir: Path) -> dict:
    wait_until(lambda: (run_dir / MARKER).is_file(), 300, "the plugin to act after the last commit")
    return json.loads((run_dir / MARKER).read_text())


def recorded(run_dir: Path) -> list[str]:
    return [record["attempt"] for record in attempts(run_dir)]


def since(run_dir: Path, attempt: str) -> list[dict]:
    """The records of ``attempt`` and those after it. Earlier ones can only be preemptions by another test's
    urgent job (the plugin acts in the first attempt that reaches the last step): each was requeued."""
    records = attempts(run_dir)
    first = recorded(run_dir).index(attempt)
    assert all(r["decision"] == "requeue" for r in records[:first]), records[:first]
    return records[first:]


def trainer_started(run_dir: Path, attempt: str) -> bool:
    """Whether any node of the attempt started ms-swift (the wrapper logs its command line first)."""
    return any(EXEC_LINE in log.read_text(errors="replace") for log in (run_dir / "logs" / attempt).glob("node*.log"))


def assert_ended_at_the_last_step(run_dir: Path, uninterrupted: bytes) -> None:
    output = run_dir / "output"
    assert status(run_dir)["state"] == "finished", status(run_dir)
    assert status(run_dir)["committed_step"] == LAST_STEP, status(run_dir)
    seen = [p for folder in (output, output / QUARANTINE) if folder.is_dir() for p in folder.iterdir()]
    steps = {p.name: int(m.group(1)) for p in seen if (m := CHECKPOINT_NAME.match(p.name))}
    assert max(steps.values()) == LAST_STEP, f"trained past step {LAST_STEP}: {sorted(steps)}"
    final = newest_checkpoint(output)
    assert final is not None and checkpoint_step(final) == LAST_STEP, final
    assert read_manifest(final)["last_step"] == LAST_STEP  # type: ignore[index]
    assert problems(final, deep=True) == []
    assert final_adapter(run_dir) == uninterrupted


def test_killed_right_after_its_last_commit_is_not_trained_again(tmp_path: Path, uninterrupted_short: bytes) -> None:
    run_dir = tmp_path / "run"
    job = submit(run_dir, *SHORT, *with_plugin("last_step_kill"))
    try:
        acted = plugin_acted(run_dir)
        wait_until(lambda: job_state(job) in TERMINAL and queue_state(job) is None, 120, f"job {job} to die")
        # The whole step died, wrapper first: nobody recorded anything about this attempt.
        assert acted["attempt"] not in recorded(run_dir) and status(run_dir)["state"] == "running", status(run_dir)
        # What SLURM does after a node failure (JobRequeue=1): the same job runs again.
        subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True)
        state = wait_for_run_end(run_dir, job, timeout_s=300)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert (acted["action"], acted["step"], state) == ("kill", LAST_STEP, "COMPLETED"), (acted, state)
    lost, last = since(run_dir, acted["attempt"])
    assert (lost["reason"], lost["decision"]) == ("infra", "requeue"), lost
    assert "ended without a record" in lost["why"], lost
    assert (last["reason"], last["decision"], last["exit_code"]) == ("finished", "done", 0), last
    assert last["resumed_from"] == str(run_dir / "output" / f"checkpoint-{LAST_STEP}"), last
    assert last["resume_step"] == last["committed_step"] == LAST_STEP, last
    assert last["first_step_at"] is None and last["last_step"] is None, last  # no training step was seen
    assert trainer_started(run_dir, lost["attempt"]) and not trainer_started(run_dir, last["attempt"])
    assert_ended_at_the_last_step(run_dir, uninterrupted_short)


def test_preempted_right_after_its_last_commit_finishes_without_requeue(
    tmp_path: Path, uninterrupted_short: bytes
) -> None:
    run_dir = tmp_path / "run"
    # A short lead: the wrapper kills the trainer that does not exit this long after the signal.
    job = submit(run_dir, *SHORT, *with_plugin("last_step_usr2"), "cluster.signal_lead_s=10")
    try:
        acted = plugin_acted(run_dir)
        state = wait_for_run_end(run_dir, job, timeout_s=300)
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    assert (acted["action"], acted["step"], state) == ("usr2", LAST_STEP, "COMPLETED"), (acted, state)
    [only] = since(run_dir, acted["attempt"])  # no requeue: no attempt after the signal, no trainer again
    assert (only["reason"], only["decision"]) == ("finished", "done"), only
    assert [name for name, _ in only["signals"]][:1] == ["SIGUSR2"], only
    assert only["exit_code"] != 0, only  # killed after the lead time: the case that used to be requeued
    assert only["committed_step"] == LAST_STEP, only
    assert sorted(p.name for p in (run_dir / "logs").iterdir() if p.is_dir())[-1] == only["attempt"]
    assert_ended_at_the_last_step(run_dir, uninterrupted_short)
