"""A phase observer of the wrapper (swiftslurm/node/observers.py) for tests/cluster/test_signals.py: the
leader of a job's first attempt holds on entering the phase HOLD_PHASE names until a stop signal is recorded,
so that the test sends its signal at exactly that moment, whatever the machine's speed. Once holding, it
creates the file HOLD_MARKER names: the test waits for that file. Every node of the first attempt also creates
`HOLD_MARKER.nodeN` on entering its first phase, when its wrapper owns the stop signals already (node/__main__.py,
supervise.submitit_entry): the test waits for all of them too, so that no node is still starting when the
signal comes.

The wrapper imports this file by its path (SWIFTSLURM_PHASE_OBSERVERS): it imports nothing of tests/.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from swiftslurm.node.observers import PhaseEntered

PLUGIN = Path(__file__)
HOLD_PHASE = "SWIFTSLURM_TEST_HOLD_PHASE"  # a Phase value of attempt.py: prepare | agree_on_resume
HOLD_MARKER = "SWIFTSLURM_TEST_HOLD_MARKER"  # a path outside the run dir, created once the leader holds
HOLD_MAX_S = 300.0  # a test that never sends its signal fails rather than holding the job for ever
POLL_S = 0.1
_held: set[str] = set()  # once per process, too: an attempt retried in this process (no SLURM) goes on


def node_marker(marker: Path, node: int) -> Path:
    """The file node ``node`` creates once its wrapper has entered a phase of the first attempt."""
    return marker.with_name(f"{marker.name}.node{node}")


def on_phase(event: PhaseEntered, environ: Mapping[str, str] = os.environ) -> None:
    """Hold here while HOLD_PHASE asks for ``event.phase`` (leader, first attempt) and no stop signal came."""
    where = event.where
    if where.restart_count == 0 and HOLD_MARKER in environ:
        node_marker(Path(environ[HOLD_MARKER]), where.node_id).touch()
    if environ.get(HOLD_PHASE) != event.phase or where.node_id != 0 or where.restart_count != 0:
        return
    if event.phase in _held:
        return
    _held.add(event.phase)
    Path(environ[HOLD_MARKER]).write_text(f"{event.phase} {os.getpid()}\n")
    deadline = time.monotonic() + HOLD_MAX_S
    while not event.stopped() and time.monotonic() < deadline:
        time.sleep(POLL_S)
