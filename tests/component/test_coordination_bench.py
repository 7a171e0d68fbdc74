"""bench/coordination_scale.py --real-trainers: the `swift` shim run as a wrapper runs it, a real trainer below
K nodes and a named stand-in above (unit: tests/unit/test_coordination_bench.py)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from bench import coordination_scale as bench


def _fake_venv(tmp_path: Path) -> Path:
    """A `python` beside a `swift` that prints what the trainer shim passed it."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "swift").write_text('#!/bin/bash\necho "real swift NNODES=$NNODES NODE_RANK=$NODE_RANK args=$*"\n')
    (venv / "swift").chmod(0o755)
    (venv / "python").write_text('#!/bin/bash\necho python "$@"\n')
    (venv / "python").chmod(0o755)
    return venv / "python"


def test_the_nodes_below_real_trainers_run_the_real_swift_in_a_world_of_that_many(tmp_path: Path) -> None:
    python = bench.make_trainer_shims(tmp_path, 2, _fake_venv(tmp_path))
    swift = python.parent / "swift"
    env = {**os.environ, "NNODES": "16", "NODE_RANK": "1"}
    done = subprocess.run([str(swift), "sft", "--max_steps", "5"], env=env, capture_output=True, text=True, check=True)
    assert done.stdout == "real swift NNODES=2 NODE_RANK=1 args=sft --max_steps 5\n"
    # cluster.python: the venv's Python, whatever it is asked to run
    assert subprocess.run([str(python), "-m", "x"], capture_output=True, text=True).stdout == "python -m x\n"


def test_the_other_nodes_run_a_named_stand_in_that_waits_to_be_ended(tmp_path: Path) -> None:
    swift = bench.make_trainer_shims(tmp_path, 2, _fake_venv(tmp_path)).parent / "swift"
    env = {**os.environ, "NNODES": "16", "NODE_RANK": "2"}
    stand_in = subprocess.Popen([str(swift), "sft"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert stand_in.stdout is not None
        said = stand_in.stdout.readline()
        assert said.startswith("[bench] TRAINER STAND-IN on node 2: not ms-swift")
        # `sleep`, exec'ed in the shim's place right after its line: looked for until the exec has happened
        cmdline, deadline = b"", time.monotonic() + 30
        while not (cmdline := Path(f"/proc/{stand_in.pid}/cmdline").read_bytes()).startswith(b"swiftslurm-"):
            assert time.monotonic() < deadline, cmdline
            time.sleep(0.01)
        assert cmdline.split(b"\0")[:2] == [bench.STAND_IN_NAME.encode(), b"infinity"]
        assert stand_in.poll() is None  # it runs until its wrapper ends it
    finally:
        stand_in.kill()
        stand_in.wait()
