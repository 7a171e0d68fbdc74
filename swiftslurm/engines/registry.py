"""The engine adapters: the one place that maps a plan to its adapter.

The configuration names the engine once, in `strategy.engine`; the adapter that runs it owns the program
(`Engine.launcher`), which the plan records as `plan.launcher` for the node side.
"""

from __future__ import annotations

from swiftslurm.engines.base import Engine
from swiftslurm.engines.hf import HfTrainerEngine
from swiftslurm.engines.megatron import MegatronEngine
from swiftslurm.errors import ConfigError, did_you_mean, one_of

ENGINES: dict[str, Engine] = {e.launcher: e for e in (HfTrainerEngine(), MegatronEngine())}
BY_STRATEGY_ENGINE: dict[str, Engine] = {name: e for e in ENGINES.values() for name in e.strategy_engines}
STRATEGY_ENGINES = tuple(BY_STRATEGY_ENGINE)  # every `strategy.engine` value an adapter runs


def engine_for(launcher: str) -> Engine:
    """The adapter of a plan (``plan.launcher``)."""
    try:
        return ENGINES[launcher]
    except KeyError:
        raise ValueError(f"no engine adapter for launcher {launcher!r}; known: {', '.join(ENGINES)}") from None


def engine_for_strategy(strategy_engine: str) -> Engine:
    """The adapter that runs ``strategy_engine`` (`strategy.engine`)."""
    try:
        return BY_STRATEGY_ENGINE[strategy_engine]
    except KeyError:
        raise ConfigError(
            f"strategy.engine={strategy_engine!r} is not known.{did_you_mean(strategy_engine, STRATEGY_ENGINES)} "
            f"{one_of(STRATEGY_ENGINES)}"
        ) from None
