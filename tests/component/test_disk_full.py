"""A save that fills a real filesystem: a tmpfs of a few MiB in a private mount namespace (`unshare -m`), so
nothing outside the test's child process sees it and it is gone when that process ends (full_disk_run.py).
Each attempt is recorded as disk_full, naming the checkpoint and the space, with the older commit kept and the
unfinished one set aside, though the trainer left no free byte: the wrapper's reserve is freed for the records;
the first (it committed) is retried, whose start deletes what it set aside, and the second stops the run.
Where such a mount cannot be made (not root, no CAP_SYS_ADMIN, no unshare) the test is skipped, saying why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swiftslurm.rundir.reserve import RESERVE_BYTES

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("full_disk_run.py")
SIZE_MIB = RESERVE_BYTES // (1 << 20) + 4  # the reserve, one committed checkpoint, and room for the next to fill


def private_tmpfs_or_skip(where: Path) -> list[str]:
    """The command prefix that runs a process in a mount namespace of its own, once shown to mount a tmpfs."""
    prefix = ["unshare", "--mount", "--propagation", "private"]
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1): a size-limited tmpfs needs a private mount namespace")
    probe = [*prefix, "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)]
    tried = subprocess.run(probe, capture_output=True, text=True, check=False)
    if tried.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace (root or CAP_SYS_ADMIN): {tried.stderr}")
    return prefix


def test_saves_that_fill_a_real_disk_are_recorded_as_disk_full_with_the_older_commit_kept(tmp_path: Path) -> None:
    mount, result = tmp_path / "fs", tmp_path / "result.json"
    mount.mkdir()
    prefix = private_tmpfs_or_skip(mount)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [*prefix, sys.executable, str(SCRIPT), str(mount), f"{SIZE_MIB}m", str(result)]
    ran = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert result.is_file(), ran.stderr
    assert not any(mount.iterdir()), "the tmpfs is visible outside its mount namespace"
    seen = json.loads(result.read_text())

    assert seen["error"] is None, seen  # the wrapper wrote its records and returned
    assert ran.returncode == 0, ran.stderr  # its output (on the full disk too) was written whole
    first, second = seen["attempts"]  # the first committed checkpoint-2: progress, retried; the second stops
    assert [(r["reason"], r["decision"]) for r in (first, second)] == [("disk_full", "requeue"), ("disk_full", "stop")]
    for record in (first, second):
        assert f"saving {mount}/run/output/checkpoint-4 did not fit" in record["why"], record
        assert "a checkpoint needs about 1.0 MB (the size of checkpoint-2)" in record["why"], record
        aside = f"checkpoint-4.{record['attempt']}"
        assert f"set aside as quarantine/{aside}, checkpoint-2 is kept" in record["why"], record
        assert [Path(q).name for q in record["quarantined"]] == [aside], record
    assert first["quarantined"][0] in second["removed"], second  # the second start deleted the first's
    assert (seen["status"]["state"], seen["status"]["reason"]) == ("failed", "disk_full"), seen["status"]
    assert "checkpoint-2" in seen["output"] and "checkpoint-4" not in seen["output"], seen["output"]
    assert seen["quarantine"] == [f"checkpoint-4.{second['attempt']}"]
    assert not seen["reserve_left"]
