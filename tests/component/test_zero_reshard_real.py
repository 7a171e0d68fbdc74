"""The real converter on a real ZeRO-2 checkpoint: written by 2 ranks, converted by zero_reshard.convert (DeepSpeed's
ds_to_universal in a subprocess), loaded by 1 rank with checkpoint.load_universal. The next steps' losses match
the 2-rank run's, so the weights and the optimizer state came back whole. CPU and gloo; about a minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

from swiftslurm.engines import zero_reshard as zr

pytestmark = [
    pytest.mark.slow,  # real DeepSpeed training in 3 processes: about 45 s of CPU
    pytest.mark.skipif(find_spec("deepspeed") is None, reason="needs DeepSpeed (the training venv)"),
]
SCRIPT = Path(__file__).with_name("zero_train.py")


def torchrun(ranks: int, mode: str, out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    done = subprocess.run([*argv, str(SCRIPT), mode, str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_two_rank_zero2_checkpoint_resumes_on_one_rank_with_the_same_losses(tmp_path: Path) -> None:
    torchrun(2, "save", tmp_path)
    checkpoint = tmp_path / "checkpoint-3"
    assert (zr.zero_tag(checkpoint), zr.zero_shards(checkpoint)) == ("global_step3", 2)
    assert zr.needs_universal(zr.zero_shards(checkpoint), 1)
    folder = zr.convert(checkpoint, json.dumps({"zero_optimization": {"stage": 2}}), sys.executable)
    assert (folder / "latest_universal").read_text() == "global_step3_universal"
    torchrun(1, "load", tmp_path)
    two, one = (json.loads((tmp_path / f"losses-{n}.json").read_text()) for n in (2, 1))
    assert one == pytest.approx(two, rel=1e-5), (one, two)
