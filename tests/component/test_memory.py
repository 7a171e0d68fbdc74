"""The memory planner (swiftslurm/planning/memory.py, memory_plan.py): hand-computed cases, DeepSpeed's own estimate of
the model states, the refusal of a plan that cannot fit, the narrow-fit warning and `swiftslurm advise`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from swiftslurm.planning import memory
from swiftslurm.planning.memory import Setup
from tests.unit.test_memory import QWEN3_1_6B


@pytest.mark.parametrize("gpus", [1, 8, 64])
def test_zero_model_states_agree_with_deepspeeds_estimate(gpus: int) -> None:
    """DeepSpeed's estimators count model states only; ours add what was measured beyond them (fp32 gradient
    partitions, step buffers): never less than DeepSpeed's, at most 25% more."""
    stage12 = pytest.importorskip("deepspeed.runtime.zero.stage_1_and_2")
    stage3 = pytest.importorskip("deepspeed.runtime.zero.stage3")
    p, largest = QWEN3_1_6B.params(), QWEN3_1_6B.layer_params()
    for preset, theirs in (
        ("zero2", stage12.estimate_zero2_model_states_mem_needs(p, gpus, 1, cpu_offload=False)[1]),
        ("zero3", stage3.estimate_zero3_model_states_mem_needs(p, largest, gpus, 1, cpu_offload=False)[1]),
    ):
        ours = sum(memory.model_states(QWEN3_1_6B, Setup("deepspeed", preset, full=True, data_parallel=gpus))[:3])
        assert theirs <= ours <= 1.25 * theirs, (preset, ours / theirs)


def test_advise_lists_every_strategy_best_first(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "swiftslurm",
            "advise",
            "+cluster=a100x8",
            "model=qwen2.5-72b-instruct",
            "strategy=zero2",
            "strategy.tuner_type=full",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    head, *rows = done.stdout.strip().splitlines()
    assert "72.7B parameters" in head and len(rows) >= 8
    assert rows[0].split()[0] == "fits" and "strategy=zero3_offload" in rows[0]
    sizes = [float(r.split()[1]) for r in rows if r.split()[0] == "no"]
    assert sizes == sorted(sizes)
    assert not (tmp_path / "runs").exists()  # advise plans and writes nothing
