"""Preflight: the judging of facts (pure), the report, the plan's preflight facts, the checks-only sbatch script,
and one real run of the checks on this machine (one node: port, run dir, paths, disk, gloo all-reduce)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from swiftslurm import tiny
from swiftslurm.launch import prepare_run_dir
from swiftslurm.planning.make import PlanContext, make_plan
from swiftslurm.preflight import checks as pc
from swiftslurm.preflight import gather as preflight
from swiftslurm.slurm_env import SlurmEnv
from tests.conftest import compose_config


def free_port(start: int) -> int:
    for port in range(start, 32768):
        with socket.socket() as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    raise AssertionError("no free port below 32768")


def test_checks_pass_on_this_machine(tmp_path: Path) -> None:
    """A real run on one node: binds the port, writes the token, finds the paths, all-reduces over gloo."""
    model, data = tmp_path / "model", tmp_path / "train.jsonl"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(tiny.MODEL_CONFIG | {"vocab_size": tiny.VOCAB_SIZE}))
    data.write_text("{}\n")
    cfg = compose_config(f"run_dir={tmp_path / 'run'}", f"model.id={model}", f"dataset=[{data}]")
    plan = make_plan(cfg, PlanContext(cwd=tmp_path))
    run_dir = prepare_run_dir(plan, "")
    where = SlurmEnv.local({})
    # Outside SLURM the port is the base itself: a free one below the kernel's ephemeral range, so that no
    # outgoing connection of another test takes it between the checks.
    ctx = preflight.context(run_dir, where, "t1", free_port(28000 + os.getpid() % 4000), None)
    report = preflight.run(ctx)
    assert isinstance(report, pc.Report)
    assert report.ok, pc.render_table(report)
    assert str(model) in pc.render_table(report)
    assert json.loads((run_dir / "preflight" / "t1" / "report.json").read_text())["ok"] is True
