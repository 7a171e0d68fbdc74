"""The engine adapters by launcher (`task.launcher`): the one place that maps a plan to its adapter."""

from __future__ import annotations

from swiftslurm.engines.base import Engine
from swiftslurm.engines.hf import HfTrainerEngine
from swiftslurm.engines.megatron import MegatronEngine

ENGINES: dict[str, Engine] = {e.launcher: e for e in (HfTrainerEngine(), MegatronEngine())}


def engine_for(launcher: str) -> Engine:
    try:
        return ENGINES[launcher]
    except KeyError:
        raise ValueError(f"no engine adapter for launcher {launcher!r}; known: {', '.join(ENGINES)}") from None
