"""One attempt of the wrapper on a filesystem a save fills, started by test_disk_full.py inside `unshare -m`:

    full_disk_run.py MOUNT SIZE RESULT

mounts a tmpfs of SIZE at MOUNT (private to this process's mount namespace, gone when it exits) and runs the
wrapper there (attempt.run, its output going to a file on that disk as SLURM's does) with a trainer process
that commits checkpoint-2 if there is none, then writes the next checkpoint until the disk is full (ENOSPC: it
crashes, its traceback unwritable). The first attempt made progress and is retried, the second did not and
stops the run (max_consecutive_failures=0). Writes what the run dir says afterwards to RESULT (outside the
mount)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from swiftslurm.node import attempt, watch
from swiftslurm.rundir.jsonio import read_json, read_jsonl
from swiftslurm.rundir.layout import ATTEMPTS, STATUS, output_dir, reserve_file
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import plan_for

CHECKPOINT_MIB = 1
FILLS_THE_DISK = f"""
import os
from pathlib import Path
from swiftslurm.ckpt.checkpoint import commit

output = Path(os.environ["SWIFTSLURM_RUN_DIR"]) / "output"
def save(step, chunks):
    folder = output / f"checkpoint-{{step}}"
    folder.mkdir(parents=True)
    with open(folder / "model.safetensors", "wb") as weights:
        for _ in range(chunks):
            weights.write(os.urandom(1 << 16))
            weights.flush()
    return folder
committed = [int(p.parent.name.split("-")[1]) for p in output.glob("checkpoint-*/swiftslurm_manifest.json")]
if not committed:
    commit(save(2, {CHECKPOINT_MIB * 16}), 1, "fake", identity=os.environ["SWIFTSLURM_PLAN_IDENTITY"])
    print("[fake trainer] checkpoint-2 committed", flush=True)
save(max(committed, default=2) + 2, 1 << 30)  # until ENOSPC
"""


def main(mount: Path, size: str, result: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    run_dir = mount / "run"
    run_dir.mkdir()
    overrides = ("swift.max_steps=40", "swift.save_steps=2", "resilience.backoff_base_s=0")
    plan = plan_for(f"run_dir={run_dir}", *overrides, "resilience.max_consecutive_failures=0")
    plan = replace(plan, tiny_cache=None)
    watch.swift_command = lambda plan, extra: [sys.executable, "-c", FILLS_THE_DISK]  # type: ignore[assignment]
    sys.stdout = open(run_dir / "wrapper.out", "w", buffering=1)  # noqa: SIM115  (SLURM's output, on that disk)
    error = None
    try:
        attempt.run(run_dir, plan, SlurmEnv.from_environ({}))
    except BaseException as err:  # what the test reports: the wrapper died without its record
        error = f"{type(err).__name__}: {err}"
    out = output_dir(run_dir)
    seen = {
        "error": error,
        "status": read_json(run_dir / STATUS),
        "attempts": read_jsonl(run_dir / ATTEMPTS),
        "output": sorted(p.name for p in out.iterdir()),
        "quarantine": sorted(p.name for p in (out / "quarantine").iterdir()) if (out / "quarantine").is_dir() else [],
        "reserve_left": reserve_file(run_dir, 0).exists(),
        "free_after": shutil.disk_usage(mount).free,
        "checkpoint_mib": CHECKPOINT_MIB,
    }
    result.write_text(json.dumps(seen))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]))
