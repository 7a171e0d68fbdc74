"""ms-swift plugin for tests: `crash_once` kills the training process of global rank CRASH_RANK with SIGKILL at the
end of step CRASH_STEP, once per run (the first to get there creates RUN_DIR/CRASH_MARK; a resumed attempt
passes the same step again and trains on). A worker crash at a known step, on any machine.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

from swift.callbacks import TrainerCallback, callbacks_map

CRASH_STEP = 30
CRASH_RANK = 1
CRASH_MARK = "crashed.once"


class CrashCallback(TrainerCallback):
    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == CRASH_STEP and os.environ.get("RANK") == str(CRASH_RANK):
            try:
                fd = os.open(Path(os.environ["SWIFTSLURM_RUN_DIR"]) / CRASH_MARK, os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return control  # crashed once already: this is the resumed attempt
            os.close(fd)
            print(f"[crash] rank {CRASH_RANK}: SIGKILL at step {CRASH_STEP}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return control


callbacks_map["crash_once"] = CrashCallback
