"""Observers of the wrapper's phases: code plugged into the on-node wrapper without changing it, as ms-swift's
`--external_plugins` plugs code into the trainer.

SWIFTSLURM_PHASE_OBSERVERS names Python files, separated by `os.pathsep` (`:`). The wrapper imports each once
per process, when its first attempt starts, and calls the file's `on_phase(event)` each time an attempt enters a
phase (attempt.py's Phase), before the phase runs; ``event`` is a PhaseEntered. An observer runs in the wrapper's
main thread, so what it does delays the attempt (it may hold there: tests/cluster/hold_plugin.py holds until
a stop signal comes), and an exception it raises ends the wrapper like one of the wrapper's own. Unset (the
default), nothing is imported.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from swiftslurm.errors import NodeError
from swiftslurm.slurm_env import SlurmEnv

OBSERVERS_ENV = "SWIFTSLURM_PHASE_OBSERVERS"


@dataclass(frozen=True)
class PhaseEntered:
    """An attempt is entering a phase on this node."""

    phase: str  # the Phase's value: prepare, agree_on_resume, train, ...
    attempt: str  # the attempt's id (attempt.attempt_id)
    where: SlurmEnv  # this node: node_id 0 is the leader; restart_count > 0 after a requeue
    stopped: Callable[[], bool]  # whether a stop signal came that the attempt has not acted on yet


Observer = Callable[[PhaseEntered], None]


def load(environ: Mapping[str, str] = os.environ) -> list[Observer]:
    """The `on_phase` of every file OBSERVERS_ENV names, in its order (none when it is unset)."""
    return [_on_phase(Path(path)) for path in environ.get(OBSERVERS_ENV, "").split(os.pathsep) if path]


def notify(observers: list[Observer], event: PhaseEntered) -> None:
    for observer in observers:
        observer(event)


@functools.cache  # imported once per process: a module's own state lasts across the attempts it sees
def _on_phase(path: Path) -> Observer:
    fix = f"HINT: {OBSERVERS_ENV} takes absolute paths of Python files, separated by `{os.pathsep}`; or unset it."
    # A name of its own per path, registered as imported modules are (a dataclass in the file needs that).
    name = "swiftslurm_phase_observer_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(name, path)
    if not path.is_file() or spec is None or spec.loader is None:
        raise NodeError(f"{OBSERVERS_ENV} names {path}, which is not a Python file. {fix}")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    on_phase = getattr(module, "on_phase", None)
    if not callable(on_phase):
        raise NodeError(f"{path} ({OBSERVERS_ENV}) defines no function `on_phase(event)`. {fix}")
    return on_phase
