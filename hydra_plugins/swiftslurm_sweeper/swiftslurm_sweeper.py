"""The sweeper behind `python -m swiftslurm -m ...`, found by Hydra's plugin discovery (the `hydra_plugins`
namespace package, as in Hydra's examples/plugins/example_sweeper_plugin) and chosen in conf/config.yaml.

It parses the sweep and hands it to swiftslurm.sweep.sweeper, which expands it like Hydra's BasicSweeper (`a,b`,
`range()`, `glob()`: the same cartesian product, in the same order), composes each point once, plans all of
them before writing anything, and submits them. Hydra's BasicSweeper would compose each point to validate
it and its launcher would compose it again; no launcher is used here.
Kept light: Hydra imports this module at every start-up, so swiftslurm is imported only when a sweep runs.
"""

# No `from __future__ import annotations`: Hydra executes this module without registering it in sys.modules, and
# a dataclass with string annotations looks its module up there.
from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class SwiftSlurmSweeperConf:
    _target_: str = "hydra_plugins.swiftslurm_sweeper.swiftslurm_sweeper.SwiftSlurmSweeper"


ConfigStore.instance().store(
    group="hydra/sweeper", name="swiftslurm", node=SwiftSlurmSweeperConf, provider="swiftslurm"
)


class SwiftSlurmSweeper(Sweeper):
    def __init__(self) -> None:
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context = hydra_context
        self.config = config

    def sweep(self, arguments: list[str]) -> Any:
        from swiftslurm.sweep.sweeper import run_sweep

        assert self.hydra_context is not None and self.config is not None  # Hydra calls setup first
        overrides = OverridesParser.create(config_loader=self.hydra_context.config_loader).parse_overrides(arguments)
        run_sweep(self.hydra_context, self.config, overrides)
        return None
