"""Secrets never reach the run dir: refused at plan time, redacted in node logs; the run dir is private and its
plan.json is checked on the node against the digest recorded when it was prepared."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from swiftslurm.node.launch import Trainer
from tests.unit.test_secrets import SECRET


def test_the_node_log_shows_the_trainer_command_without_its_token(tmp_path: Path) -> None:
    log = tmp_path / "node0.log"
    trainer = Trainer(["true", "--hub_token", SECRET, "--model", "m"], dict(os.environ), log, tmp_path)
    assert trainer.wait(30) == 0
    text = log.read_text()
    assert "[swiftslurm] exec: true --hub_token *** --model m" in text and SECRET not in text


def test_a_refused_secret_writes_no_run_dir_and_no_config_yaml(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "swiftslurm", f"run_dir={tmp_path / 'r'}", f"+cluster.env.WANDB_API_KEY={SECRET}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "cluster.env.WANDB_API_KEY" in done.stderr
    assert SECRET not in done.stdout + done.stderr
    assert not (tmp_path / "r").exists()
