"""ms-swift ZeRO-2 full fine-tuning on CPU, 2 ranks -> 1: the HF adapter converts the committed checkpoint's
ZeRO state into its universal form beside it and resumes from that with the same global batch; the losses
after the resume are the uninterrupted 2-rank run's (seen identical to 8 digits by hand, ms-swift 4.6,
transformers 5.19, DeepSpeed 0.18.9). No SLURM: this guards what the shrink path relies on from ms-swift,
HF Trainer and DeepSpeed; the shrink itself is tests/cluster/test_shrink.py. About 5 minutes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from swiftslurm.ckpt import checkpoint as ck
from swiftslurm.engines.hf import HfTrainerEngine
from swiftslurm.tiny import build_tiny_assets
from tests.conftest import REPO

pytestmark = pytest.mark.slow
ENGINE = HfTrainerEngine()


def sft(ranks: int, accumulation: int, output: Path, *extra: str) -> None:
    tiny = build_tiny_assets()
    argv = [
        str(Path(sys.executable).with_name("swift")), "sft",
        "--model", str(tiny.model_dir), "--dataset", str(tiny.dataset_path), "--tuner_type", "full",
        "--deepspeed", "zero2", "--per_device_train_batch_size", "1",
        "--gradient_accumulation_steps", str(accumulation), "--seed", "42", "--data_seed", "42",
        "--use_cpu", "true", "--fp16", "false", "--bf16", "false",
        "--external_plugins", str(REPO / "swiftslurm" / "data" / "deepspeed_cpu_patch.py"),
        "--model_type", "qwen3", "--template", "qwen3", "--torch_dtype", "float32", "--check_model", "false",
        "--report_to", "none", "--max_length", "256", "--max_steps", "10", "--save_steps", "6",
        "--logging_steps", "1", "--learning_rate", "0.001", "--dataloader_num_workers", "0",
        "--output_dir", str(output), "--add_version", "false", *extra,
    ]  # fmt: skip
    env = {**os.environ, "NPROC_PER_NODE": str(ranks), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def losses(output: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (output / "logging.jsonl").read_text().splitlines()]
    return {int(r["global_step/max_steps"].split("/")[0]): r["loss"] for r in rows if "loss" in r}


def test_a_two_rank_zero2_run_resumes_on_one_rank_with_the_same_losses(tmp_path: Path) -> None:
    sft(2, 1, tmp_path / "two")  # uninterrupted; its checkpoint-6 is the one resumed
    output = tmp_path / "one"
    output.mkdir()
    checkpoint = output / "checkpoint-6"
    shutil.copytree(tmp_path / "two" / "checkpoint-6", checkpoint)
    ck.commit(checkpoint, world_size=2, swift_version="4.6.0")
    argv = ("--deepspeed", "zero2", "--tuner_type", "full")

    ENGINE.prepare_reshard(checkpoint, argv, data_parallel=1, python=sys.executable)
    extra = ENGINE.resume_args_at(checkpoint, argv, data_parallel=1)
    assert extra[1] == str(output / "checkpoint-6-universal")
    sft(1, 2, output, *extra)  # the same global batch: 1 rank x 2 micro-batches

    assert ck.problems(checkpoint, deep=True) == []  # the committed checkpoint is unchanged
    two, one = losses(tmp_path / "two"), losses(output)
    assert sorted(one) == [7, 8, 9, 10]  # resumed after step 6
    assert [one[s] for s in one] == pytest.approx([two[s] for s in one], rel=1e-4)
