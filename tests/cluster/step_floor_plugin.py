"""ms-swift plugin for tests: `step_floor` makes every training step take at least STEP_FLOOR_S seconds.

A test about a run longer than its time limit must be longer than its limit on any machine: the tiny model
trains 2500 steps inside 3 minutes on an idle fast machine (issue 14, item 11). With a floor per step, the
training time has a lower bound that does not depend on the machine's speed.
"""

from __future__ import annotations

import time
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

STEP_FLOOR_S = 0.25


class StepFloorCallback(TrainerCallback):
    floor_s = STEP_FLOOR_S

    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self._started = time.monotonic()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._started = time.monotonic()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        time.sleep(max(0.0, self.floor_s - (time.monotonic() - self._started)))
        return control


callbacks_map["step_floor"] = StepFloorCallback
