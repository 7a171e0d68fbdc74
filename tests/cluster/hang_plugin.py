"""ms-swift plugin for tests: `hang` blocks rank 1 for good before step HANG_STEP, in the run's first attempt only.

Rank 0 goes on into that step and waits for rank 1 inside the step's collectives (DDP's gradient all-reduce,
Gloo here): a real hang in a real collective, on any machine, however fast. Rank 1 creates RUN_DIR/MARKER as it
blocks, so the attempt after it trains normally.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

HANG_STEP = 27  # the step rank 1 never starts (the checkpoint of step 20 is committed by then)
MARKER = "hang.once"


def rank_1_never_reaches_the_all_reduce() -> None:
    threading.Event().wait()


class HangCallback(TrainerCallback):
    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        marker = Path(os.environ["SWIFTSLURM_RUN_DIR"]) / MARKER
        if os.environ.get("RANK") == "1" and state.global_step == HANG_STEP - 1 and not marker.exists():
            marker.write_text(f"rank 1 blocked before step {HANG_STEP}\n")
            print(f"[hang] rank 1 blocks before step {HANG_STEP}", flush=True)
            rank_1_never_reaches_the_all_reduce()
        return control


callbacks_map["hang"] = HangCallback
