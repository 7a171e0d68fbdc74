"""ms-swift plugin for the soak: `slow_save` holds every rank SLOW_SAVE_S seconds after each save's files are
written and before swiftslurm's commit (user callbacks run before swiftslurm_commit's), as a shared
filesystem under load makes a large checkpoint's save take tens of seconds. A kill or a stop signal in that
window finds a checkpoint folder without its manifest, for long enough to land there on any machine."""

from __future__ import annotations

import time
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

SLOW_SAVE_S = 15.0


class SlowSaveCallback(TrainerCallback):
    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_SAVE_S)
        return control


callbacks_map["slow_save"] = SlowSaveCallback
