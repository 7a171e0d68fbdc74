"""Shared fixtures: composing real conf/ configurations and planning them without side effects."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir

from swiftslurm.__main__ import to_config
from swiftslurm.plan import JobPlan
from swiftslurm.planning.config import Config, open_dict_overrides, register_configs
from swiftslurm.planning.make import PlanContext, make_plan

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
FIXED_PYTHON = "/opt/venv/bin/python"
FIXED_CACHE = "/shared/cache/swiftslurm"


def compose_config(*overrides: str) -> Config:
    """The Config that `python -m swiftslurm OVERRIDES` would see."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return to_config(compose("config", overrides=open_dict_overrides(list(overrides))))


def plan_for(*overrides: str, cwd: Path = Path("/home/user/project")) -> JobPlan:
    """Plan with fixed outside facts (cwd, python, cache) so renderings are reproducible."""
    ctx = PlanContext(cwd=cwd, python=FIXED_PYTHON, env={"SWIFTSLURM_CACHE": FIXED_CACHE})
    return make_plan(compose_config(*overrides), ctx)
