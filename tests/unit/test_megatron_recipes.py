"""The field guides' Megatron scenarios render commands Megatron-SWIFT 4.6 accepts, and their dry runs say how
swiftslurm drives the engine (resume form, progress source)."""

from __future__ import annotations

import re

import pytest

from swiftslurm.planning import swift_args
from swiftslurm.submit.report import dry_run_report
from tests.conftest import plan_for

RECIPES = ["h100x8-qwen3vl-megatron", "a100x16-qwen3moe-megatron-ep"]


def pairs(argv: tuple[str, ...]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for token in argv:
        if token.startswith("--"):
            found[token[2:]] = []
        else:
            found[list(found)[-1]].append(token)
    return found


def accepts(arg_type: str, values: list[str]) -> bool:
    """Whether ms-swift's argument parser would take ``values`` for a field of ``arg_type`` (the shipped table
    of ms-swift 4.6's dataclass fields: Literal choices, bool, int, float; anything else is a string)."""
    core = re.sub(r"^Optional\[(.*)\]$", r"\1", arg_type)
    if core.startswith("Literal["):
        choices = re.findall(r"'([^']*)'", core)
        return all(v in choices for v in values)
    checks = {"bool": lambda v: v in ("true", "false"), "int": str.isdigit, "float": _is_float}
    return all(checks.get(core, lambda v: True)(v) for v in values) and (core.startswith("List") or len(values) == 1)


def _is_float(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize("recipe", RECIPES)
def test_megatron_recipe_renders_arguments_megatron_sft_accepts(recipe: str) -> None:
    plan = plan_for(f"+recipe={recipe}")
    specs = swift_args.arg_specs("megatron sft", version="4.6.0")
    for name, values in pairs(plan.swift_argv).items():
        assert name in specs, f"--{name} is not an argument of `megatron sft` 4.6"
        assert accepts(specs[name].type, values), f"--{name} {values} does not fit {specs[name].type}"


@pytest.mark.parametrize("recipe", RECIPES)
def test_megatron_dry_run_shows_the_adapters_choices(recipe: str) -> None:
    report = dry_run_report(plan_for(f"+recipe={recipe}"))
    assert "--mcore_model CKPT --finetune false" in report  # how a resume is expressed
    assert "logs/ATTEMPT/progress.json: global rank 0's heartbeat" in report  # where progress is read
    assert "swiftslurm_megatron_commit" in report


def test_the_accepts_check_can_fail() -> None:
    assert not accepts("Literal['adam', 'sgd']", ["adamw"])
    assert not accepts("int", ["1e-5"]) and not accepts("Optional[bool]", ["yes"])
    assert accepts("Optional[float]", ["1e-05"]) and accepts("List[str]", ["a", "b"])
