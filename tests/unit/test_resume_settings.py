"""ms-swift settings that would break a resume are refused at plan time by the engine's adapter, naming why and
the fix; settings a user may mean (a resume that replays data, or reads a stream again) plan with a one-line
warning. Each rests on ms-swift 4.6 with transformers 5 (docs/resilience.md, 'What the adapters refuse')."""

from __future__ import annotations

from pathlib import Path

import pytest

from swiftslurm.engines.base import is_true
from swiftslurm.engines.registry import engine_for
from swiftslurm.errors import ConfigError
from swiftslurm.planning.make import PlanContext, make_plan, plan_warnings
from tests.conftest import FIXED_CACHE, FIXED_PYTHON, compose_config, plan_for
from tests.unit.test_megatron_engine import MEGATRON as MEGATRON_PLAN

MEGATRON = (*MEGATRON_PLAN, "swift.train_iters=100")


def warnings_for(*overrides: str) -> list[str]:
    cfg = compose_config(*overrides)
    ctx = PlanContext(cwd=Path("/home/user/project"), python=FIXED_PYTHON, env={"SWIFTSLURM_CACHE": FIXED_CACHE})
    return plan_warnings(cfg, make_plan(cfg, ctx))


@pytest.mark.parametrize(
    ("override", "why"),
    [
        ("swift.save_only_model=true", "optimizer, learning-rate schedule and random state"),
        ("swift.use_flash_ckpt=true", "still being written"),
        ("swift.resume_only_model=true", "load the weights only"),
        # Hydra keeps `yes` a string; ms-swift's parser reads it as true.
        ("swift.save_only_model=yes", "optimizer"),
    ],
)
def test_hf_settings_that_break_resume_are_refused_naming_why_and_the_fix(override: str, why: str) -> None:
    name = override.split("swift.")[1].split("=")[0]
    with pytest.raises(ConfigError, match=f"swift.{name}") as err:
        plan_for(override)
    assert why in str(err.value) and f"HINT: leave {name} out" in str(err.value)


def test_resume_only_model_points_at_the_settings_that_start_from_another_runs_weights() -> None:
    with pytest.raises(ConfigError) as err:
        plan_for("swift.resume_only_model=true")
    assert "model.id=/abs/path/checkpoint-N" in str(err.value) and "swift.adapters=" in str(err.value)


def test_ignore_data_skip_plans_with_a_warning_that_the_resume_replays_its_epochs_batches() -> None:
    plan = plan_for("swift.ignore_data_skip=true")
    assert "--ignore_data_skip" in plan.swift_argv
    (warning,) = warnings_for("swift.ignore_data_skip=true")
    assert warning.startswith("warning: swift.ignore_data_skip=true") and "trains again" in warning
    assert "HINT: leave ignore_data_skip out" in warning


def test_a_plan_without_such_settings_has_no_resume_warning() -> None:
    assert warnings_for() == []
    assert engine_for("megatron").resume_warnings(plan_for(*MEGATRON).swift_argv) == []


def test_a_stream_plans_with_a_warning_that_its_resume_reads_it_again_before_the_first_step() -> None:
    # model=tiny sets max_steps: a stream has no length, so the Trainer needs it.
    (warning,) = warnings_for("swift.streaming=true")
    assert warning.startswith("warning: swift.streaming=true") and "resilience.startup_timeout_s" in warning


def test_a_stream_that_skips_nothing_warns_of_the_replay_only() -> None:
    (warning,) = warnings_for("swift.streaming=true", "swift.ignore_data_skip=true")
    assert "swift.ignore_data_skip=true" in warning


@pytest.mark.parametrize("max_steps", ["-1", "0"])
def test_a_stream_without_max_steps_is_refused_before_the_queue(max_steps: str) -> None:
    with pytest.raises(ConfigError, match=r"swift.streaming=true needs swift.max_steps.*HINT: add swift.max_steps=N"):
        plan_for("swift.streaming=true", f"swift.max_steps={max_steps}")


@pytest.mark.parametrize("name", ["packing", "padding_free"])
def test_packing_without_flash_attention_is_refused_before_the_queue(name: str) -> None:
    with pytest.raises(ConfigError, match=f"swift.{name}=true needs flash attention.*swift.attn_impl=flash_attn"):
        plan_for(f"swift.{name}=true")


def test_packing_with_flash_attention_plans_without_a_warning() -> None:
    # A packed dataset is a list of packs, built the same on every attempt and sampled by index: the Trainer's
    # resume skips the packs before the checkpoint, as for any dataset on disk.
    plan = plan_for("swift.packing=true", "swift.attn_impl=flash_attn")
    assert "--packing" in plan.swift_argv
    assert warnings_for("swift.packing=true", "swift.attn_impl=flash_attn") == []


def test_a_megatron_stream_is_refused_as_its_resume_would_train_on_its_first_batches_again() -> None:
    with pytest.raises(ConfigError, match=r"swift.streaming=true: .*first batches.*HINT: leave streaming out"):
        plan_for(*MEGATRON, "swift.streaming=true")


def test_megatron_packing_plans_as_its_sampler_resumes_at_the_consumed_samples() -> None:
    assert "--packing" in plan_for(*MEGATRON, "swift.packing=true").swift_argv


@pytest.mark.parametrize("value", [True, "true", "True", "yes", "1", "t"])
def test_a_boolean_ms_swifts_parser_reads_as_true_is_true(value: object) -> None:
    assert is_true(value)


@pytest.mark.parametrize("value", [False, "false", "no", None, "0"])
def test_a_boolean_ms_swifts_parser_reads_as_false_is_not_true(value: object) -> None:
    assert not is_true(value)
