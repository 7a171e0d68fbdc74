"""ms-swift plugin for `bench/goodput_faults.py`: `goodput_step_floor` makes every training step last at least
STEP_FLOOR_S, so the compressed run's step time is the bench's choice, not this machine's speed (a real step
of 5 s compressed 10 times). As tests/cluster/step_floor_plugin.py, with the bench's own floor.
"""

from __future__ import annotations

import time
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

STEP_FLOOR_S = 0.5


class GoodputStepFloor(TrainerCallback):
    def __init__(self, args: Any, trainer: Any) -> None:
        super().__init__(args, trainer)
        self._started = time.monotonic()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._started = time.monotonic()
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        time.sleep(max(0.0, STEP_FLOOR_S - (time.monotonic() - self._started)))
        return control


callbacks_map["goodput_step_floor"] = GoodputStepFloor
