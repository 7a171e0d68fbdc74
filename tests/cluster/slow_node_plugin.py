"""ms-swift plugin for tests: `slow_node` makes one node's training forwards SLOW_FACTOR slower from a given step,
as a slow GPU would: a forward hook on that node's ranks sleeps SLOW_FACTOR times the forward's own duration.

With SWIFTSLURM_TEST_FORWARD_S, every node's training forwards last at least that long (a sleep: the CPU is free,
as while a GPU computes), the slow node's SLOW_FACTOR on top. The tiny model's own forward takes ~10 ms on the
shared cores, where one time slice lost to another process doubles it; a forward of a size a GPU run has (0.1 s
and more) keeps that noise to a few per cent, so what a long run measures is the detector, not the scheduler.

Configured by the environment (the wrapper passes the job's environment to every rank):
    SWIFTSLURM_TEST_SLOW_NODE   the node (NODE_RANK) whose ranks slow down
    SWIFTSLURM_TEST_SLOW_HOST   or: the host (SLURMD_NODENAME) whose ranks slow down, whichever node rank it has: a
                                spare that takes its rank after a swap (straggler_action=swap) is at full speed
    SWIFTSLURM_TEST_SLOW_FROM   the first step they are slow in
    SWIFTSLURM_TEST_SLOW_FACTOR how much slower (0.5: each forward takes 1.5 times as long); default 0.5
    SWIFTSLURM_TEST_FORWARD_S   every node's training forward lasts at least this many seconds; default 0 (none)
The hook is registered first in line (``prepend``), so its sleep is inside swiftslurm's own timing of the forward.
"""

from __future__ import annotations

import os
import time
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

NODE_ENV, FROM_ENV, FACTOR_ENV = "SWIFTSLURM_TEST_SLOW_NODE", "SWIFTSLURM_TEST_SLOW_FROM", "SWIFTSLURM_TEST_SLOW_FACTOR"
HOST_ENV = "SWIFTSLURM_TEST_SLOW_HOST"
FORWARD_ENV = "SWIFTSLURM_TEST_FORWARD_S"


class SlowNodeCallback(TrainerCallback):
    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self.step = 0
        self.started = 0.0
        self.factor = float(os.environ.get(FACTOR_ENV, "0.5"))
        self.from_step = int(os.environ.get(FROM_ENV, "0"))
        self.here = slow_here(os.environ)
        self.floor_s = float(os.environ.get(FORWARD_ENV, "0"))

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.here or self.floor_s > 0:
            model = kwargs["model"]
            model.register_forward_pre_hook(self.begin)
            model.register_forward_hook(self.slow_down, prepend=True)
        return control

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.step = state.global_step + 1  # the step now beginning
        return control

    def begin(self, module: Any, args: Any) -> None:
        self.started = time.perf_counter()

    def slow_down(self, module: Any, args: Any, output: Any) -> None:
        if not module.training:
            return
        took = time.perf_counter() - self.started
        lasts = max(took, self.floor_s)
        if self.here and self.step >= self.from_step:
            lasts *= 1 + self.factor
        time.sleep(lasts - took)


callbacks_map["slow_node"] = SlowNodeCallback


def slow_here(env: Any) -> bool:
    """Whether this node's ranks are the slow ones: by host when SWIFTSLURM_TEST_SLOW_HOST is set, else by node rank."""
    if host := env.get(HOST_ENV):
        return bool(host == env.get("SLURMD_NODENAME"))
    return bool(env.get(NODE_ENV) == env.get("NODE_RANK", "0"))
