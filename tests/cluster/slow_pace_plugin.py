"""ms-swift plugin for tests: `slow_pace` makes every training step take at least STEP_S seconds and every save
at least SAVE_S more: a 72B run's pace (steps of minutes, saves of tens of minutes) scaled down, on any machine.

Its on_save runs before swiftslurm_commit's (user callbacks come first in `--callbacks`), so the wait is inside
the save as the heartbeat sees it; its on_step_end before swiftslurm_commit's step beat, so inside the step.
"""

from __future__ import annotations

import time
from typing import Any

from step_floor_plugin import StepFloorCallback  # ms-swift puts a plugin's folder on sys.path
from swift.callbacks import callbacks_map

STEP_S = 5.0
SAVE_S = 30.0


class SlowPaceCallback(StepFloorCallback):
    floor_s = STEP_S

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        time.sleep(SAVE_S)
        return control


callbacks_map["slow_pace"] = SlowPaceCallback
