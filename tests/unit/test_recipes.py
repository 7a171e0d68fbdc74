"""Every shipped recipe (conf/recipe/) is right as shipped: planned as `+recipe=NAME` alone, it gets no warning
about itself (planning/make.py plan_warnings: the save budget, a narrow memory fit, what the engine's resume does
with its arguments). A new recipe is planned here the day it is added."""

from __future__ import annotations

import pytest

from swiftslurm.planning.make import plan_warnings
from tests.conftest import CONF_DIR, compose_config, plan_for

RECIPES = sorted(p.stem for p in (CONF_DIR / "recipe").glob("*.yaml"))


def test_the_recipes_are_found() -> None:
    assert "a100x16-qwen3moe-megatron-ep" in RECIPES


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_shipped_recipe_plans_without_a_warning(recipe: str) -> None:
    override = f"+recipe={recipe}"
    assert plan_warnings(compose_config(override), plan_for(override)) == []
