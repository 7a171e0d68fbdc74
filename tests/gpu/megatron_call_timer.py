"""Bench-only Megatron-SWIFT plugin (`--external_plugins`): times every callback of every trainer event, and, when
asked, switches swiftslurm's parts off and on in blocks of iterations inside one training run.

Timing: tests/gpu/gpu_megatron.py's overhead bench gives it to every arm alike, so the breakdown covers ms-swift's
own callbacks (`print`, `default_flow`) and swiftslurm's two, per event and per callback class. Each call is
timed with two `perf_counter` reads (well under a microsecond), against Megatron iterations of about 300 ms. At
train end (and at exit) the totals go to the file named in SWIFTSLURM_BENCH_CALL_TIMES:
`{"EVENT:CallbackClass": [calls, seconds], ...}`, with each iteration's end on the wall clock under "ends" (two
arms run side by side are compared over the seconds both were training).

Blocks (SWIFTSLURM_BENCH_TOGGLE_BLOCK=B, under the node wrapper): from iteration WARM on, iterations run in
blocks of B, cycling through four phases: 0 everything on; 1 the wrapper process stopped (SIGSTOP; its keeper
only waits for the tree); 2 swiftslurm's callbacks skipped at step begin and end; 3 both. Runs of different
processes on a shared host differ by several percent; phases of one run, interleaved, share its placement and
drift, so their medians compare what each part costs. The phase of each iteration goes into the same file,
under "phases". The wrapper is always left running (SIGCONT) at train end and at exit.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from swift.megatron.trainers.base import BaseMegatronTrainer

SWIFTSLURM_CALLBACKS = ("MegatronStopCallback", "MegatronCommitCallback")
WARM = 8  # the iterations before the first block: warm-up, all on
BLOCK = int(os.environ.get("SWIFTSLURM_BENCH_TOGGLE_BLOCK", "0"))

_totals: dict[str, list[float]] = {}
_phases: dict[int, int] = {}
_ends: dict[int, float] = {}  # iteration -> when its on_step_end began (wall clock: arms run side by side compare)
_wrapper: int | None = None
_wrapper_stopped = False


def phase_of(iteration: int, block: int = BLOCK) -> int:
    if not block or iteration <= WARM:
        return 0
    return ((iteration - WARM - 1) // block) % 4


def _wrapper_pid() -> int | None:
    """The node wrapper: the parent of the trainer's keeper, up this process's line of parents."""
    pid = os.getpid()
    while pid > 1:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if b"swiftslurm.node.keeper" in cmdline:
            return parent
        pid = parent
    return None


def _set_wrapper(stopped: bool) -> None:
    global _wrapper_stopped
    if _wrapper is not None and stopped != _wrapper_stopped:
        os.kill(_wrapper, signal.SIGSTOP if stopped else signal.SIGCONT)
        _wrapper_stopped = stopped


def _timed_call_event(self: Any, event: str, **kwargs: Any) -> None:
    skip_ours = False
    if BLOCK and event in ("on_step_begin", "on_step_end"):
        running = self.state.iteration + (1 if event == "on_step_begin" else 0)
        phase = phase_of(running)
        if event == "on_step_begin":
            _phases[running] = phase
            _set_wrapper(phase in (1, 3))
        skip_ours = phase in (2, 3)
    if event == "on_step_end":
        _ends[int(self.state.iteration)] = time.time()
    for callback in self.callbacks:
        name = type(callback).__name__
        if skip_ours and name in SWIFTSLURM_CALLBACKS:
            continue
        began = time.perf_counter()
        getattr(callback, event)(**kwargs)
        entry = _totals.setdefault(f"{event}:{name}", [0, 0.0])
        entry[0] += 1
        entry[1] += time.perf_counter() - began
    if event == "on_train_end":  # also here: a trainer ended by its wrapper may not reach atexit
        _write()


def _write() -> None:
    _set_wrapper(False)
    if path := os.environ.get("SWIFTSLURM_BENCH_CALL_TIMES"):
        with open(path, "w") as f:
            json.dump({**_totals, "phases": _phases, "ends": _ends, "wrapper": _wrapper}, f, indent=1)


if BLOCK:
    _wrapper = _wrapper_pid()
BaseMegatronTrainer.call_event = _timed_call_event
atexit.register(_write)
