"""The plan warns when SLURM's stop signal comes too late for the model's checkpoint to be saved and committed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from swiftslurm.engines.base import Engine
from swiftslurm.engines.hf import HfTrainerEngine
from swiftslurm.engines.megatron import MegatronEngine
from swiftslurm.planning.make import PlanContext, make_plan, save_budget_warning, save_seconds
from tests.conftest import FIXED_CACHE, FIXED_PYTHON, compose_config

# ZeRO-3 offload: a full fine-tune of 72B with plain ZeRO-3 does not fit 16 × 80 GB (the memory planner refuses it).
FULL_72B = (
    "+cluster=a100x16",
    "model=qwen2.5-72b-instruct",
    "dataset=[AI-ModelScope/alpaca-gpt4-data-en]",
    "strategy=zero3_offload",
    "strategy.tuner_type=full",
)


def warning_for(*overrides: str) -> str | None:
    cfg = compose_config(*overrides)
    ctx = PlanContext(cwd=Path("/home/user/project"), python=FIXED_PYTHON, env={"SWIFTSLURM_CACHE": FIXED_CACHE})
    return save_budget_warning(cfg, make_plan(cfg, ctx))


def test_a_full_fine_tune_of_72b_cannot_commit_in_the_default_lead_and_the_hint_fixes_it() -> None:
    warning = warning_for(*FULL_72B)
    assert warning is not None and "cluster.signal_lead_s=120" in warning
    raised = re.search(r"HINT: set (cluster\.signal_lead_s=\d+)", warning)
    assert raised, warning
    assert warning_for(*FULL_72B, raised.group(1)) is None  # following the hint silences it


def test_lora_of_the_same_model_has_time() -> None:
    assert (
        warning_for(
            "+cluster=a100x16",
            "model=qwen2.5-72b-instruct",
            "dataset=[AI-ModelScope/alpaca-gpt4-data-en]",
            "strategy=zero3",
        )
        is None
    )


def test_local_runs_get_no_signal_so_no_warning() -> None:
    assert (
        warning_for(
            "model=qwen2.5-72b-instruct", "dataset=[AI-ModelScope/alpaca-gpt4-data-en]", "strategy.tuner_type=full"
        )
        is None
    )


def test_a_time_limit_too_short_for_any_lead_says_so() -> None:
    warning = warning_for(*FULL_72B, "cluster.time=00:30:00")
    assert warning is not None and "cluster.time=00:30:00 is too short" in warning


def test_more_nodes_share_the_save() -> None:
    assert (
        save_seconds(72.7, "full", nodes=4, rank_zero_share=0.0)
        == save_seconds(72.7, "full", nodes=2, rank_zero_share=0.0) / 2
    )


def test_the_weights_rank_0_writes_alone_are_not_shared_by_more_nodes() -> None:
    """ZeRO-3 gathers the 16-bit weights (145 GB of 72.7B parameters) to global rank 0, which writes them alone: on
    64 nodes each node's share of the rest is small, but node 0 still writes all of those."""
    warning = warning_for(*FULL_72B, "cluster.nodes=64")
    assert warning is not None and "~145 GB of it by rank 0 alone" in warning, warning
    raised = re.search(r"HINT: set (cluster\.signal_lead_s=\d+)", warning)
    assert raised and warning_for(*FULL_72B, "cluster.nodes=64", raised.group(1)) is None, warning


@pytest.mark.parametrize(
    ("engine", "argv", "share"),
    [
        (HfTrainerEngine(), ("--deepspeed", "zero3"), 2 / 14),  # the gathered 16-bit weights
        (HfTrainerEngine(), ("--deepspeed", "zero2"), 2 / 14),  # the model, whole on every rank
        (HfTrainerEngine(), ("--deepspeed", "zero0"), 1.0),  # nothing sharded
        (HfTrainerEngine(), (), 1.0),  # DDP: model and optimizer state
        (HfTrainerEngine(), ("--fsdp", "fsdp2"), 0.0),  # a sharded state dict
        (MegatronEngine(), ("--tuner_type", "full"), 0.0),  # a distributed checkpoint
    ],
)
def test_what_rank_0_writes_alone_follows_the_strategy(engine: Engine, argv: tuple[str, ...], share: float) -> None:
    assert engine.rank_zero_share(argv) == share
