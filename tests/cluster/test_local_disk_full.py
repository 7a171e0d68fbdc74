"""A full disk, for real: the embedded default run (ms-swift, the tiny model, this CPU, no SLURM) with its run dir
on a 3 MiB tmpfs in a private mount namespace, saving every 2 steps until a save does not fit. Every attempt is
recorded `disk_full` with the last commit kept and the unfinished checkpoint set aside; the first (it committed)
is retried, whose start deletes what it set aside, and the retry without progress stops the run `failed`
(it used to end "job failed without a final record from the wrapper", "state running: (0 attempt(s))")."""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from swiftslurm.testing.cli import command
from tests.component.test_disk_full import private_tmpfs_or_skip

pytestmark = pytest.mark.slow


def test_a_local_run_whose_saves_fill_a_3_mib_disk_ends_failed_with_every_attempt_recorded(tmp_path: Path) -> None:
    mount, kept = tmp_path / "fs", tmp_path / "kept"
    mount.mkdir()
    kept.mkdir()
    prefix = private_tmpfs_or_skip(mount)
    run_dir = mount / "run"
    retries = ("resilience.backoff_base_s=1", "resilience.max_consecutive_failures=0")
    run = shlex.join(command(f"run_dir={run_dir}", "swift.save_steps=2", "swift.max_steps=30", *retries))
    q = shlex.quote
    script = (  # the tmpfs lives as long as this shell: what the test reads is copied out first
        f"mount -t tmpfs -o size=3m tmpfs {q(str(mount))} || exit 99; {run}; rc=$?; "
        f"cp {q(str(run_dir / 'status.json'))} {q(str(run_dir / 'attempts.jsonl'))} {q(str(kept))}/; "
        f"ls {q(str(run_dir / 'output'))} > {q(str(kept / 'output.txt'))}; exit $rc"
    )
    done = subprocess.run([*prefix, "sh", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600)

    said = done.stdout + done.stderr  # a failed run's summary goes to stderr
    assert done.returncode not in (0, 99), said[-3000:]  # a stopped run fails
    assert "state            failed: disk full: saving " in said, said[-3000:]
    status = json.loads((kept / "status.json").read_text())
    assert (status["state"], status["reason"]) == ("failed", "disk_full"), status
    records = [json.loads(line) for line in (kept / "attempts.jsonl").read_text().splitlines()]
    assert f"({len(records)} attempt(s))" in said and len(records) >= 2, said[-3000:]
    decisions = [(r["reason"], r["decision"]) for r in records]
    assert decisions == [("disk_full", "requeue")] * (len(records) - 1) + [("disk_full", "stop")], records
    for before, after in itertools.pairwise(records):
        assert before["quarantined"] and set(before["quarantined"]) <= set(after["removed"]), (before, after)
    for record in records:
        committed = f"checkpoint-{record['committed_step']}"
        assert f"(the size of {committed}); set aside as quarantine/checkpoint-" in record["why"], record
        assert f"{committed} is kept" in record["why"], record
        [set_aside] = record["quarantined"]
        assert Path(set_aside).name.startswith(f"checkpoint-{record['committed_step'] + 2}."), record
    assert f"checkpoint-{records[-1]['committed_step']}" in (kept / "output.txt").read_text().split()
