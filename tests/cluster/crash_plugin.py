"""ms-swift plugin for tests: `crash` kills rank 1 with SIGKILL after CRASH_AFTER_STEPS steps of every
attempt, before its first save (the test's save_steps is larger), so no attempt ever commits progress.

A test of "no progress across restarts" must fail the same way on every machine: the crash comes at a
step count, never after a time.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

CRASH_AFTER_STEPS = 3
CRASHING_RANK = "1"


class CrashCallback(TrainerCallback):
    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self._steps = 0

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._steps += 1
        if self._steps >= CRASH_AFTER_STEPS and os.environ.get("RANK") == CRASHING_RANK:
            os.kill(os.getpid(), signal.SIGKILL)  # as `kill -9` from outside: no Python cleanup, no exit code
        return control


callbacks_map["crash"] = CrashCallback
